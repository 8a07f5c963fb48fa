"""Evaluation: accuracy, loss, calibration error and the confusion matrix of a model over batches, of a
checkpoint on a dataset split (optionally with test-time augmentation), and the files that record a result."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..calibration import (
    ECE_BINS,
    TTA_MODES,
    Calibration,
    CalibrationOptions,
    bin_counts,
    ece_from_counts,
    expected_calibration_error,
    fit_temperature,
    forward_views,
    mixture_log_probs,
    temperature,
    tta_views,
)
from ..calibration.ood import (
    OTHERS_SCORES,
    OODDetector,
    choose_with_others,
    fit_statistics,
    ood_scores,
    score_quantiles,
    threshold_for,
)
from ..data import Batches, build_transform, class_subset
from ..data.photos import photo_specs, with_photos
from ..figures import confusion_figure, reliability_figure
from ..models.model import VisionTransformer
from .builders import load_data, load_init
from .distributed import setup_processes
from .recipe import RecipeError
from .run_folder import commit, write_json


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
    """Top-1 / top-5 accuracy (in %), mean cross-entropy, the confusion matrix (rows: true class, columns:
    predicted) and the expected calibration error (``vit_core.calibration``, 15 bins) of ``model`` over
    ``batches`` of (images, labels). Under DDP each process passes its share and all get the totals.

    The probabilities are the ones the library returns: ``tta`` (test-time augmentation, see
    :func:`tta_views`) averages the softmaxes of the image's views, each of the logits divided by the
    model's temperature when it has one; the loss is the cross-entropy of that mean. ``ece`` and
    ``reliability`` (per bin: images, mean confidence, accuracy) are those of these probabilities;
    ``ece_uncalibrated`` and ``reliability_uncalibrated`` those with T = 1, and ``temperature`` is None for a
    model without one."""
    _check_tta(tta)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    T = temperature(model)
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, top-5 hits, count
    bins = torch.zeros(2, 3, ECE_BINS, dtype=torch.float64, device=device)  # calibrated, T = 1: calibration.bin_counts
    for x, y in tqdm(batches, desc="eval", leave=False, disable=not progress):
        with autocast():
            views = [(model(v).float(), w) for v, w in tta_views(x, tta)]
        logits, weights = [z for z, _ in views], [w for _, w in views]
        logp = mixture_log_probs(logits, weights, T)
        sums[0] += F.nll_loss(logp, y, reduction="sum")
        top = logp.topk(min(5, num_classes), dim=-1).indices
        sums[1] += (top == y[:, None]).any(-1).sum()
        sums[2] += len(y)
        confusion += torch.bincount(y * num_classes + top[:, 0], minlength=num_classes * num_classes)
        plain = logp if T == 1 else mixture_log_probs(logits, weights)
        bins += torch.stack([bin_counts(logp.exp(), y), bin_counts(plain.exp(), y)])
    if dist.is_initialized():
        dist.all_reduce(confusion)
        dist.all_reduce(sums)
        dist.all_reduce(bins)
    model.train(was_training)
    confusion = confusion.view(num_classes, num_classes).cpu()
    n = max(sums[2].item(), 1)
    return {
        "loss": sums[0].item() / n,
        "top1": 100 * confusion.diagonal().sum().item() / n,
        "top5": 100 * sums[1].item() / n,
        "count": int(sums[2].item()),
        "confusion": confusion,
        "temperature": getattr(getattr(model, "calibration", None), "temperature", None),
        "ece": ece_from_counts(bins[0]),
        "ece_uncalibrated": ece_from_counts(bins[1]),
        "reliability": _reliability(bins[0]),
        "reliability_uncalibrated": _reliability(bins[1]),
    }


def _reliability(counts: torch.Tensor) -> dict[str, list]:
    """Per confidence bin: images, their mean confidence and accuracy (None for an empty bin)."""
    n = counts[0].cpu()
    mean = [[float(v / c) if c else None for v, c in zip(row.cpu(), n, strict=True)] for row in counts[1:]]
    return {"count": [int(c) for c in n], "confidence": mean[0], "accuracy": mean[1]}


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
        logits, hits = logits.float(), (logits.argmax(-1) == target).sum()
        sums += torch.stack([F.cross_entropy(logits, target, reduction="sum"), hits, sums.new_tensor(len(target))])
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
    subset: int | list[int] | torch.Tensor | None = None,
    workers: int = 0,
    progress: bool = True,
    tta: str | None = None,
) -> dict[str, Any]:
    """:func:`evaluate` of a checkpoint (run folder, Hub id, timm:<name>) on a dataset split, preprocessed and
    calibrated as its config says; ``tta`` averages each image's prediction over its views (:func:`tta_views`).
    A model trained on some of the data's classes (recipe ``classes``) is evaluated on the images of those.
    ``subset``: N images or [a, b] of the split's fixed shuffle, or a tensor of indices (``data.fixed_subset``).
    Adds ``labels``, ``model``, ``data``, ``split`` and ``tta`` to :func:`evaluate`'s result."""
    procs = setup_processes(device)
    try:
        net = load_init(str(model)).to(procs.device).eval()
        dataset = load_data(data, split, build_transform(net.pretrained_cfg, train=False), subset)
        dataset = class_subset(dataset, model_classes(net, dataset.classes))
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


