"""The ``README.md`` model card pushed with a checkpoint: Hub metadata (YAML) and a readable body.

What is read from a training run folder (the layout ``vit_core.training.engine`` writes):

- ``metrics.jsonl``: one JSON object per line (per epoch). The reported accuracy is the value of the first
  of ``ema_test_top1, top1, test_top1, test_acc, val_top1, val_acc, acc, accuracy`` found in the *last*
  line that has one (``ema_test_top1`` first: with EMA the exported weights are the EMA's). The results table
  says it in words with the epochs, the training time and the final loss (``card_text.results_section``), not
  every field of the line. Values are reported as recorded (percentages stay percentages, fractions stay
  fractions).
- ``recipe.json`` / ``recipe.yaml`` / ``recipe.yml``: shown in the card minus any key that looks like a
  credential (token, secret, password, api key), its folders by name, never by this machine's path. Its
  ``data`` (or ``dataset``) names the dataset when none is given: ``mnist``, ``fashion-mnist``, ``cifar10`` map
  to their Hub datasets, ``hf:owner/name`` is that Hub dataset, anything else (a folder) is named but not linked.
  A recipe with ``task`` other than ``classify`` (masked patch prediction pre-training) reports no
  classification accuracy.
- ``eval_*.json`` (``python -m train eval``): top-1 accuracy and expected calibration error per evaluation,
  with the ``calibration`` section of ``config.json`` (temperature, OOD score and threshold), in a calibration
  section; a checkpoint without one says that its calibration is unknown.
- top-level ``*.png`` files (training curves, confusion matrices; reliability diagrams in the calibration
  section): embedded in the card.

``prepare_upload`` says what ``vit_core.io.hub.push_to_hub`` uploads from such a folder: its files and the card.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import EvalResult, ModelCardData

from ..models.config import ViTConfig
from ..models.variants import size_name
from .calibration_file import OOD_NAME
from .card_text import calibration_section, folder_name, is_number, public_recipe, results_section
from .checkpoint import read_config
from .files import CONFIG_NAME, METRICS_NAME, WEIGHTS_NAME, CheckpointError, read_header, read_json

ACCURACY_KEYS = ("ema_test_top1", "top1", "test_top1", "test_acc", "val_top1", "val_acc", "acc", "accuracy")
RECIPE_NAMES = ("recipe.json", "recipe.yaml", "recipe.yml")
TAGS = ["image-classification", "vit_core", "timm", "vision-transformer"]

# Datasets this project trains on: name in recipes -> (Hub dataset id, display name).
_DATASETS = {
    "mnist": ("ylecun/mnist", "MNIST"),
    "fashion-mnist": ("zalando-datasets/fashion_mnist", "Fashion-MNIST"),
    "cifar10": ("uoft-cs/cifar10", "CIFAR-10"),
    "imagenet-1k": ("ILSVRC/imagenet-1k", "ImageNet-1k"),
}
_SECRET_KEY = re.compile(r"token|secret|passw|api[_-]?key|credential", re.IGNORECASE)
_RESNETS = {(3, 4, 9): "R50", (3, 4, 6, 3): "R50", (2, 2, 2, 2): "R26"}

CITATION = """@inproceedings{dosovitskiy2021an,
  title={An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale},
  author={Alexey Dosovitskiy and Lucas Beyer and Alexander Kolesnikov and Dirk Weissenborn and Xiaohua Zhai
          and Thomas Unterthiner and Mostafa Dehghani and Matthias Minderer and Georg Heigold and Sylvain Gelly
          and Jakob Uszkoreit and Neil Houlsby},
  booktitle={International Conference on Learning Representations},
  year={2021},
  url={https://openreview.net/forum?id=YicbFdNTTy}
}"""


# ------------------------------------------------------------------------------------ run files


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a ``metrics.jsonl`` file; lines that are not JSON objects are skipped
    (a run interrupted mid-write leaves a partial last line)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def final_metrics(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """(accuracy key, row) for the last row that reports an accuracy, or None."""
    for row in reversed(rows):
        key = next((k for k in ACCURACY_KEYS if is_number(row.get(k))), None)
        if key is not None:
            return key, row
    return None


def read_evals(folder: str | Path) -> list[dict[str, Any]]:
    """The ``eval_*.json`` records of a folder (``python -m train eval``), by file name; unreadable ones skipped."""
    out = []
    for path in sorted(Path(folder).glob("eval_*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and is_number(record.get("top1")):
            out.append(record)
    return out


def read_recipe(run_dir: str | Path) -> tuple[dict[str, Any], str] | None:
    """(recipe with credential-like keys removed, 'json' or 'yaml') from a run folder, or None."""
    for name in RECIPE_NAMES:
        path = Path(run_dir) / name
        if path.is_file():
            text = path.read_text()
            recipe = json.loads(text) if name.endswith(".json") else yaml.safe_load(text)
            if isinstance(recipe, dict):
                return _without_secrets(recipe), "json" if name.endswith(".json") else "yaml"
    return None


def _without_secrets(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _without_secrets(v) for k, v in d.items() if not _SECRET_KEY.search(str(k))}
    if isinstance(d, list):
        return [_without_secrets(v) for v in d]
    return d


def dataset_from_recipe(recipe: dict[str, Any] | None) -> str | None:
    if not recipe:
        return None
    for value in (recipe.get("dataset"), recipe.get("data")):
        if isinstance(value, str):
            return value
        if isinstance(value, dict) and isinstance(value.get("name") or value.get("dataset"), str):
            return value.get("name") or value.get("dataset")
    return None


def _dataset_ids(name: str) -> tuple[str | None, str]:
    """(Hub dataset id or None, display name) for a dataset as a recipe names it."""
    if name.startswith("hf:"):
        return name[3:], name[3:]
    key = name.lower().replace("_", "-")
    key = {"cifar-10": "cifar10", "fashionmnist": "fashion-mnist", "imagenet": "imagenet-1k"}.get(key, key)
    if key in _DATASETS:
        return _DATASETS[key]
    return None, folder_name(name)  # a local folder: named, not linked, and never by this machine's path


# ------------------------------------------------------------------------------------ the upload


def prepare_upload(
    folder: str | Path, repo_id: str, license: str = "apache-2.0", dataset: str | None = None
) -> tuple[dict[str, Path], str]:
    """What ``push_to_hub`` uploads from a checkpoint or training run folder: ({name in repo: local
    file}, model card text). Uploads ``model.safetensors``, ``config.json``, ``metrics.jsonl``, top-level ``*.png``
    (training curves, confusion matrices, reliability diagrams) and, when the config's calibration uses it,
    ``ood.safetensors``; the card (with the ``eval_*.json`` results) is generated (see ``vit_core.io.model_card``),
    never read from the folder."""
    folder = Path(folder)
    missing = [n for n in (WEIGHTS_NAME, CONFIG_NAME) if not (folder / n).is_file()]
    if not folder.is_dir() or missing:
        raise CheckpointError(
            f"{folder}: no {' or '.join(missing) or 'such folder'}; push a folder written by save_pretrained "
            "(a training run folder holds one once training has finished)"
        )
    cfg = read_config(folder)
    files = {WEIGHTS_NAME: folder / WEIGHTS_NAME, CONFIG_NAME: folder / CONFIG_NAME}
    metrics = []
    if (folder / METRICS_NAME).is_file():
        files[METRICS_NAME] = folder / METRICS_NAME
        metrics = read_metrics(folder / METRICS_NAME)
    calibration = read_json(folder / CONFIG_NAME).get("calibration")
    calibration = calibration if isinstance(calibration, dict) else None
    if calibration and isinstance(calibration.get("ood"), dict) and calibration["ood"].get("file") == OOD_NAME:
        files[OOD_NAME] = folder / OOD_NAME
    images = sorted(p.name for p in folder.glob("*.png"))
    files.update({name: folder / name for name in images})
    facts = CardFacts(
        num_params=_count_params(folder / WEIGHTS_NAME),
        metrics=metrics,
        recipe=read_recipe(folder),
        images=images,
        license=license,
        dataset=dataset,
        calibration=calibration,
        evals=read_evals(folder),
    )
    return files, render_model_card(cfg, repo_id, facts)


def _count_params(path: Path) -> int:
    """Number of weights in a safetensors file, read from its header without loading the tensors."""
    return sum(math.prod(shape) for shape in read_header(path).values())


# ------------------------------------------------------------------------------------ the card


def describe(cfg: ViTConfig) -> str:
    """The paper's notation for the variant: 'ViT-B/16', 'R50+ViT-B/16', or the shape spelled out."""
    size = size_name(cfg)
    if cfg.stem_channels:
        return (
            f"Hybrid ViT (a conv stem of widths {list(cfg.stem_channels)}, then {cfg.depth} layers of width "
            f"{cfg.embed_dim}, {cfg.num_heads} heads; a token per {cfg.feature_stride}x{cfg.feature_stride} pixels)"
        )
    if size is None:
        return f"ViT with {cfg.depth} layers, width {cfg.embed_dim}, {cfg.num_heads} heads, patch {cfg.feature_stride}"
    if cfg.backbone_layers:
        resnet = _RESNETS.get(tuple(cfg.backbone_layers), f"ResNet{list(cfg.backbone_layers)}")
        return f"{resnet}+ViT-{size}/{cfg.feature_stride}"
    return f"ViT-{size}/{cfg.patch_size}"


@dataclass(frozen=True)
class CardFacts:
    """What a model card says of a checkpoint beyond its config, as ``prepare_upload`` reads it from the folder:
    one value that travels from the folder to the text, each fact None (or empty) where the folder has none, so
    that the card leaves its section out."""

    num_params: int | None = None
    metrics: list[dict[str, Any]] | None = None  # ``metrics.jsonl``'s rows: the results table, the final accuracy
    recipe: tuple[dict[str, Any], str] | None = None  # the recipe and its format ("json" or "yaml"; ``read_recipe``)
    images: list[str] | None = None  # the folder's ``*.png`` names: reliability diagrams, curves, confusion matrices
    license: str = "apache-2.0"
    dataset: str | None = None  # the Hub dataset trained on; None: the recipe's ``data`` (``dataset_from_recipe``)
    calibration: dict[str, Any] | None = None  # ``config.json``'s "calibration" section
    evals: list[dict[str, Any]] | None = None  # the ``eval_*.json`` records (``read_evals``)


def render_model_card(cfg: ViTConfig, repo_id: str, facts: CardFacts | None = None) -> str:
    """The model card text for ``cfg`` as ``repo_id``, with the ``facts`` (none by default): YAML front matter
    (library, license, tags, pipeline, datasets, model-index with the final accuracy) and a body with results,
    calibration (``config.json``'s "calibration" section and the ``eval_*.json`` records), labels, usage, recipe
    and curves."""
    facts = facts or CardFacts()
    metrics, recipe, images, calibration = facts.metrics, facts.recipe, facts.images, facts.calibration
    name = repo_id.split("/")[-1]
    dataset = facts.dataset or dataset_from_recipe(recipe[0] if recipe else None)
    dataset_id, dataset_name = _dataset_ids(dataset) if dataset else (None, None)
    classifier = (recipe[0] if recipe else {}).get("task", "classify") == "classify"
    final = final_metrics(metrics or []) if classifier else None
    eval_results = None
    if final and dataset_name:
        key, row = final
        eval_results = [
            EvalResult(
                task_type="image-classification",
                dataset_type=dataset_id or dataset_name,
                dataset_name=dataset_name,
                dataset_split="validation" if key.startswith("val") else "test",
                metric_type="accuracy",
                metric_name="Top-1 accuracy",
                metric_value=row[key],
            )
        ]
    timm_loads = not cfg.stem_channels  # timm has no conv-stem ViT
    data = ModelCardData(
        library_name="timm" if timm_loads else "vit_core",
        license=facts.license,
        tags=TAGS if timm_loads else [t for t in TAGS if t != "timm"],
        pipeline_tag="image-classification" if cfg.num_classes else "image-feature-extraction",
        datasets=[dataset_id] if dataset_id else None,
        metrics=["accuracy"] if final else None,
        model_name=name if eval_results else None,
        eval_results=eval_results,
    )

    h, w = cfg.img_hw
    pool = (
        "the classifier reads the class token (eq. 4)"
        if cfg.global_pool == "token"
        else "the classifier reads the mean of the patch tokens"
    )
    params = f", {facts.num_params / 1e6:.2f}M parameters" if facts.num_params else ""
    trained = f" trained on {dataset_name}" if dataset_name else ""
    parts = [
        f"# {name}\n",
        f"{describe(cfg)}{params}: a Vision Transformer (Dosovitskiy et al., ICLR 2021){trained} with vit_core. "
        f"Input {h}x{w} with {cfg.in_chans} channel(s), normalised with mean {list(cfg.mean)} and std "
        f"{list(cfg.std)}; {pool}. "
        + (
            "`config.json` is in timm's layout, so both vit_core and timm load this repo.\n"
            if timm_loads
            else "Load it with vit_core: timm has no conv-stem ViT and cannot load it.\n"
        ),
    ]
    if metrics:
        parts.append(results_section(metrics, final[0] if final else None))
    reliability = [i for i in images or [] if Path(i).name.startswith("reliability_")]
    if classifier and (calibration or facts.evals):
        parts.append(calibration_section(calibration, facts.evals or [], reliability))
    if cfg.label_names:
        shown = [f"`{i}` {n}" for i, n in enumerate(cfg.label_names[:100])]
        more = f", ... ({len(cfg.label_names)} classes, all in `config.json`)" if len(cfg.label_names) > 100 else ""
        parts.append("## Labels\n\n" + ", ".join(shown) + more + "\n")
    parts.append(_usage(cfg, repo_id))
    if recipe:
        body, fmt = public_recipe(recipe[0]), recipe[1]
        text = json.dumps(body, indent=2) if fmt == "json" else yaml.safe_dump(body, sort_keys=False).rstrip()
        parts.append(f"## Training recipe\n\n```{fmt}\n{text}\n```\n")
    figures = [i for i in images or [] if i not in reliability]
    if figures:
        parts.append("## Training curves\n\n" + "\n".join(f"![{Path(i).stem}]({i})" for i in figures) + "\n")
    parts.append(f"## Citation\n\n```bibtex\n{CITATION}\n```\n")
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(parts)


def _usage(cfg: ViTConfig, repo_id: str) -> str:
    mode = {1: '.convert("L")', 3: '.convert("RGB")'}.get(cfg.in_chans, "")
    timm_note = (
        "\ntimm drops the pre-training `pre_logits` layer of this checkpoint on load, so its logits differ: "
        "use vit_core for this one.\n"
        if cfg.representation_size
        else ""
    )
    timm_usage = f"""
With timm:

```python
import timm
import torch
from PIL import Image

model = timm.create_model("hf-hub:{repo_id}", pretrained=True).eval()
transform = timm.data.create_transform(**timm.data.resolve_data_config({{}}, model=model))
with torch.no_grad():
    probs = model(transform(Image.open("image.png"){mode}).unsqueeze(0)).softmax(-1)
```
{timm_note}"""
    return f"""## Usage

With vit_core:

```python
import torch
import vit_core
from vit_core.data import build_transform, load_image

model = vit_core.from_pretrained("{repo_id}")
transform = build_transform(model.pretrained_cfg)  # this checkpoint's own preprocessing
x = transform(load_image("image.png")).unsqueeze(0)
with torch.no_grad():
    probs = model(x).softmax(-1)
print(model.label_names[probs.argmax()] if model.label_names else probs.argmax().item())
```
{timm_usage if not cfg.stem_channels else ""}"""
