"""Training and evaluation: the loop behind ``python -m train``.

A run is described by a :class:`Recipe` (plain data: what the files in ``train/recipes/`` hold) and writes
one folder, on the first process only:

    recipe.json        the resolved recipe
    model.safetensors  the trained model (the EMA weights when ``ema_decay`` is set) and
    config.json        its config, label names and preprocessing: ``vit_core.from_pretrained(run)`` loads it
    metrics.jsonl      one line per epoch: losses, accuracies, learning rate, images/s
    curves.png         training curves
    checkpoint.pt      the full training state after the last finished epoch, for ``resume=True``

The ingredients are timm's, so a recipe means what it means there: ``create_optimizer_v2`` (weight decay
off for biases, norms and the model's ``no_weight_decay()`` embeddings; layer-wise lr decay through
``group_matcher``), ``CosineLRScheduler`` with linear warmup stepped every iteration, ``Mixup``/CutMix with
``SoftTargetCrossEntropy``, ``LabelSmoothingCrossEntropy``, ``ModelEmaV3``; RandAugment and random erasing
come with ``vit_core.data.build_transform``.

Several processes (``torchrun --nproc_per_node N``) train data-parallel (DDP: NCCL on GPUs, gloo on CPU).
``batch_size`` is the global batch: each process takes ``batch_size / N`` images of every step's batch from
one seeded permutation per epoch (``DistributedSampler``, seed + epoch), so N processes see the same
batches as one process would.

Resuming restores the model, optimizer, scheduler, EMA, grad scaler and every process's RNG states (torch,
CUDA, numpy, python; the data order is a function of seed and epoch) from the end of the last finished
epoch, so a run that is stopped and resumed ends with the same weights as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time
import types
import typing
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset
from tqdm.auto import tqdm

from .checkpoint import CheckpointError, atomic_write
from .config import ViTConfig, get_config
from .data import ImageTransform, InMemoryImageDataset, build_dataset, build_mixup, build_transform
from .model import VisionTransformer
from .mpp import MaskedPatchPrediction

RECIPE_NAME = "recipe.json"
METRICS_NAME = "metrics.jsonl"
CURVES_NAME = "curves.png"
CHECKPOINT_NAME = "checkpoint.pt"


class RecipeError(ValueError):
    """A recipe, or a request about a run, that cannot work: the message says which key and why."""


# ------------------------------------------------------------------------------------------ recipe


@dataclass
class Recipe:
    """Everything a training run depends on. Recipe files and ``--set key=value`` fill these fields."""

    # --- the model
    model: str | None = None  # registry name (vit_core.list_models()); None: ViTConfig's defaults
    model_args: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields, e.g. depth, drop_path_rate
    weight_init: str = "timm"  # from scratch: "timm" (trunc. normal .02) or "jax" (Xavier; model.init_weights)
    init: str | None = None  # fine-tune from a checkpoint: run folder, Hub id or timm:<name>; new zero head
    task: str = "classify"  # "classify", or "mpp": masked patch prediction pre-training (section 4.6)
    # --- the data
    data: str = "cifar10"  # mnist | fashion-mnist | cifar10 | a folder | hf:<name> (vit_core.data)
    train_subset: int | list[int] | None = None  # N: N training images; [a, b]: images a..b-1 (fixed shuffle)
    eval_subset: int | None = None  # evaluate on this many test images (fixed shuffle); None: all
    augment: dict[str, Any] = field(default_factory=dict)  # vit_core.data.AUGMENT_DEFAULTS keys
    mixup: float = 0.0  # Mixup alpha; 0: off
    cutmix: float = 0.0  # CutMix alpha; 0: off
    mixup_prob: float = 1.0  # probability of mixing a batch
    mixup_switch_prob: float = 0.5  # probability of CutMix instead of Mixup when both are on
    label_smoothing: float = 0.0
    # --- optimisation
    epochs: int = 10
    batch_size: int = 128  # global: over all processes
    opt: str = "adamw"  # any timm optimizer name: adamw, sgd, lamb, ...
    lr: float = 1e-3  # peak learning rate, after warmup
    weight_decay: float = 0.05
    momentum: float = 0.9  # for sgd
    layer_decay: float | None = None  # layer-wise lr decay for fine-tuning (BEiT), e.g. 0.75
    warmup_epochs: float = 0.0  # linear warmup from warmup_lr, in (fractional) epochs
    warmup_lr: float = 1e-6
    min_lr: float = 1e-6  # cosine decays to this
    grad_clip: float | None = None  # max global gradient norm
    ema_decay: float | None = None  # model EMA (timm ModelEmaV3), e.g. 0.9998; exported instead of the raw model
    seed: int = 0
    # --- how to run it (these may change when resuming)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "bf16"  # autocast on CUDA: bf16 | fp16 | fp32 (CPU always trains in fp32)
    compile: bool = False  # torch.compile the model
    grad_checkpointing: bool = False  # recompute blocks in backward: less memory for big variants
    workers: int = 0  # DataLoader processes (for per-image PIL transforms: folders, RandAugment)
    eval_batch_size: int = 256

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Recipe:
        """A checked recipe from a plain dict; unknown keys and wrongly typed values are a ``RecipeError``."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise RecipeError(f"unknown recipe key(s) {', '.join(unknown)}; valid keys: {', '.join(names)}")
        try:  # the canonical form is JSON's (tuples become lists): what recipe.json holds
            d = json.loads(json.dumps(d))
        except (TypeError, ValueError) as e:
            raise RecipeError(f"recipe values must be numbers, strings, booleans, None, lists or dicts ({e})") from None
        hints = typing.get_type_hints(cls)
        values = {key: _check_type(key, value, hints[key]) for key, value in d.items()}
        recipe = cls(**values)
        recipe._validate()
        return recipe

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def _validate(self) -> None:
        problems = []
        choices = {"task": ("classify", "mpp"), "precision": ("bf16", "fp16", "fp32"), "weight_init": ("timm", "jax")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                problems.append(f"{key} must be one of {', '.join(allowed)}, got {getattr(self, key)!r}")
        for key in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("lr", "weight_decay", "warmup_epochs", "warmup_lr", "min_lr", "mixup", "cutmix", "workers"):
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)}")
        for key in ("label_smoothing", "mixup_prob", "mixup_switch_prob"):
            if not 0 <= getattr(self, key) <= 1:
                problems.append(f"{key} must be in [0, 1], got {getattr(self, key)}")
        if self.warmup_epochs >= self.epochs:
            problems.append(f"warmup_epochs ({self.warmup_epochs}) must be less than epochs ({self.epochs})")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            problems.append(f"ema_decay must be in (0, 1), got {self.ema_decay}")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            problems.append(f"layer_decay must be in (0, 1], got {self.layer_decay}")
        if self.init is not None and self.model is not None:
            problems.append("give either model (train from scratch) or init (fine-tune a checkpoint), not both")
        derived = sorted({"num_classes", "label_names"} & set(self.model_args))
        if derived:
            problems.append(f"model_args {', '.join(derived)} come from the data's classes; remove them")
        if self.task == "mpp" and (self.mixup or self.cutmix or self.label_smoothing):
            problems.append("mixup, cutmix and label_smoothing apply to classification, not task='mpp'")
        if isinstance(self.train_subset, list) and (
            len(self.train_subset) != 2 or not 0 <= self.train_subset[0] < self.train_subset[1]
        ):
            problems.append(f"train_subset must be N or [start, stop] with start < stop, got {self.train_subset}")
        if problems:
            raise RecipeError("invalid recipe: " + "; ".join(problems))


