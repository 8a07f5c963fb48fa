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

from ..data import (
    ImageTransform,
    InMemoryImageDataset,
    build_dataset,
    build_mixup,
    build_transform,
    class_subset,
    decode_all,
    fixed_subset,
    index_subset,
    stratified_split,
    with_transform,
)
from ..data.photos import OUTLIER, with_photos
from ..io import hub
from ..io.files import CheckpointError
from ..models.cnn import create_cnn, is_cnn
from ..models.hybrid import ConvStem, whitening_weights
from ..models.model import VisionTransformer
from .distillation import Distilled
from .distributed import seed_all
from .mpp import MaskedPatchPrediction
from .recipe import STEM_OPTIMIZER_DEFAULTS, Recipe, RecipeError


def load_data(spec: str, split: str, transform: ImageTransform, subset: int | list[int] | None = None) -> Dataset:
    """``vit_core.data.build_dataset`` plus a fixed subset; data errors pass through as they are
    (``ImageDataError``: they already say what is wrong)."""
    return fixed_subset(build_dataset(spec, split, transform=transform), subset)


def build_datasets(recipe: Recipe, pretrained_cfg: dict[str, Any]) -> tuple[Dataset, Dataset]:
    """The training set (with the recipe's augmentation) and the test set, preprocessed as the model's
    ``pretrained_cfg`` says: the recipe's fixed subsets, then its ``classes``; with ``val_fraction`` the test set
    is that share of the training split, held out per class (``stratified_split``), and the training set the
    rest; with ``in_memory`` a folder's images are decoded once (``decode_all``)."""
    try:
        train_tf = build_transform(pretrained_cfg, train=True, augment=recipe.augment)
    except ValueError as e:  # e.g. a RandAugment spec timm cannot parse
        raise RecipeError(f"augment: {e}") from None
    test_tf = build_transform(pretrained_cfg)

    def load(split: str, transform: ImageTransform | None, subset: int | list[int] | None) -> Dataset:
        if not recipe.in_memory:
            return class_subset(load_data(recipe.data, split, transform, subset), recipe.classes)
        keep = lambda d: class_subset(fixed_subset(d, subset), recipe.classes)  # noqa: E731
        return with_transform(decode_all(recipe.data, split, pretrained_cfg, keep), transform)

    train_set = load("train", train_tf, recipe.train_subset)
    if recipe.photos is not None or recipe.outliers is not None:
        train_set = with_photos(train_set, recipe.photos, recipe.outliers, pretrained_cfg, recipe.seed)
    if recipe.val_fraction is None:
        test_set = load("test", test_tf, recipe.eval_subset)
    else:
        kept, held = stratified_split(train_set.targets, recipe.val_fraction)
        whole = with_transform(train_set, test_tf) if recipe.in_memory else load("train", test_tf, recipe.train_subset)
        train_set, test_set = index_subset(train_set, kept), index_subset(whole, held)
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


def build_network(
    recipe: Recipe, init: VisionTransformer | None, classes: list[str] | None, train_set: Dataset | None = None
) -> nn.Module:
    """What the optimizer trains: ``init`` with a new zero-initialised head for ``classes`` (the paper's
    fine-tuning; with ``keep_head``, its own head, whose classes must be ``classes``), or a model from scratch
    initialised as ``weight_init`` and ``stem_init`` say, its whitening filters (a conv stem's ``stem_whiten``)
    computed from ``train_set``; wrapped for masked patch prediction when ``task='mpp'``; or a timm CNN baseline
    (``vit_core.models.cnn``) with timm's initialisation. Seeded with the recipe's seed, so every process builds the
    same weights."""
    seed_all(recipe.seed)
    if init is not None:
        if not recipe.keep_head:
            init.reset_classifier(len(classes or ()), classes)
        elif init.class_names != list(classes or ()):
            raise RecipeError(f"keep_head: the checkpoint's classes {init.class_names} are not the data's {classes}")
        model = init.train()
    elif is_cnn(recipe.model):
        cfg = recipe.scratch_config(classes)
        try:
            channels = recipe.model_args.get("channels")
            model = create_cnn(recipe.model, cfg.num_classes, cfg.in_chans, cfg.img_hw, channels)
        except ValueError as e:
            raise RecipeError(str(e)) from None
    else:
        model = VisionTransformer(recipe.scratch_config(classes))
        model.init_weights(recipe.weight_init)
        stem = model.patch_embed.backbone
        if isinstance(stem, ConvStem) and stem.whiten is not None:
            with torch.no_grad():
                stem.whiten.weight.copy_(
                    whitening_weights(whitening_images(train_set, model), stem.whiten.kernel_size[0])
                )
        if recipe.stem_init == "dirac":
            if not isinstance(stem, ConvStem):
                raise RecipeError("stem_init 'dirac' initialises a conv stem (model_args stem_channels): none here")
            stem.dirac_()
    if recipe.bn_momentum is not None:
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.momentum = recipe.bn_momentum
    if recipe.grad_checkpointing:
        model.set_grad_checkpointing(True)
    for m in frozen_modules(model, recipe.freeze):
        m.requires_grad_(False)
    return MaskedPatchPrediction(model) if recipe.task == "mpp" else model


