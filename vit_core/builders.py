"""The parts of a training run, each built from its recipe: data, model, optimizer, schedule, loss, EMA.

The ingredients are timm's, so a recipe means what it means there: ``create_optimizer_v2`` (weight decay
off for biases, norms and the model's ``no_weight_decay()`` embeddings; layer-wise lr decay through
``group_matcher``), ``CosineLRScheduler`` with linear warmup stepped every iteration, ``Mixup``/CutMix with
``SoftTargetCrossEntropy``, ``LabelSmoothingCrossEntropy``, ``ModelEmaV3``; RandAugment and random erasing
come with ``vit_core.data.build_transform``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from . import hub
from .checkpoint import CheckpointError
from .data import ImageTransform, build_dataset, build_mixup, build_transform, class_subset, fixed_subset
from .distributed import seed_all
from .model import VisionTransformer
from .mpp import MaskedPatchPrediction
from .recipe import Recipe, RecipeError


def load_data(spec: str, split: str, transform: ImageTransform, subset: int | list[int] | None = None) -> Dataset:
    """``vit_core.data.build_dataset`` plus a fixed subset; data errors pass through as they are
    (``ImageDataError``: they already say what is wrong)."""
    return fixed_subset(build_dataset(spec, split, transform=transform), subset)


def build_datasets(recipe: Recipe, pretrained_cfg: dict[str, Any]) -> tuple[Dataset, Dataset]:
    """The training set (with the recipe's augmentation) and the test set, preprocessed as the model's
    ``pretrained_cfg`` says: the recipe's fixed subsets, then its ``classes``."""
    try:
        train_tf = build_transform(pretrained_cfg, train=True, augment=recipe.augment)
    except ValueError as e:  # e.g. a RandAugment spec timm cannot parse
        raise RecipeError(f"augment: {e}") from None
    train_set = class_subset(load_data(recipe.data, "train", train_tf, recipe.train_subset), recipe.classes)
    test_set = class_subset(
        load_data(recipe.data, "test", build_transform(pretrained_cfg), recipe.eval_subset), recipe.classes
    )
    if len(train_set) < recipe.batch_size:
        raise RecipeError(f"{len(train_set)} training images is less than one batch ({recipe.batch_size})")
    return train_set, test_set


def load_init(spec: str, **overrides: Any) -> VisionTransformer:
    """A checkpoint to fine-tune: a local folder, a Hub repo id, or ``timm:<name>`` (timm's default
    pretrained weights for that model, from the Hub or its cache). ``overrides``: config fields, e.g.
    ``img_size`` (position embeddings interpolated) or ``drop_path_rate``."""
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


def build_network(recipe: Recipe, init: VisionTransformer | None, classes: list[str] | None) -> nn.Module:
    """What the optimizer trains: ``init`` with a new zero-initialised head for ``classes`` (the paper's
    fine-tuning), or a model from scratch initialised as ``weight_init`` says; wrapped for masked patch
    prediction when ``task='mpp'``. Seeded with the recipe's seed, so every process builds the same weights."""
    seed_all(recipe.seed)
    if init is not None:
        init.reset_classifier(len(classes or ()), classes)
        model = init.train()
    else:
        model = VisionTransformer(recipe.scratch_config(classes))
        model.init_weights(recipe.weight_init)
    if recipe.grad_checkpointing:
        model.set_grad_checkpointing(True)
    return MaskedPatchPrediction(model) if recipe.task == "mpp" else model


def build_optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    """timm's optimizer factory: no weight decay on biases, norms and ``model.no_weight_decay()``; with
    ``layer_decay`` each depth gets lr * layer_decay^(depth from the top), via ``model.group_matcher``."""
    from timm.optim import create_optimizer_v2

    kwargs = {"momentum": recipe.momentum} if recipe.opt.lower().endswith("sgd") or recipe.opt == "momentum" else {}
    try:
        return create_optimizer_v2(
            model,
            opt=recipe.opt,
            lr=recipe.lr,
            weight_decay=recipe.weight_decay,
            layer_decay=recipe.layer_decay,
            filter_bias_and_bn=True,
            **kwargs,
        )
    except (AssertionError, ValueError) as e:
        raise RecipeError(f"opt {recipe.opt!r}: {e}. See timm.optim.list_optimizers().") from None


def build_scheduler(optimizer: torch.optim.Optimizer, recipe: Recipe, steps_per_epoch: int):
    """Linear warmup then cosine decay to ``min_lr``, per iteration (timm ``CosineLRScheduler``)."""
    from timm.scheduler import CosineLRScheduler

    total = recipe.epochs * steps_per_epoch
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    return CosineLRScheduler(
        optimizer,
        t_initial=max(1, total - warmup),
        lr_min=recipe.min_lr,
        warmup_t=warmup,
        warmup_lr_init=recipe.warmup_lr,
        warmup_prefix=True,
        t_in_epochs=False,
    )


def build_loss(recipe: Recipe, classes: list[str] | None) -> tuple[Callable | None, nn.Module]:
    """Mixup/CutMix (None when off or for ``task='mpp'``) and the classification loss that goes with it:
    soft-target cross-entropy for mixed targets (label smoothing included), else label smoothing or plain
    cross-entropy."""
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    mixup = None
    if classes is not None:
        mixup = build_mixup(
            len(classes),
            recipe.mixup,
            recipe.cutmix,
            recipe.mixup_prob,
            recipe.mixup_switch_prob,
            recipe.label_smoothing,
        )
    if mixup is not None:
        return mixup, SoftTargetCrossEntropy()
    if recipe.label_smoothing > 0:
        return None, LabelSmoothingCrossEntropy(recipe.label_smoothing)
    return None, nn.CrossEntropyLoss()


def build_ema(net: nn.Module, recipe: Recipe) -> nn.Module | None:
    """timm's ``ModelEmaV3`` of ``net`` when ``ema_decay`` is set: its weights are the ones the run exports."""
    if recipe.ema_decay is None:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(net, decay=recipe.ema_decay)