# Keys that only say how to run, not what is computed (up to float rounding): a resumed run may change them.
RUNTIME_KEYS = frozenset({"device", "compile", "grad_checkpointing", "workers", "eval_batch_size"})


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` if it fits the field's type hint (ints are accepted for floats)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for t in args:
        base = typing.get_origin(t) or t
        if t is type(None) and value is None:
            return value
        if base is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if base is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if base in (str, bool, dict, list) and isinstance(value, base):
            return value
    want = " or ".join("None" if t is type(None) else (typing.get_origin(t) or t).__name__ for t in args)
    raise RecipeError(f"recipe key {key!r} must be {want}, got {value!r}")


def recipe_diff(a: Recipe, b: Recipe, ignore: frozenset[str] = RUNTIME_KEYS) -> list[str]:
    """Keys (outside ``ignore``) whose values differ, as 'key: a -> b'."""
    da, db = a.to_dict(), b.to_dict()
    return [f"{k}: {da[k]!r} -> {db[k]!r}" for k in da if k not in ignore and da[k] != db[k]]


# ------------------------------------------------------------------------------------ processes


@dataclass
class _Dist:
    """This process's place in a (possibly single-process) data-parallel run."""

    rank: int
    world: int
    device: torch.device
    owns_group: bool

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t


def _setup_processes(device: str) -> _Dist:
    """Pick the device; join the process group that torchrun describes (RANK, WORLD_SIZE, ...) if any."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RecipeError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise RecipeError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and not dist.is_initialized():
        return _Dist(0, 1, torch.device(device), False)
    owns = not dist.is_initialized()
    cuda = device.startswith("cuda")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if owns:
        dist.init_process_group("nccl" if cuda else "gloo")
    return _Dist(dist.get_rank(), dist.get_world_size(), torch.device(device), owns)


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)), "pos": np_state["state"]["pos"],
                  "has_gauss": np_state["has_gauss"], "gauss": np_state["gauss"]},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }  # fmt: skip


def _set_rng_state(s: dict[str, Any]) -> None:
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))
    n = s["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


# ------------------------------------------------------------------------------------------ data


class _Batches:
    """One process's batches of a dataset, on its device.

    Training: every epoch a permutation seeded with ``seed + epoch`` (``DistributedSampler``), the last
    partial global batch dropped; process r takes elements r, r + N, ... Evaluation: every image once,
    in order, process r taking r, r + N, ... In-memory datasets whose transform works on uint8 batches
    (``vit_core.data``'s fast path) are indexed and transformed a batch at a time on the device; anything
    else goes through a DataLoader with ``workers`` processes.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        device: torch.device,
        *,
        train: bool,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        workers: int = 0,
    ) -> None:
        self.device, self.batch_size, self.train = device, batch_size, train
        self.sampler = (
            DistributedSampler(dataset, world, rank, shuffle=True, seed=seed, drop_last=True) if train else None
        )
        self.indices = None if train else torch.arange(rank, len(dataset), world)
        tf = dataset.transform
        self.fast = isinstance(dataset, InMemoryImageDataset) and (tf is None or not tf.needs_pil)
        if self.fast:
            self.images, self.targets, self.transform = dataset.images.to(device), dataset.targets.to(device), tf
        else:
            self.loader = DataLoader(
                dataset if train else Subset(dataset, self.indices.tolist()), batch_size, sampler=self.sampler,
                drop_last=train, num_workers=workers, pin_memory=self.device.type == "cuda",
            )  # fmt: skip

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        n = len(self.sampler) if self.train else len(self.indices)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self):
        if not self.fast:
            for x, y in self.loader:
                yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            return
        order = torch.tensor(list(self.sampler)) if self.train else self.indices
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            idx = order[start : start + self.batch_size]
            idx = idx.to(self.device)
            x = self.images[idx]
            yield (self.transform(x) if self.transform else x), self.targets[idx]


def _subset(dataset: Dataset, spec: int | list[int] | None) -> Dataset:
    """A fixed subset: the same images for every recipe and seed (a permutation seeded with 0), so a
    labelled subset [0, n) and the pre-training images [n, N) never overlap."""
    if spec is None:
        return dataset
    start, stop = (0, spec) if isinstance(spec, int) else spec
    if stop > len(dataset):
        raise RecipeError(f"subset up to {stop} images, but the dataset has only {len(dataset)}")
    idx = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[start:stop]
    if isinstance(dataset, InMemoryImageDataset):
        return dataset.subset(idx)
    sub = Subset(dataset, idx.tolist())
    sub.classes, sub.targets, sub.transform = dataset.classes, dataset.targets[idx], dataset.transform
    return sub


def load_data(spec: str, split: str, transform: ImageTransform, subset: int | list[int] | None = None) -> Dataset:
    """``vit_core.data.build_dataset`` plus the recipe's fixed subset; data errors pass through as they are
    (``ImageDataError``: they already say what is wrong)."""
    return _subset(build_dataset(spec, split, transform=transform), subset)


# ----------------------------------------------------------------------------------------- model


def load_init(spec: str, **overrides: Any) -> VisionTransformer:
    """A checkpoint to fine-tune: a local folder, a Hub repo id, or ``timm:<name>`` (timm's default
    pretrained weights for that model, from the Hub or its cache). ``overrides``: config fields, e.g.
    ``img_size`` (position embeddings interpolated) or ``drop_path_rate``."""
    from . import hub

    if spec.startswith("timm:"):
        import timm.models

        name = spec[len("timm:") :]
        pretrained = timm.models.get_pretrained_cfg(name)  # None for names timm does not know
        if pretrained is None or not pretrained.hf_hub_id:
            raise CheckpointError(f"{spec}: timm has no Hub weights for {name!r}; see timm.list_pretrained('vit_*')")
        spec = pretrained.hf_hub_id
    try:
        return hub.from_pretrained(spec, **overrides)
    except CheckpointError:
        raise
    except (TypeError, ValueError) as e:  # overrides the config rejects
        raise RecipeError(f"init {spec}: cannot apply model_args {overrides}: {e}") from None


def scratch_config(recipe: Recipe, classes: list[str] | None) -> ViTConfig:
    """The config of a model trained from scratch: ``model`` (a registry name, or ViTConfig's defaults)
    with ``model_args``, and a head for ``classes`` (None: no head, for pre-training)."""
    try:
        base = get_config(recipe.model) if recipe.model else ViTConfig()
        return base.replace(**recipe.model_args, num_classes=len(classes or ()), label_names=classes)
    except KeyError as e:
        raise RecipeError(str(e).strip("\"'")) from None
    except TypeError as e:
        valid = ", ".join(f.name for f in dataclasses.fields(ViTConfig) if f.name not in ("num_classes", "label_names"))
        raise RecipeError(f"model_args: {e}; valid fields: {valid}") from None
    except ValueError as e:
        raise RecipeError(f"model_args: {e}") from None


def build_optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """timm's optimizer factory: no weight decay on biases, norms and ``model.no_weight_decay()``; with
    ``layer_decay`` each depth gets lr * layer_decay^(depth from the top), via ``model.group_matcher``."""
    from timm.optim import create_optimizer_v2

    kwargs = {"momentum": recipe.momentum} if recipe.opt.lower().endswith("sgd") or recipe.opt == "momentum" else {}
    try:
        return create_optimizer_v2(
            model, opt=recipe.opt, lr=recipe.lr, weight_decay=recipe.weight_decay, layer_decay=recipe.layer_decay,
            filter_bias_and_bn=True, **kwargs,
        )  # fmt: skip
    except (AssertionError, ValueError) as e:
        raise RecipeError(f"opt {recipe.opt!r}: {e}. See timm.optim.list_optimizers().") from None


def build_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe, steps_per_epoch: int):
    """Linear warmup then cosine decay to ``min_lr``, per iteration (timm ``CosineLRScheduler``)."""
    from timm.scheduler import CosineLRScheduler

    total = recipe.epochs * steps_per_epoch
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    return CosineLRScheduler(
        optimizer, t_initial=max(1, total - warmup), lr_min=recipe.min_lr, warmup_t=warmup,
        warmup_lr_init=recipe.warmup_lr, warmup_prefix=True, t_in_epochs=False,
    )  # fmt: skip


def _criterion(recipe: Recipe, mixing: bool) -> nn.Module:
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if mixing:  # Mixup makes soft targets, label smoothing included
        return SoftTargetCrossEntropy()
    if recipe.label_smoothing > 0:
        return LabelSmoothingCrossEntropy(recipe.label_smoothing)
    return nn.CrossEntropyLoss()


# ------------------------------------------------------------------------------------ evaluation


@torch.no_grad()
def evaluate(model: nn.Module, batches, num_classes: int, *, autocast=nullcontext, progress: bool = False) -> dict:
    """Top-1 / top-5 accuracy (in %), mean cross-entropy and the confusion matrix (rows: true class,
    columns: predicted) of ``model`` over ``batches`` of (images, labels). Under DDP each process passes
    its share and all get the totals."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, top-5 hits, count
    for x, y in tqdm(batches, desc="eval", leave=False, disable=not progress):
        with autocast():
            logits = model(x)
        logits = logits.float()
        sums[0] += F.cross_entropy(logits, y, reduction="sum")
        top = logits.topk(min(5, num_classes), dim=-1).indices
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
def evaluate_mpp(mpp: nn.Module, batches, *, seed: int = 0, autocast=nullcontext) -> dict:
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


# ------------------------------------------------------------------------------------- run files


def _write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2) + "\n"
    atomic_write(path, lambda p: Path(p).write_text(text))


def _write_metrics(path: Path, history: list[dict]) -> None:
    text = "".join(json.dumps(row) + "\n" for row in history)
    atomic_write(path, lambda p: Path(p).write_text(text))


def plot_curves(history: list[dict], path: str | Path) -> None:
    """Loss, accuracy and learning rate per epoch, as a PNG (matplotlib's Agg canvas, no display)."""
    from matplotlib.figure import Figure

    epochs = [row["epoch"] for row in history]
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)
    panels = ((ax_loss, "loss", ("train_loss", "test_loss")),
              (ax_acc, "accuracy (%)", ("train_top1", "test_top1", "ema_test_top1", "train_acc", "test_acc")),
              (ax_lr, "learning rate", ("lr",)))  # fmt: skip
    for ax, title, keys in panels:
        for key in keys:
            ys = [row.get(key) for row in history]
            if any(y is not None for y in ys):
                ax.plot(epochs, [math.nan if y is None else y for y in ys], marker=".", label=key)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if ax is not ax_lr:
            ax.legend()
    atomic_write(Path(path), lambda p: fig.savefig(p, format="png", dpi=100))


def plot_confusion(confusion: torch.Tensor, labels: list[str], path: str | Path, title: str = "") -> None:
    """The confusion matrix (rows: true class, columns: predicted), row-normalised colours, counts written
    in the cells when there are at most 20 classes."""
    from matplotlib.figure import Figure

    k = len(labels)
    cm = confusion.double()
    frac = cm / cm.sum(1, keepdim=True).clamp(min=1)
    size = min(3 + 0.45 * k, 24)
    fig = Figure(figsize=(size * 1.15, size), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(frac.numpy(), cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, label="fraction of the true class")
    if k <= 50:
        ax.set_xticks(range(k), labels, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(k), labels, fontsize=8)
    if k <= 20:
        for i in range(k):
            for j in range(k):
                color = "white" if frac[i, j] > 0.5 else "black"
                ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=7, color=color)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    atomic_write(Path(path), lambda p: fig.savefig(p, format="png", dpi=100))


def format_confusion(confusion: torch.Tensor, labels: list[str]) -> str:
    """The confusion matrix as aligned text (rows: true class, columns: predicted)."""
    names = [str(s)[:10] for s in labels]
    width = max(max(len(n) for n in names), len(str(int(confusion.max()))), 3) + 1
    lines = [" " * width + "".join(n.rjust(width) for n in names)]
    for name, row in zip(names, confusion.tolist(), strict=True):
        lines.append(name.rjust(width) + "".join(str(v).rjust(width) for v in row))
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ train


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model (the EMA weights when ``ema_decay`` is set; for
    ``task='mpp'`` the bare ViT), as saved in the run folder, and the per-epoch metrics."""

    model: VisionTransformer
    history: list[dict[str, Any]]


def train(
    recipe: Recipe | dict[str, Any],
    out: str | Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
) -> TrainResult:
    """Train as ``recipe`` says, writing the run folder ``out`` (on the first process).

    ``resume``: continue the run in ``out`` from its last checkpoint (the recipe must match the run's,
    except ``RUNTIME_KEYS``). ``stop_after``: stop once this many epochs are done (the schedule still spans
    ``recipe.epochs``), e.g. to train in slices. Under torchrun, call this in every process.
    """
    recipe = recipe if isinstance(recipe, Recipe) else Recipe.from_dict(recipe)
    procs = _setup_processes(recipe.device)
    try:
        run = _Run(recipe, Path(out), procs, resume)
        last = recipe.epochs if stop_after is None else min(recipe.epochs, stop_after)
        for epoch in range(run.start_epoch, last):
            row = run.train_epoch(epoch, progress) | run.evaluate()
            row["elapsed_s"] = time.time() - run.t_start
            run.history.append(row)
            run.save(epoch + 1)
        return TrainResult(run.exported(), run.history)
    finally:
        if procs.owns_group:
            dist.destroy_process_group()


class _Run:
    """The state of one training run on one process: data, model, optimizer, schedule, EMA."""

    def __init__(self, recipe: Recipe, out: Path, procs: _Dist, resume: bool) -> None:
        self.recipe, self.out, self.procs = recipe, out, procs
        state = self._check_folder(resume)
        if recipe.batch_size % procs.world:
            raise RecipeError(f"batch_size {recipe.batch_size} does not split over {procs.world} processes")
        per_rank = recipe.batch_size // procs.world
        self.mpp = recipe.task == "mpp"

        # The model's config gives the preprocessing; the data's classes give the head.
        init = load_init(recipe.init, **recipe.model_args) if recipe.init is not None else None
        pretrained_cfg = (init.config if init is not None else scratch_config(recipe, None)).pretrained_cfg()
        train_tf = build_transform(pretrained_cfg, train=True, augment=recipe.augment)
        train_set = load_data(recipe.data, "train", train_tf, recipe.train_subset)
        test_set = load_data(recipe.data, "test", build_transform(pretrained_cfg), recipe.eval_subset)
        self.classes = None if self.mpp else list(train_set.classes)
        if len(train_set) < recipe.batch_size:
            raise RecipeError(f"{len(train_set)} training images is less than one batch ({recipe.batch_size})")

        # The same weights on every process (EMA copies them before DDP could broadcast rank 0's), then one
        # random stream per process for augmentation.
        _seed_all(recipe.seed)
        if init is not None:
            init.reset_classifier(len(self.classes or ()), self.classes)  # zero init: the paper's fine-tuning
            self.model = init.train()
        else:
            self.model = VisionTransformer(scratch_config(recipe, self.classes))
            self.model.init_weights(recipe.weight_init)
        self.net: nn.Module = MaskedPatchPrediction(self.model) if self.mpp else self.model
        self.net.to(procs.device)
        _seed_all(recipe.seed + procs.rank)
        if recipe.grad_checkpointing:
            self.model.set_grad_checkpointing(True)

        self.train_batches = _Batches(train_set, per_rank, procs.device, train=True, rank=procs.rank,
                                      world=procs.world, seed=recipe.seed, workers=recipe.workers)  # fmt: skip
        self.test_batches = _Batches(test_set, recipe.eval_batch_size, procs.device, train=False, rank=procs.rank,
                                     world=procs.world, workers=recipe.workers)  # fmt: skip
        self.optimizer = build_optimizer(self.net, recipe)
        self.scheduler = build_scheduler(self.optimizer, recipe, len(self.train_batches))
        self.ema = None
        if recipe.ema_decay is not None:
            from timm.utils import ModelEmaV3

            self.ema = ModelEmaV3(self.net, decay=recipe.ema_decay)
        cuda = procs.device.type == "cuda"
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(recipe.precision) if cuda else None
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.mixup = None
        if not self.mpp:
            self.mixup = build_mixup(len(self.classes), recipe.mixup, recipe.cutmix, recipe.mixup_prob,
                                     recipe.mixup_switch_prob, recipe.label_smoothing)  # fmt: skip
        if self.mixup is not None and per_rank % 2:
            raise RecipeError(f"mixup/cutmix need an even batch per process, got {per_rank}")
        self.criterion = _criterion(recipe, self.mixup is not None)

        self.start_epoch, self.history = 0, []
        if state is not None:
            self._restore(state)
        self.t_start = time.time() - (self.history[-1]["elapsed_s"] if self.history else 0.0)
        self.forward = self.net
        if procs.world > 1:
            self.forward = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[procs.device.index] if cuda else None
            )
        if recipe.compile:
            self.forward = torch.compile(self.forward)

        if procs.main:
            out.mkdir(parents=True, exist_ok=True)
            _write_json(out / RECIPE_NAME, recipe.to_dict())
            print(f"{recipe.task} {recipe.data}: {len(train_set)} train / {len(test_set)} test images, "
                  f"{self.model.num_params():,} parameters, {procs.world} process(es) on {procs.device}",
                  flush=True)  # fmt: skip

    def _check_folder(self, resume: bool) -> dict[str, Any] | None:
        """The checkpoint to resume from (or None), after checking it belongs to this recipe."""
        path = self.out / CHECKPOINT_NAME
        if not resume:
            if path.exists():
                raise RecipeError(f"{self.out} already holds a run; pass --resume to continue it, or another --out")
            return None
        if not path.is_file():
            raise RecipeError(f"{self.out}: no {CHECKPOINT_NAME} to resume from; start the run without --resume")
        state = torch.load(path, map_location="cpu", weights_only=True)
        diff = recipe_diff(Recipe.from_dict(state["recipe"]), self.recipe)
        if diff:
            raise RecipeError(f"{self.out} was trained with another recipe ({'; '.join(diff)}); use a new --out")
        if state["epoch"] >= self.recipe.epochs:
            raise RecipeError(f"{self.out}: all {self.recipe.epochs} epochs are done already; nothing to resume")
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.module.load_state_dict(state["ema"])
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.start_epoch, self.history = state["epoch"], state["history"]
        if len(state["rng"]) == self.procs.world:
            _set_rng_state(state["rng"][self.procs.rank])
        else:  # another number of processes: the same data order, other augmentation draws
            _seed_all(self.recipe.seed + self.procs.rank + 1000 * self.start_epoch)

    def autocast(self):
        return torch.autocast("cuda", dtype=self.amp_dtype) if self.amp_dtype is not None else nullcontext()

    def train_epoch(self, epoch: int, progress: bool) -> dict[str, Any]:
        recipe, net, optimizer = self.recipe, self.net, self.optimizer
        self.train_batches.set_epoch(epoch)
        steps = len(self.train_batches)
        net.train()
        sums = torch.zeros(3, dtype=torch.float64, device=self.procs.device)  # loss * n, correct, n
        t0 = time.time()
        bar = tqdm(self.train_batches, desc=f"epoch {epoch + 1}/{recipe.epochs}", leave=False,
                   disable=not (progress and self.procs.main), dynamic_ncols=True)  # fmt: skip
        for i, (x, y) in enumerate(bar):
            target = y
            if self.mixup is not None:
                x, target = self.mixup(x, y)
            with self.autocast():
                if self.mpp:
                    logits, y = self.forward(x)  # predictions for the corrupted patches and their colours
                    loss = F.cross_entropy(logits.float(), y)
                else:
                    logits = self.forward(x)
                    loss = self.criterion(logits.float(), target)
            optimizer.zero_grad(set_to_none=True)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.unscale_(optimizer)
            else:
                loss.backward()
            if recipe.grad_clip is not None:
                nn.utils.clip_grad_norm_(net.parameters(), recipe.grad_clip)
            if self.scaler is not None:
                self.scaler.step(optimizer)
                self.scaler.update()
            else:
                optimizer.step()
            step = epoch * steps + i + 1
            self.scheduler.step_update(num_updates=step)
            if self.ema is not None:
                self.ema.update(net, step=step)
            with torch.no_grad():
                sums[0] += loss.detach().double() * len(y)
                sums[1] += (logits.argmax(-1) == y).sum() if self.mixup is None else 0
                sums[2] += len(y)
            if i % 20 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}")
        bar.close()
        self.procs.all_sum(sums)
        seconds = time.time() - t0
        row = {"epoch": epoch + 1, "train_loss": sums[0].item() / sums[2].item()}
        if not math.isfinite(row["train_loss"]):
            raise FloatingPointError(f"the training loss became {row['train_loss']} in epoch {epoch + 1}; lower lr")
        if self.mixup is None:  # mixed targets have no single correct class
            row["train_acc" if self.mpp else "train_top1"] = 100 * sums[1].item() / sums[2].item()
        return row | {
            "lr": max(g["lr"] for g in optimizer.param_groups),
            "images_per_s": steps * recipe.batch_size / seconds,
            "epoch_time_s": seconds,
        }

    def evaluate(self) -> dict[str, Any]:
        if self.mpp:
            ev = evaluate_mpp(self.net, self.test_batches, autocast=self.autocast)
            return {"test_loss": ev["loss"], "test_acc": ev["acc"]}
        ev = evaluate(self.net, self.test_batches, len(self.classes), autocast=self.autocast)
        row = {"test_loss": ev["loss"], "test_top1": ev["top1"], "test_top5": ev["top5"]}
        if self.ema is not None:
            ev = evaluate(self.ema.module, self.test_batches, len(self.classes), autocast=self.autocast)
            row |= {"ema_test_loss": ev["loss"], "ema_test_top1": ev["top1"], "ema_test_top5": ev["top5"]}
        return row

    def exported(self) -> VisionTransformer:
        """The model the run folder holds: the EMA weights if any; for mpp, the ViT without the wrapper."""
        net = self.ema.module if self.ema is not None else self.net
        return net.vit if self.mpp else net

    def save(self, epochs_done: int) -> None:
        """Write the model, the metrics, the curves and everything needed to resume (every process's RNG
        states included). A collective call under DDP; only the first process writes."""
        rngs = [_rng_state()]
        if self.procs.world > 1:
            rngs = [None] * self.procs.world
            dist.all_gather_object(rngs, _rng_state())
        if not self.procs.main:
            return
        self.exported().save_pretrained(self.out)
        state = {
            "epoch": epochs_done,
            "recipe": self.recipe.to_dict(),
            "model": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.module.state_dict() if self.ema is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rngs,
            "history": self.history,
        }
        atomic_write(self.out / CHECKPOINT_NAME, lambda p: torch.save(state, p))
        _write_metrics(self.out / METRICS_NAME, self.history)
        plot_curves(self.history, self.out / CURVES_NAME)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in self.history[-1].items()}),
              flush=True)  # fmt: skip


# ------------------------------------------------------------------------------- eval a checkpoint


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
) -> dict[str, Any]:
    """Top-1 / top-5 / loss / confusion matrix of a checkpoint (run folder, Hub id, timm:<name>) on a
    dataset split, preprocessed as the checkpoint's config says. Adds ``labels``, ``model``, ``data``,
    ``split`` to :func:`evaluate`'s result."""
    procs = _setup_processes(device)
    try:
        net = load_init(str(model)).to(procs.device).eval()
        dataset = load_data(data, split, build_transform(net.pretrained_cfg, train=False), subset)
        classes = list(dataset.classes)
        if net.config.num_classes != len(classes):
            raise RecipeError(
                f"{model} predicts {net.config.num_classes} classes but {data} has {len(classes)}; "
                "evaluate on the data it was trained for, or fine-tune it first (python -m train --init ...)"
            )
        batches = _Batches(dataset, batch_size, procs.device, train=False, rank=procs.rank, world=procs.world,
                           workers=workers)  # fmt: skip
        result = evaluate(net, batches, len(classes), progress=progress and procs.main)
    finally:
        if procs.owns_group:
            dist.destroy_process_group()
    return result | {"labels": net.label_names or classes, "model": str(model), "data": data, "split": split}


def write_eval(result: dict[str, Any], folder: str | Path) -> tuple[Path, Path]:
    """Save an :func:`evaluate_checkpoint` result as ``eval_<split>.json`` (numbers, labels, confusion
    matrix) and ``confusion_<split>.png`` in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    split = result["split"]
    record = {k: v for k, v in result.items() if k != "confusion"} | {"confusion": result["confusion"].tolist()}
    _write_json(folder / f"eval_{split}.json", record)
    title = f"{Path(result['model']).name} on {result['data']} {split}: top-1 {result['top1']:.2f}%"
    plot_confusion(result["confusion"], result["labels"], folder / f"confusion_{split}.png", title)
    return folder / f"eval_{split}.json", folder / f"confusion_{split}.png"
