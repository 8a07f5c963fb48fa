"""Checkpoints on disk: ``model.safetensors`` + ``config.json`` in timm's Hub layout. No network.

``config.json`` is the file timm writes with ``push_to_hf_hub`` and reads with ``local-dir:`` and
``hf-hub:``: ``architecture`` (a timm model name), ``num_classes``, ``num_features``, ``global_pool``,
``model_args`` (keyword arguments for that architecture), ``label_names`` and ``pretrained_cfg``
(preprocessing). Fields timm has no argument for (the paper's ``representation_size``, ``norm_eps``) are kept under
``vit_core`` so our loader round-trips them; timm ignores that key.

Weights are only ever read from safetensors: no pickle is unpickled here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import TIMM_MODEL_ARGS, ViTConfig, get_config, list_models
from .model import VisionTransformer, resample_pos_embed

WEIGHTS_NAME = "model.safetensors"
# timm model_args that change how inputs are handled, not the weights; ours always handles any size.
_RUNTIME_ONLY_ARGS = {"dynamic_img_size", "dynamic_img_pad", "strict_img_size"}
CONFIG_NAME = "config.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: the message says which file and what is wrong."""


# ------------------------------------------------------------------------------------ config.json


def _architecture(cfg: ViTConfig) -> str:
    """The timm model name that, with ``model_args``, rebuilds ``cfg`` in timm."""
    if cfg.name in list_models():
        return cfg.name
    if cfg.backbone_layers == (3, 4, 9):
        return "vit_base_r50_s16_224"
    if cfg.backbone_layers == (3, 4, 6, 3):
        return "vit_large_r50_s32_224"
    if cfg.backbone_layers is not None:
        raise CheckpointError(f"no timm architecture has ResNet stages {cfg.backbone_layers}")
    # Plain ViTs of any shape rebuild from this name plus model_args. A conv-stem hybrid has no timm
    # architecture: timm builds the transformer and then refuses the stem's weights, naming them.
    return "vit_base_patch16_224"


def config_to_dict(cfg: ViTConfig) -> dict[str, Any]:
    """``cfg`` as a timm ``config.json`` dict."""
    model_args = {k: getattr(cfg, k) for k in TIMM_MODEL_ARGS}
    h, w = cfg.img_hw
    model_args["img_size"] = h if h == w else [h, w]
    if cfg.backbone_layers is not None:
        model_args.pop("patch_size")  # fixed at 1 by timm's hybrid entry points
    return {
        "architecture": _architecture(cfg),
        "num_classes": cfg.num_classes,
        "num_features": cfg.representation_size or cfg.embed_dim,
        "global_pool": cfg.global_pool,
        "model_args": model_args,
        "label_names": list(cfg.label_names) if cfg.label_names else None,
        "pretrained_cfg": cfg.pretrained_cfg(),
        "vit_core": {
            "representation_size": cfg.representation_size,
            "norm_eps": cfg.norm_eps,
            "name": cfg.name,
            "stem_channels": list(cfg.stem_channels) if cfg.stem_channels else None,
            "stem_strides": list(cfg.stem_strides) if cfg.stem_strides else None,
        },
    }