HELD_OUT = (45000, 50000)  # CIFAR-10's last 5,000 training images in the fixed shuffle (data.fixed_subset)
OOD_FIT = (0, 10000)  # the training images whose features the OOD statistics are computed from


def calibrate_checkpoint(
    model: str | Path,
    data: str,
    *,
    held_out: tuple[int, int] = HELD_OUT,
    fit: tuple[int, int] = OOD_FIT,
    options: CalibrationOptions | None = None,
    seen: bool | None = False,
    photos: dict[str, Any] | list[dict[str, Any]] | None = None,
    batch_size: int = 500,
    device: str = "auto",
    progress: bool = True,
) -> tuple[Calibration, dict[str, float]]:
    """A ``Calibration`` of a checkpoint from training images of ``data``, and what was measured fitting it.

    The temperature (``vit_core.calibration.fit_temperature``) is fitted on the ``held_out`` training images
    (images a..b-1 of ``data.fixed_subset``'s fixed shuffle) for the ``options``' ``tta`` views; their ``ood``
    score's statistics (``vit_core.calibration.ood.fit_statistics``) come from the ``fit`` images' pre-logit
    features, and its threshold is the ``keep`` quantile of the held-out images' scores (``CalibrationOptions``;
    the app's by default). No test image is used. ``seen``: whether the model was trained on the held-out images
    (None: not known), recorded in ``fitted_on``: a model is right more often on images it was trained on than on
    new ones, so fitted there the temperature comes out too low (``store_temperature`` False keeps none). ``photos``:
    the run's recipe's (``vit_core.data.photos``); each of its training photos, as the app shrinks it, joins the
    ``fit`` images, so that the statistics describe what the model was trained on, photos included.

    Measured (on the held-out images): ``temperature``, ``nll`` / ``ece`` before and after, ``threshold``."""
    if not (held_out[1] <= fit[0] or fit[1] <= held_out[0]):
        raise RecipeError(f"the held-out images {list(held_out)} and the OOD fit images {list(fit)} overlap")
    procs = setup_processes(device)
    try:
        net = load_init(str(model)).to(procs.device).eval()
        seen_note = {True: " (seen in training)", None: " (maybe seen in training)", False: ""}[seen]
        options = options or CalibrationOptions()
        fit_images, fit_name = None, ""
        if options.ood is not None:
            fit_images, fit_name = ood_fit_images(net, data, fit, photos, progress)
        held_out_name = f"{data} training images [{held_out[0]}, {held_out[1]}) of the fixed shuffle{seen_note}"
        images = CalibrationImages(training_images(net, data, held_out), held_out_name, fit_images, fit_name)
        return calibrate_model(net, images, options=options, batch_size=batch_size, progress=progress)
    finally:
        procs.close()


def training_images(net: VisionTransformer, data: str, subset: tuple[int, int]) -> Dataset:
    """Training images ``subset`` (a..b-1 of the fixed shuffle) of ``data``, preprocessed for ``net``, of its
    classes."""
    dataset = load_data(data, "train", build_transform(net.pretrained_cfg), list(subset))
    dataset = class_subset(dataset, model_classes(net, dataset.classes))
    if net.config.num_classes != len(dataset.classes):
        raise RecipeError(f"the model predicts {net.config.num_classes} classes but {data} has {len(dataset.classes)}")
    return dataset


