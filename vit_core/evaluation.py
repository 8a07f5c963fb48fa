"""Evaluation: accuracy, loss and the confusion matrix of a model over batches, of a checkpoint on a
dataset split (optionally with test-time augmentation), and the files that record a result."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .builders import load_data, load_init
from .data import Batches, build_transform
from .distributed import setup_processes
from .figures import confusion_figure
from .recipe import RecipeError
from .run_folder import commit, write_json

TTA_MODES = ("flip", "flip-translate")


def tta_views(images: torch.Tensor, tta: str | None) -> list[tuple[torch.Tensor, float]]:
    """The (view, weight) pairs whose softmaxes are averaged for a prediction; the weights sum to 1.

    ``None``: the image alone. ``"flip"``: the image and its horizontal mirror, 1/2 each.
    ``"flip-translate"`` (airbench's, Jordan 2024): those two at 1/4 each, and the mirror pair of the
    image shifted by s = side/32 px (1 px at 32 px) down-right and up-left, reflect-padded, at 1/8 each.
    """
    _check_tta(tta)
    if tta is None:
        return [(images, 1.0)]
    views = [(images, 1.0)]
    if tta == "flip-translate":
        H, W = images.shape[-2:]
        s = max(1, round(W / 32))
        padded = F.pad(images, (s, s, s, s), mode="reflect")
        views = [(images, 0.5), (padded[..., :H, :W], 0.25), (padded[..., 2 * s :, 2 * s :], 0.25)]
    return [(v, w / 2) for view, w in views for v in (view, view.flip(-1))]


def _check_tta(tta: str | None) -> None:
    if tta not in (None, *TTA_MODES):
        raise RecipeError(f"tta must be None or one of {', '.join(TTA_MODES)}, got {tta!r}")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    num_classes: int,
    *,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
    progress: bool = False,
    tta: str | None = None,
) -> dict[str, Any]:
    """Top-1 / top-5 accuracy (in %), mean cross-entropy and the confusion matrix (rows: true class,
    columns: predicted) of ``model`` over ``batches`` of (images, labels). Under DDP each process passes
    its share and all get the totals.

    ``tta`` (test-time augmentation, see :func:`tta_views`): the prediction is the weighted mean of the
    softmaxes of the image's views; the loss is the cross-entropy of that mean."""
    _check_tta(tta)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, top-5 hits, count
    for x, y in tqdm(batches, desc="eval", leave=False, disable=not progress):
        with autocast():
            views = [(model(v).float().log_softmax(-1), w) for v, w in tta_views(x, tta)]
        # log of the weighted mean of the views' softmaxes, computed stably
        logp = torch.logsumexp(torch.stack([lp + math.log(w) for lp, w in views]), dim=0)
        sums[0] += F.nll_loss(logp, y, reduction="sum")
        top = logp.topk(min(5, num_classes), dim=-1).indices
        sums[1] += (top == y[:, None]).any(-1).sum()
        sums[2] += len(y)
        confusion += torch.bincount(y * num_classes + top[:, 0], minlength=num_classes * num_classes)
    if dist.is_initialized():
        dist.all_reduce(confusion)
        dist.all_reduce(sums)
    model.train(was_training)
    confusion = confusion.view(num_classes, num_classes).cpu()
    n = max(sums[2].item(), 1)
    return {
        "loss": sums[0].item() / n,
        "top1": 100 * confusion.diagonal().sum().item() / n,
        "top5": 100 * sums[1].item() / n,
        "count": int(sums[2].item()),
        "confusion": confusion,
    }


@torch.no_grad()
def evaluate_mpp(
    mpp: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    seed: int = 0,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
) -> dict[str, float]:
    """Masked patch prediction loss and colour accuracy (in %) on fixed corruptions (``seed``)."""
    was_training = mpp.training
    mpp.eval()
    device = next(mpp.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for x, _ in batches:
        with autocast():
            logits, target = mpp(x, generator=g)
        logits = logits.float()
        sums += torch.stack(
            [
                F.cross_entropy(logits, target, reduction="sum"),
                (logits.argmax(-1) == target).sum(),
                sums.new_tensor(len(target)),
            ]
        )
    if dist.is_initialized():
        dist.all_reduce(sums)
    mpp.train(was_training)
    n = max(sums[2].item(), 1)
    return {"loss": sums[0].item() / n, "acc": 100 * sums[1].item() / n}


def evaluate_checkpoint(
    model: str | Path,
    data: str,
    *,
    split: str = "test",
    batch_size: int = 256,
    device: str = "auto",
    subset: int | None = None,
    workers: int = 0,
    progress: bool = True,
    tta: str | None = None,
) -> dict[str, Any]:
    """Top-1 / top-5 / loss / confusion matrix of a checkpoint (run folder, Hub id, timm:<name>) on a
    dataset split, preprocessed as the checkpoint's config says; ``tta`` averages each image's
    prediction over its views (see :func:`tta_views`). Adds ``labels``, ``model``, ``data``, ``split``
    and ``tta`` to :func:`evaluate`'s result."""
    procs = setup_processes(device)
    try:
        net = load_init(str(model)).to(procs.device).eval()
        dataset = load_data(data, split, build_transform(net.pretrained_cfg, train=False), subset)
        classes = list(dataset.classes)
        if net.config.num_classes != len(classes):
            raise RecipeError(
                f"{model} predicts {net.config.num_classes} classes but {data} has {len(classes)}; "
                "evaluate on the data it was trained for, or fine-tune it first (python -m train --init ...)"
            )
        batches = Batches(
            dataset, batch_size, procs.device, train=False, rank=procs.rank, world=procs.world, workers=workers
        )
        result = evaluate(net, batches, len(classes), progress=progress and procs.main, tta=tta)
    finally:
        procs.close()
    labels = net.label_names or classes
    return result | {"labels": labels, "model": str(model), "data": data, "split": split, "tta": tta}


def write_eval(result: dict[str, Any], folder: str | Path) -> tuple[Path, Path]:
    """Save an :func:`evaluate_checkpoint` result as ``eval_<split>.json`` (numbers, labels, confusion
    matrix) and ``confusion_<split>.png`` in ``folder`` (``_<tta>`` added to both names with ``tta``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = result["split"] + (f"_{result['tta']}" if result.get("tta") else "")
    record = {k: v for k, v in result.items() if k != "confusion"} | {"confusion": result["confusion"].tolist()}
    json_path, png_path = folder / f"eval_{name}.json", folder / f"confusion_{name}.png"
    write_json(json_path, record)
    tta = f", {result['tta']} TTA" if result.get("tta") else ""
    title = f"{Path(result['model']).name} on {result['data']} {result['split']}{tta}: top-1 {result['top1']:.2f}%"
    image = confusion_figure(result["confusion"], result["labels"], title)
    commit(folder, {png_path.name: lambda f: image.save(f, format="PNG")})
    return json_path, png_path


def format_confusion(confusion: torch.Tensor, labels: list[str]) -> str:
    """The confusion matrix as aligned text (rows: true class, columns: predicted)."""
    names = [str(s)[:10] for s in labels]
    width = max(max(len(n) for n in names), len(str(int(confusion.max()))), 3) + 1
    lines = [" " * width + "".join(n.rjust(width) for n in names)]
    for name, row in zip(names, confusion.tolist(), strict=True):
        lines.append(name.rjust(width) + "".join(str(v).rjust(width) for v in row))
    return "\n".join(lines)