def config_from_dict(d: dict[str, Any], source: str = "config.json") -> ViTConfig:
    """Read a timm-layout ``config.json`` dict (ours, or one timm wrote) into a ``ViTConfig``."""
    arch = d.get("architecture")
    if arch is None:
        raise CheckpointError(f"{source}: no 'architecture' field; is this a timm/vit_core config?")
    try:
        base = get_config(arch)
    except KeyError as e:
        raise CheckpointError(f"{source}: architecture {arch!r} is not a ViT this library builds ({e})") from None
    args = {k: v for k, v in (d.get("model_args") or {}).items() if k not in _RUNTIME_ONLY_ARGS}
    unknown = sorted(set(args) - set(TIMM_MODEL_ARGS))
    if unknown:
        raise CheckpointError(f"{source}: unsupported model_args {unknown}")
    for key in ("num_classes", "global_pool"):
        if key in d and d[key] is not None:
            args.setdefault(key, d[key])
    pc = d.get("pretrained_cfg") or {}
    if "input_size" in pc and "img_size" not in args:
        args["img_size"] = tuple(pc["input_size"][1:])
    for key in ("mean", "std", "interpolation", "crop_pct"):
        if key in pc:
            args[key] = pc[key]
    if "num_classes" not in args and "num_classes" in pc:
        args["num_classes"] = pc["num_classes"]
    ours = d.get("vit_core") or {}
    if ours.get("norm_eps"):
        args["norm_eps"] = float(ours["norm_eps"])
    if ours.get("representation_size"):
        args["representation_size"] = ours["representation_size"]
    if ours.get("stem_channels"):
        args["stem_channels"], args["stem_strides"] = ours["stem_channels"], ours.get("stem_strides")
    args["name"] = ours.get("name", arch)
    labels = d.get("label_names")
    if labels and len(labels) == args.get("num_classes", base.num_classes):
        args["label_names"] = labels
    else:
        args["label_names"] = None
    if isinstance(args.get("img_size"), (list, tuple)) and len(set(args["img_size"])) == 1:
        args["img_size"] = int(args["img_size"][0])
    try:
        return base.replace(**args)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from None


# ------------------------------------------------------------------------------------ writing


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Write via a temp file in the same folder and rename, so a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it a normal file's mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_pretrained(model: VisionTransformer, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (created if needed).

    ``dtype`` (e.g. ``torch.bfloat16``) stores the floating-point weights at lower precision.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().to("cpu")
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        state[k] = v.contiguous()
    atomic_write(directory / WEIGHTS_NAME, lambda p: save_file(state, p, metadata={"format": "pt"}))
    text = json.dumps(config_to_dict(model.config), indent=2) + "\n"
    atomic_write(directory / CONFIG_NAME, lambda p: Path(p).write_text(text))
    return directory


# ------------------------------------------------------------------------------------ reading


def read_config(directory: str | Path) -> ViTConfig:
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_NAME} (expected a folder written by save_pretrained or timm)")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    return config_from_dict(d, str(path))


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: no {path.name}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def load_weights(
    model: VisionTransformer,
    state: dict[str, torch.Tensor],
    old_cfg: ViTConfig | None = None,
    source: str = "checkpoint",
) -> None:
    """Load ``state`` strictly into ``model``. Position embeddings are resized to the model's grid
    (from ``old_cfg``'s grid when given, else a square one); any other missing, unexpected or
    mis-shaped key is an error that names it."""
    state = dict(state)
    pos = state.get("pos_embed")
    if pos is not None and pos.ndim == 3 and pos.shape[-1] == model.pos_embed.shape[-1]:
        old_grid = old_cfg.grid_size if old_cfg is not None else None
        state["pos_embed"] = resample_pos_embed(pos, model.patch_embed.grid_size, old_grid, model.num_prefix_tokens)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or mismatched:
        lines = [f"{source} does not fit the model ({model.config.name or 'custom config'}):"]
        for what, items in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", mismatched),
        ):
            if items:
                more = " ..." if len(items) > 10 else ""
                lines.append(f"  {what} ({len(items)}): {'; '.join(items[:10])}{more}")
        raise CheckpointError("\n".join(lines))
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def load_pretrained(directory: str | Path, **overrides: Any) -> VisionTransformer:
    """Build the model a local checkpoint folder describes and load its weights strictly.

    ``overrides`` change the config before building: ``img_size=384`` fine-tunes a 224 checkpoint at
    384 (position embeddings interpolated); dropout rates and ``drop_path_rate`` for training. Fields
    that would change weight shapes other than the position embeddings make loading fail clearly.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a folder")
    cfg = read_config(directory)
    model = VisionTransformer(cfg.replace(**overrides) if overrides else cfg)
    load_weights(model, read_weights(directory / WEIGHTS_NAME), old_cfg=cfg, source=str(directory / WEIGHTS_NAME))
    return model.eval()
