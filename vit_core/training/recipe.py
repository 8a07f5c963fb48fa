"""The recipe: plain data that says what a training run computes (what ``train/recipes/*.py`` hold).

Kept apart from the training loop so that recipe files, the command line and tools that only read or
check recipes need none of it. ``Recipe.from_dict`` checks everything that can be checked without data:
unknown keys, types, ranges, the augmentation and, for a model trained from scratch, its config.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from ..data import check_augment
from ..data.photos import check_outliers, check_photos
from ..models.cnn import is_cnn
from ..models.config import ViTConfig
from ..models.variants import get_config


class RecipeError(ValueError):
    """A recipe, or a request about a run, that cannot work: the message says which key and why."""


@dataclass
class Recipe:
    """Everything a training run depends on. Recipe files and ``--set key=value`` fill these fields."""

    # --- the model
    # registry name (vit_core.list_models()); None: ViTConfig's defaults; "timm:<name>": a timm ResNet from
    # scratch, a baseline for comparisons (vit_core.models.cnn; its model_args: CNN_INPUT_FIELDS and "channels")
    model: str | None = None
    model_args: dict[str, Any] = field(default_factory=dict)  # ViTConfig fields, e.g. depth, drop_path_rate
    weight_init: str = "timm"  # from scratch: "timm" (trunc. normal .02) or "jax" (Xavier; model.init_weights)
    # from scratch, a conv stem's convolutions: "pytorch" (its default) or "dirac" (airbench: each one's first
    # filters, as many as its input channels, pass their input through; ConvStem.dirac_)
    stem_init: str = "pytorch"
    init: str | None = None  # fine-tune from a checkpoint: run folder, Hub id or timm:<name>; new zero head
    keep_head: bool = False  # fine-tuning on the checkpoint's own classes: keep its head instead of a new one
    # WiSE-FT (Wortsman et al. 2022): the run folder holds (1 - w) init + w trained weights, interpolated in weight
    # space, which keeps more of what the checkpoint knew (with keep_head: the same parameters on both sides)
    wise_ft: float | None = None
    # learning without forgetting (vit_core.training.distillation): the loss plus this weight times the
    # distillation loss to init's own answers (temperature ``distill_temperature``) on the images init classifies right
    distill: float | None = None
    distill_temperature: float = 2.0
    task: str = "classify"  # "classify", or "mpp": masked patch prediction pre-training (section 4.6)
    # --- the data
    data: str = "cifar10"  # mnist | fashion-mnist | cifar10 | a folder | hf:<name> (vit_core.data)
    train_subset: int | list[int] | None = None  # N: N training images; [a, b]: images a..b-1 (fixed shuffle)
    eval_subset: int | None = None  # evaluate on this many test images (fixed shuffle); None: all
    # only these of the data's classes, labelled in this order (after the subsets): open-set experiments
    classes: list[str] | None = None
    # hold out this share of the training images (per class, a fixed shuffle: data.stratified_split) as the
    # test set: for a folder of labelled photos without a val/ split; the held-out images also calibrate
    val_fraction: float | None = None
    # decode a folder's images once, into memory, at the model's input size (before its crop): batches are then
    # cut and augmented on the device, as CIFAR's are (vit_core.data.decode_all; for up to a few thousand images)
    in_memory: bool = False
    # real photos added to the in-memory training images, shrunk as the app shrinks them (vit_core.data.photos):
    # {"folder": "photos/cats_and_dogs", "classes": {"cats": "cat", "dogs": "dog"}, "copies": 3}
    photos: dict[str, Any] | list[dict[str, Any]] | None = None  # or a list of such specs, one per photo set
    # photos of other things (every class of the folder's train/), labelled "none of my classes": outlier
    # exposure (Hendrycks et al. 2019), their loss the cross-entropy to the uniform answer times ``weight``:
    # {"folder": "photos/ants_and_bees", "copies": 8, "weight": 0.5}
    outliers: dict[str, Any] | None = None
    augment: dict[str, Any] = field(default_factory=dict)  # vit_core.data.AUGMENT_DEFAULTS keys
    mixup: float = 0.0  # Mixup alpha; 0: off
    cutmix: float = 0.0  # CutMix alpha; 0: off
    mixup_prob: float = 1.0  # probability of mixing a batch
    mixup_switch_prob: float = 0.5  # probability of CutMix instead of Mixup when both are on
    label_smoothing: float = 0.0
    # the loss sees the logits plus the log of each class's share of the training images (Menon et al. 2021,
    # logit adjustment): the model's own logits then answer as if the classes were equally common, whatever the
    # mix it trained on (e.g. CIFAR-10 with extra photos of two classes)
    logit_adjust: bool = False
    # --- optimisation
    epochs: int = 10
    batch_size: int = 128  # global: over all processes
    # images per forward and backward pass (None: the whole batch of a process). A batch's micro-batches add
    # up their gradients before its one optimizer step, which is the whole batch's, but BatchNorm normalises
    # each micro-batch by its own statistics ("ghost batch norm") and updates its running averages once per
    # micro-batch. On a CPU smaller passes stay in cache (bench.bench_cpu_bf16 --batch).
    micro_batch: int | None = None
    opt: str = "adamw"  # any timm optimizer name: adamw, sgd, lamb, ...
    lr: float = 1e-3  # peak learning rate, after warmup
    weight_decay: float = 0.05
    momentum: float = 0.9  # for sgd
    layer_decay: float | None = None  # layer-wise lr decay for fine-tuning (BEiT), e.g. 0.75
    warmup_epochs: float = 0.0  # linear warmup from warmup_lr, in (fractional) epochs
    warmup_lr: float = 1e-6
    min_lr: float = 1e-6  # cosine decays to this
    # The hybrid's CNN with an optimizer of its own (builders.build_optimizer), e.g. airbench's
    # {"opt": "sgd", "lr": 1.5, "weight_decay": 1.3e-3, "momentum": 0.85, "norm_lr_scale": 64}; keys and
    # defaults: STEM_OPTIMIZER_DEFAULTS ("lr" required). None: one optimizer (opt, lr, ...) for everything.
    stem_optimizer: dict[str, Any] | None = None
    sched: str = "cosine"  # decay after warmup: "cosine" or "linear" (airbench's triangle with warmup)
    # BatchNorm's running statistics: weight of each batch's (PyTorch's convention; None: PyTorch's 0.1). airbench
    # uses 0.4, a shorter average for weights that move fast at its learning rates.
    bn_momentum: float | None = None
    lookahead: bool = False  # airbench's lookahead every 5 steps (builders.Lookahead); the model ends as its average
    grad_clip: float | None = None  # max global gradient norm
    ema_decay: float | None = None  # model EMA (timm ModelEmaV3), e.g. 0.9998; exported instead of the raw model
    # modules (names as in model.named_modules(), e.g. "patch_embed.backbone", "blocks.0") kept as loaded: no
    # gradient, and in eval mode (BatchNorm keeps its statistics)
    freeze: list[str] = field(default_factory=list)
    # a wall-clock budget for the training (evaluations included): the schedule runs on the clock, each step
    # taking it as far as the steps done or the time spent say, whichever is further, and the run stops,
    # annealed, when the budget is spent; ``epochs`` is then the most it may run
    budget_minutes: float | None = None
    seed: int = 0
    # --- how to run it (these may change when resuming)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "bf16"  # autocast on CUDA: bf16 | fp16 | fp32
    # autocast on a CPU: fp32 | bf16. bf16 doubles the convolutions' speed on a CPU with bf16 units (AVX-512 BF16
    # or AMX); one without them would emulate it, far slower, so there the engine says so and trains in fp32.
    cpu_precision: str = "fp32"
    compile: bool = False  # torch.compile the model
    channels_last: bool = False  # NHWC weights: faster convolutions on CPU (a conv stem trains ~15% faster)
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

    def scratch_config(self, classes: list[str] | None) -> ViTConfig:
        """The config of a model trained from scratch: ``model`` (a registry name, or ViTConfig's defaults)
        with ``model_args``, and a head for ``classes`` (None: no head, for pre-training). For a timm CNN
        (``model="timm:<name>"``) only its input fields and head mean anything: what preprocessing reads."""
        if is_cnn(self.model):
            return self._cnn_input_config(classes)
        try:
            base = get_config(self.model) if self.model else ViTConfig()
            return base.replace(**self.model_args, num_classes=len(classes or ()), label_names=classes)
        except KeyError as e:
            raise RecipeError(str(e).strip("\"'")) from None
        except TypeError as e:
            derived = ("num_classes", "label_names")
            valid = ", ".join(f.name for f in dataclasses.fields(ViTConfig) if f.name not in derived)
            raise RecipeError(f"model_args: {e}; valid fields: {valid}") from None
        except ValueError as e:
            raise RecipeError(f"model_args: {e}") from None

    def _cnn_input_config(self, classes: list[str] | None) -> ViTConfig:
        """A timm CNN's input and head as a config (patch size 1 takes any input size): its ``model_args`` are
        ``CNN_INPUT_FIELDS`` and ``channels``, the widths of its stages."""
        args = dict(self.model_args)
        channels = args.pop("channels", None)
        extra = sorted(set(args) - CNN_INPUT_FIELDS)
        if extra:
            raise RecipeError(
                f"model_args {', '.join(extra)}: a timm CNN takes its input ({', '.join(sorted(CNN_INPUT_FIELDS))}) "
                "and channels"
            )
        if channels is not None and not (
            isinstance(channels, list | tuple) and channels and all(type(c) is int and c > 0 for c in channels)
        ):
            raise RecipeError(f"model_args channels must be a list of positive stage widths, got {channels!r}")
        try:
            return ViTConfig(patch_size=1, **args, num_classes=len(classes or ()), label_names=classes)
        except ValueError as e:
            raise RecipeError(f"model_args: {e}") from None

    def _validate(self) -> None:
        problems = []
        choices = {
            "task": ("classify", "mpp"),
            "precision": ("bf16", "fp16", "fp32"),
            "cpu_precision": ("fp32", "bf16"),
            "weight_init": ("timm", "jax"),
            "stem_init": ("pytorch", "dirac"),
            "sched": ("cosine", "linear"),
        }
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                problems.append(f"{key} must be one of {', '.join(allowed)}, got {getattr(self, key)!r}")
        for key in ("epochs", "batch_size", "eval_batch_size"):
            if getattr(self, key) < 1:
                problems.append(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("lr", "weight_decay", "warmup_epochs", "warmup_lr", "min_lr", "mixup", "cutmix", "workers", "seed"):
            if getattr(self, key) < 0:
                problems.append(f"{key} must be >= 0, got {getattr(self, key)}")
        for key in ("label_smoothing", "mixup_prob", "mixup_switch_prob"):
            if not 0 <= getattr(self, key) <= 1:
                problems.append(f"{key} must be in [0, 1], got {getattr(self, key)}")
        if self.warmup_epochs >= self.epochs:
            problems.append(
                f"warmup_epochs ({self.warmup_epochs:g}) must be less than epochs ({self.epochs}); "
                "shorten it, e.g. --set warmup_epochs=0"
            )
        if self.val_fraction is not None and not 0 < self.val_fraction < 1:
            problems.append(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.val_fraction is not None and self.eval_subset is not None:
            problems.append("val_fraction holds the test images out of the training split; eval_subset does not apply")
        if self.budget_minutes is not None and self.budget_minutes <= 0:
            problems.append(f"budget_minutes must be > 0, got {self.budget_minutes}")
        if not all(isinstance(m, str) for m in self.freeze):
            problems.append(f"freeze must be a list of module names, got {self.freeze}")
        if self.micro_batch is not None and self.micro_batch < 1:
            problems.append(f"micro_batch must be >= 1, got {self.micro_batch}")
        if self.bn_momentum is not None and not 0 < self.bn_momentum <= 1:
            problems.append(f"bn_momentum must be in (0, 1], got {self.bn_momentum}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            problems.append(f"ema_decay must be in (0, 1), got {self.ema_decay}")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            problems.append(f"layer_decay must be in (0, 1], got {self.layer_decay}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            problems.append(f"grad_clip must be > 0 or None, got {self.grad_clip}")
        if self.init is not None and self.model is not None:
            problems.append("give either model (train from scratch) or init (fine-tune a checkpoint), not both")
        if self.stem_optimizer is not None and any("patch_embed.backbone".startswith(n) for n in self.freeze if n):
            problems.append("freeze keeps the hybrid's CNN as it is: it takes no stem_optimizer")
        if self.wise_ft is not None and not (self.keep_head and 0 < self.wise_ft <= 1):
            problems.append(f"wise_ft must be in (0, 1] and needs keep_head (init's own head), got {self.wise_ft}")
        if self.distill is not None and not (
            self.keep_head and self.task == "classify" and not (self.mixup or self.cutmix) and self.distill > 0
        ):
            problems.append("distill needs keep_head (init's own answers), no mixup or cutmix and a weight > 0")
        if self.distill_temperature <= 0:
            problems.append(f"distill_temperature must be > 0, got {self.distill_temperature}")
        if self.keep_head and self.init is None:
            problems.append("keep_head keeps a fine-tuned checkpoint's head: give init")
        problems += check_photos(self.photos) + check_outliers(self.outliers)
        if self.outliers is not None and (self.mixup or self.cutmix or self.val_fraction is not None):
            problems.append("outliers have no class to mix or hold out: no mixup, cutmix or val_fraction with them")
        if self.init is not None and self.stem_init != "pytorch":
            problems.append("stem_init initialises a model trained from scratch; a fine-tuned one keeps its weights")
        derived = sorted({"num_classes", "label_names"} & set(self.model_args))
        if derived:
            problems.append(f"model_args {', '.join(derived)} come from the data's classes; remove them")
        if is_cnn(self.model) and (
            self.task != "classify" or self.stem_optimizer is not None or self.stem_init != "pytorch"
        ):
            problems.append(f"{self.model} is a CNN baseline: task='classify' only, and no stem_optimizer or stem_init")
        if self.task == "mpp" and (self.mixup or self.cutmix or self.label_smoothing):
            problems.append("mixup, cutmix and label_smoothing apply to classification, not task='mpp'")
        problems += _subset_problems(self.train_subset, self.eval_subset)
        problems += _stem_optimizer_problems(self.stem_optimizer)
        if self.classes is not None and (
            not self.classes
            or not all(isinstance(c, str) for c in self.classes)
            or len(set(self.classes)) < len(self.classes)
        ):
            problems.append(f"classes must be a list of distinct class names, got {self.classes}")
        try:
            check_augment(self.augment)
        except ValueError as e:
            problems.append(f"augment: {e}")
        if problems:
            raise RecipeError("invalid recipe: " + "; ".join(problems))
        if self.init is None:  # a fine-tuned model's config comes from its checkpoint, checked when loaded
            self.scratch_config(None)


# What model_args may hold for a timm CNN: its input, as the data pipeline reads it (ViTConfig.pretrained_cfg).
CNN_INPUT_FIELDS = frozenset({"img_size", "in_chans", "mean", "std", "interpolation", "crop_pct", "crop_mode"})

# Keys that only say how to run, not what is computed (up to float rounding): a resumed run may change them.
RUNTIME_KEYS = frozenset({"device", "compile", "channels_last", "grad_checkpointing", "workers", "eval_batch_size"})


STEM_OPTIMIZER_DEFAULTS: dict[str, Any] = {"opt": "sgd", "weight_decay": 0.0, "momentum": 0.9, "norm_lr_scale": 1.0}


def _stem_optimizer_problems(so: dict[str, Any] | None) -> list[str]:
    if so is None:
        return []
    keys = ["lr", *STEM_OPTIMIZER_DEFAULTS]
    unknown = sorted(set(so) - set(keys))
    if unknown:
        return [f"stem_optimizer: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(keys)}"]
    if "lr" not in so:
        return ["stem_optimizer needs an lr"]
    problems = (
        [] if isinstance(so.get("opt", "sgd"), str) else [f"stem_optimizer opt must be a string, got {so['opt']!r}"]
    )
    for key in ("lr", "weight_decay", "momentum", "norm_lr_scale"):
        v = so.get(key, STEM_OPTIMIZER_DEFAULTS.get(key))
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            problems.append(f"stem_optimizer {key} must be a number >= 0, got {v!r}")
    if not problems and so.get("norm_lr_scale", 1.0) == 0:
        problems.append("stem_optimizer norm_lr_scale must be > 0")
    return problems


def _subset_problems(train_subset: int | list[int] | None, eval_subset: int | None) -> list[str]:
    problems = []
    if isinstance(train_subset, int) and train_subset < 1:
        problems.append(f"train_subset must be >= 1, got {train_subset}")
    if isinstance(train_subset, list) and not (
        len(train_subset) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in train_subset)
        and 0 <= train_subset[0] < train_subset[1]
    ):
        problems.append(f"train_subset must be N or [start, stop] with 0 <= start < stop, got {train_subset}")
    if eval_subset is not None and eval_subset < 1:
        problems.append(f"eval_subset must be >= 1, got {eval_subset}")
    return problems


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """``value`` if it fits the field's type hint (ints are accepted for floats)."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for t in args:
        base = typing.get_origin(t) or t
        if t is type(None) and value is None:
            return value
        if base is float and isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise RecipeError(f"recipe key {key!r} must be a finite number, got {value!r}")
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