def frozen_modules(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules a recipe's ``freeze`` names (``model.named_modules()`` names); an unknown one is a
    ``RecipeError`` listing the model's top-level modules."""
    modules = dict(model.named_modules())
    unknown = [n for n in names if n not in modules or not n]
    if unknown:
        top = ", ".join(n for n in modules if n and "." not in n)
        raise RecipeError(f"freeze: no module {', '.join(map(repr, unknown))} in this model (its modules: {top}, ...)")
    return [modules[n] for n in names]


def whitening_images(train_set: Dataset | None, model: VisionTransformer, n: int = 5000) -> torch.Tensor:
    """The first ``n`` training images as the model sees them at test time (no augmentation): what
    airbench computes its whitening filters from."""
    if not isinstance(train_set, InMemoryImageDataset):
        raise RecipeError("stem_whiten computes its filters from the training images: it needs an in-memory dataset")
    return build_transform(model.config.pretrained_cfg())(train_set.images[:n])


def _timm_optimizer(params: Any, key: str, opt: str, momentum: float, **kwargs: Any) -> torch.optim.Optimizer:
    """timm's ``create_optimizer_v2``; a name or setting it rejects is a ``RecipeError`` naming the recipe ``key``."""
    from timm.optim import create_optimizer_v2

    if opt.lower().endswith("sgd") or opt == "momentum":
        kwargs["momentum"] = momentum
    try:
        return create_optimizer_v2(params, opt=opt, **kwargs)
    except (AssertionError, ValueError) as e:
        raise RecipeError(f"{key} {opt!r}: {e}. See timm.optim.list_optimizers().") from None


def build_optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.Optimizer | Optimizers:
    """timm's optimizer factory: no weight decay on biases, norms and ``model.no_weight_decay()``; with
    ``layer_decay`` each depth gets lr * layer_decay^(depth from the top), via ``model.group_matcher``.

    With ``stem_optimizer`` the hybrid's CNN has an optimizer of its own (``Optimizers`` steps both), as CNN
    recipes train it (airbench: SGD with Nesterov momentum): its convolution weights and the whitening bias at
    ``lr`` with ``weight_decay``, BatchNorm's shifts at ``lr * norm_lr_scale`` with the decay divided by it (the
    same decay per step); BatchNorm's scales stay at 1, as airbench fixes them (the next convolution can
    scale)."""
    from timm.optim._param_groups import param_groups_weight_decay

    if recipe.stem_optimizer is None:
        return _timm_optimizer(
            model,
            "opt",
            recipe.opt,
            recipe.momentum,
            lr=recipe.lr,
            weight_decay=recipe.weight_decay,
            layer_decay=recipe.layer_decay,
            filter_bias_and_bn=True,
        )
    vit = model.vit if isinstance(model, MaskedPatchPrediction) else model
    stem = vit.patch_embed.backbone
    if stem is None:
        raise RecipeError("stem_optimizer trains a hybrid's CNN, and this model has none")
    if recipe.layer_decay is not None:
        raise RecipeError("stem_optimizer and layer_decay do not combine: give one")
    in_stem = {id(p) for p in stem.parameters()}
    rest = param_groups_weight_decay(model, recipe.weight_decay, no_weight_decay_list=model.no_weight_decay())
    rest = [g | {"params": [p for p in g["params"] if id(p) not in in_stem]} for g in rest]
    main = _timm_optimizer([g for g in rest if g["params"]], "opt", recipe.opt, recipe.momentum, lr=recipe.lr)
    so = STEM_OPTIMIZER_DEFAULTS | recipe.stem_optimizer
    weights, shifts = [], []
    for name, p in stem.named_parameters():
        if name.endswith("norm.weight"):
            p.requires_grad_(False)
        elif name.endswith("norm.bias"):
            shifts.append(p)
        elif p.requires_grad:  # the whitening filters are frozen
            weights.append(p)
    scale = so["norm_lr_scale"]
    groups = [
        {"params": weights, "lr": so["lr"], "weight_decay": so["weight_decay"]},
        {"params": shifts, "lr": so["lr"] * scale, "weight_decay": so["weight_decay"] / scale},
    ]
    cnn = _timm_optimizer(groups, "stem_optimizer opt", so["opt"], so["momentum"], lr=so["lr"])
    return Optimizers(main, cnn)


class Optimizers:
    """Several optimizers stepped as one (``build_optimizer`` with ``stem_optimizer``): ``param_groups`` lists
    theirs in order, so the scheduler sets every group's learning rate."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # read anew each time: an optimizer's load_state_dict replaces its group dicts
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)


def main_groups(optimizer: torch.optim.Optimizer | Optimizers) -> list[dict[str, Any]]:
    """The parameter groups of ``opt`` (not of a ``stem_optimizer``): the learning rate a run reports."""
    return optimizer.optimizers[0].param_groups if isinstance(optimizer, Optimizers) else optimizer.param_groups


def build_scheduler(optimizer: torch.optim.Optimizer | Optimizers, recipe: Recipe, steps_per_epoch: int):
    """Linear warmup then a decay to ``min_lr``, per iteration: cosine (timm ``CosineLRScheduler``) or, with
    ``sched='linear'``, linear (``PolyLRScheduler`` with power 1: airbench's triangle)."""
    from timm.scheduler import CosineLRScheduler, PolyLRScheduler

    total = recipe.epochs * steps_per_epoch
    warmup = round(recipe.warmup_epochs * steps_per_epoch)
    schedule = dict(
        t_initial=max(1, total - warmup),
        lr_min=recipe.min_lr,
        warmup_t=warmup,
        warmup_lr_init=recipe.warmup_lr,
        warmup_prefix=True,
        t_in_epochs=False,
    )
    if recipe.sched == "linear":
        return PolyLRScheduler(optimizer, power=1.0, **schedule)
    return CosineLRScheduler(optimizer, **schedule)


def build_loss(
    recipe: Recipe, classes: list[str] | None, counts: torch.Tensor | None = None
) -> tuple[Callable | None, nn.Module]:
    """Mixup/CutMix (None when off or for ``task='mpp'``) and the classification loss that goes with it:
    soft-target cross-entropy for mixed targets (label smoothing included), else label smoothing or plain
    cross-entropy; with ``logit_adjust``, of the logits plus the log class frequencies of ``counts`` (the
    training images per class); with ``outliers``, that loss on the images of the classes plus outlier
    exposure's on the rest (``OutlierExposure``); with ``distill``, held to the starting model (``Distilled``)."""
    mixup, loss = _loss(recipe, classes)
    if recipe.logit_adjust:
        if counts is None or (counts == 0).any():
            raise RecipeError("logit_adjust needs training images of every class")
        loss = LogitAdjusted(loss, (counts.double() / counts.sum()).log().float())
    if recipe.outliers is not None:
        loss = OutlierExposure(loss, recipe.outliers["weight"])
    if recipe.distill is not None:
        loss = Distilled(loss, recipe.distill, recipe.distill_temperature)
    return mixup, loss


class LogitAdjusted(nn.Module):
    """``loss(z + log pi, target)``: the logit-adjusted loss of Menon et al. 2021 (eq. 10, tau = 1), pi the
    training label distribution. Trained so, softmax(z) estimates the class posterior under equal priors."""

    def __init__(self, loss: nn.Module, log_prior: torch.Tensor) -> None:
        super().__init__()
        self.loss = loss
        self.register_buffer("log_prior", log_prior)

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss(logits + self.log_prior.to(logits.device), target)


class OutlierExposure(nn.Module):
    """Outlier exposure (Hendrycks et al. 2019, eq. 1 for classification): ``loss`` on the images of the
    model's classes plus ``weight`` times the cross-entropy from the uniform distribution to softmax(z) on the
    outliers (target ``OUTLIER``), -mean_k log softmax(z)_k, whose minimum log K is the answer "every class
    equally likely". Each term is the mean over its own images, as the paper's two batches are."""

    def __init__(self, loss: nn.Module, weight: float) -> None:
        super().__init__()
        self.loss, self.weight = loss, weight

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = target == OUTLIER
        inside = self.loss(logits[~out], target[~out]) if (~out).any() else logits.sum() * 0
        if not out.any():
            return inside
        return inside - self.weight * logits[out].log_softmax(-1).mean(-1).mean()


def _loss(recipe: Recipe, classes: list[str] | None) -> tuple[Callable | None, nn.Module]:
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


class Lookahead:
    """airbench's lookahead (Jordan 2024, after Zhang et al. 2019): every ``every`` steps a slow copy of the
    weights (BatchNorm statistics included) moves toward the trained ones, ``slow += (1 - d) (fast - slow)``,
    and training goes on from the slow copy; ``d = 0.95^every (step / total)^3`` grows from 0 (no
    averaging) to 0.77 at the end, and after the last step the model is the slow copy."""

    def __init__(self, net: nn.Module, total_steps: int, every: int = 5) -> None:
        self.total, self.every = total_steps, every
        self.slow = {k: v.detach().clone() for k, v in net.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, net: nn.Module, step: int) -> None:
        """After optimizer step ``step`` (1-based)."""
        if step % self.every and step < self.total:
            return
        decay = 1.0 if step >= self.total else 0.95**self.every * (step / self.total) ** 3
        state = net.state_dict()
        for k, slow in self.slow.items():
            slow.lerp_(state[k], 1 - decay)
            state[k].copy_(slow)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.slow

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for k, v in state.items():
            self.slow[k].copy_(v)


def build_lookahead(net: nn.Module, recipe: Recipe, steps_per_epoch: int) -> Lookahead | None:
    return Lookahead(net, recipe.epochs * steps_per_epoch) if recipe.lookahead else None


def build_ema(net: nn.Module, recipe: Recipe) -> nn.Module | None:
    """timm's ``ModelEmaV3`` of ``net`` when ``ema_decay`` is set: its weights are the ones the run exports."""
    if recipe.ema_decay is None:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(net, decay=recipe.ema_decay)