def ood_fit_images(
    net: VisionTransformer,
    data: str,
    fit: tuple[int, int] = OOD_FIT,
    photos: dict[str, Any] | list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> tuple[Dataset, str]:
    """The images an OOD score's statistics come from, and their name: training images ``fit`` of ``data`` and,
    with a recipe's ``photos``, each of those training photos as the app shrinks it (``calibrate_checkpoint``)."""
    images, name = training_images(net, data, fit), f"{data} training images [{fit[0]}, {fit[1]})"
    if photos is None:
        return images, name
    specs = [spec | {"copies": 1} for spec in photo_specs(photos)]
    images = with_photos(images, specs, None, net.pretrained_cfg, 0, progress)
    folders = [spec["folder"] + (f" ({spec['share']} share)" if spec.get("share") else "") for spec in specs]
    return images, f"{name} and the training photos of {' and '.join(folders)}"


@dataclasses.dataclass(frozen=True)
class CalibrationImages:
    """The images ``calibrate_model`` fits on, preprocessed for the model (the eval transform), each with the
    words the calibration records it was fitted on (its ``fitted_on``): a dataset and its name travel together, so
    that no calibration names other images than those it was fitted on."""

    held_out: Dataset  # the temperature, and the OOD threshold from their scores
    held_out_name: str
    fit: Dataset | None = None  # the OOD score's statistics, from their pre-logit features (None without a score)
    fit_name: str = ""
    # photos of none of the classes: every other one chooses the score among ``OTHERS_SCORES`` and sets its
    # threshold (``ood.choose_with_others``), the rest measure it (the report's ``others_turned_away``)
    others: Dataset | None = None


@torch.no_grad()
def calibrate_model(
    net: VisionTransformer,
    images: CalibrationImages,
    *,
    options: CalibrationOptions | None = None,
    batch_size: int = 500,
    progress: bool = True,
) -> tuple[Calibration, dict[str, float]]:
    """A ``Calibration`` of ``net`` (on its device) from ``images`` as the ``options`` say (the app's by
    default): the temperature fitted on the held-out images for the ``tta`` views, the ``ood`` score's statistics
    from the ``fit`` images' pre-logit features, its threshold the ``keep`` quantile of the held-out images' scores
    (or as the ``others`` choose); and what was measured (see :func:`calibrate_checkpoint`). ``net.calibration``
    is left as it was."""
    options = options or CalibrationOptions()
    tta, ood, keep, store_temperature = options.tta, options.ood, options.keep, options.store_temperature
    held_out_name, others = images.held_out_name, images.others
    device = next(net.parameters()).device
    was_training, kept_calibration = net.training, net.calibration
    net.eval()
    net.calibration = None  # measured from the raw logits

    def run(dataset: Dataset, views: str | None, what: str):
        logits, features, labels = [], [], []
        for x, y in tqdm(Batches(dataset, batch_size, device, train=False), desc=what, disable=not progress):
            z, f, weights, _ = forward_views(net, x, views)
            logits.append(torch.stack(z).cpu())
            features.append(torch.stack(f).cpu())
            labels.append(y.cpu())
        return list(torch.cat(logits, 1)), list(torch.cat(features, 1)), weights, torch.cat(labels)

    try:
        logits, features, weights, labels = run(images.held_out, tta, "held-out images")
        T = fit_temperature(logits, weights, labels)
        before, after = mixture_log_probs(logits, weights), mixture_log_probs(logits, weights, T)
        report = {
            "temperature": T,
            "nll": float(F.nll_loss(before, labels)),
            "nll_calibrated": float(F.nll_loss(after, labels)),
            "ece": expected_calibration_error(before.exp(), labels),
            "ece_calibrated": expected_calibration_error(after.exp(), labels),
            "images": len(labels),
        }
        detector = None
        if ood is not None:
            _, fit_features, _, fit_labels = run(images.fit, None, "OOD statistics")
            head = (net.head.weight, net.head.bias)  # what vim reads
            names = OTHERS_SCORES if others is not None else (ood,)
            stats = {n: fit_statistics(n, fit_features[0], fit_labels, net.config.num_classes, head) for n in names}

            def scored(probs: torch.Tensor, z: list[torch.Tensor], f: list[torch.Tensor]) -> dict[str, torch.Tensor]:
                return {n: ood_scores(n, probs=probs, logits=z, features=f, statistics=stats[n]) for n in names}

            scores = scored((after if store_temperature else before).exp(), logits, features)  # as predict() will
            threshold, kept, what = threshold_for(scores[ood], keep), keep, held_out_name
            if others is not None:  # they choose the score and its threshold (``ood.choose_with_others``)
                o_logits, o_features, _, _ = run(others, tta, "other photos")
                o_probs = mixture_log_probs(o_logits, weights, T if store_temperature else 1.0).exp()
                c = choose_with_others(scores, scored(o_probs, o_logits, o_features), keep)
                ood, threshold, kept = c.score, c.threshold, c.kept
                what += f" and {c.others_chose} photos of other things, which chose the score"
                report |= dataclasses.asdict(c)
            fitted_on, quantiles = f"statistics of {images.fit_name}, threshold on {what}", score_quantiles(scores[ood])
            detector = OODDetector(ood, threshold, kept, stats[ood], fitted_on, quantiles)
            report |= {"threshold": threshold, "held_out_turned_away": int((scores[ood] > threshold).sum())}
    finally:
        net.train(was_training)
        net.calibration = kept_calibration
    views = f"{tta} views of " if tta else ""
    if store_temperature:
        return Calibration(T, tta, f"{views}{held_out_name}", detector), report
    fitted_on = f"no temperature: fitted on {views}{held_out_name}, it was {T:.4g}, not stored"
    return Calibration(None, tta, fitted_on, detector), report


def model_classes(model: nn.Module, data_classes: list[str]) -> list[str] | None:
    """The data's classes to keep for ``model``: its label names when they are some of the data's classes in
    another number (a model trained with a recipe's ``classes``), else None (all of them)."""
    names = getattr(model, "label_names", None)
    if names and len(names) != len(data_classes) and set(names) <= set(data_classes):
        return list(names)
    return None


def write_eval(result: dict[str, Any], folder: str | Path) -> tuple[Path, Path, Path]:
    """Save an :func:`evaluate_checkpoint` result as ``eval_<split>.json`` (numbers, labels, confusion
    matrix, calibration), ``confusion_<split>.png`` and the reliability diagram ``reliability_<split>.png``
    in ``folder`` (``_<tta>`` added to the names with ``tta``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = result["split"] + (f"_{result['tta']}" if result.get("tta") else "")
    record = {k: v for k, v in result.items() if k != "confusion"} | {"confusion": result["confusion"].tolist()}
    json_path, png_path = folder / f"eval_{name}.json", folder / f"confusion_{name}.png"
    reliability_path = folder / f"reliability_{name}.png"
    write_json(json_path, record)
    tta = f", {result['tta']} TTA" if result.get("tta") else ""
    what = f"{Path(result['model']).name} on {result['data']} {result['split']}{tta}"
    image = confusion_figure(result["confusion"], result["labels"], f"{what}: top-1 {result['top1']:.2f}%")
    curves = {"softmax (T = 1)": result["reliability_uncalibrated"]}
    if result.get("temperature") is not None:
        curves[f"calibrated (T = {result['temperature']:.3g})"] = result["reliability"]
    diagram = reliability_figure(curves, f"{what}\n{result['count']:,} images")
    commit(
        folder,
        {
            png_path.name: lambda f: image.save(f, format="PNG"),
            reliability_path.name: lambda f: diagram.save(f, format="PNG"),
        },
    )
    return json_path, png_path, reliability_path


def format_confusion(confusion: torch.Tensor, labels: list[str]) -> str:
    """The confusion matrix as aligned text (rows: true class, columns: predicted)."""
    names = [str(s)[:10] for s in labels]
    width = max(max(len(n) for n in names), len(str(int(confusion.max()))), 3) + 1
    lines = [" " * width + "".join(n.rjust(width) for n in names)]
    for name, row in zip(names, confusion.tolist(), strict=True):
        lines.append(name.rjust(width) + "".join(str(v).rjust(width) for v in row))
    return "\n".join(lines)
