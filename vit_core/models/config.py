"""Model configuration: ``ViTConfig``, checked for types and ranges when made.

Pure data: no torch modules. Names and shapes follow timm, so ``config.json`` files written by either library
describe the same network. The named variants (timm's names, the paper's sizes) are ``variants``'.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

# Fields that timm's VisionTransformer takes under the same name (config.json "model_args").
TIMM_MODEL_ARGS = (
    "img_size",
    "patch_size",
    "in_chans",
    "num_classes",
    "global_pool",
    "embed_dim",
    "depth",
    "num_heads",
    "mlp_ratio",
    "qkv_bias",
    "class_token",
    "drop_rate",
    "pos_drop_rate",
    "proj_drop_rate",
    "attn_drop_rate",
    "drop_path_rate",
)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")  # the resampling filters vit_core.data applies
# Bounds on how many layers a config may list: far beyond any published model (ViT-22B has 48 blocks,
# ResNet-152 36 blocks per stage), and they keep checking a config cheap whatever it declares.
MAX_DEPTH = 1024
MAX_STAGE_DEPTH = 64
MAX_STEM_LAYERS = 16
STEM_ACTS = ("relu", "gelu")


@dataclass(frozen=True)
class ViTConfig:
    """Everything needed to build a ViT and preprocess its input.

    The preprocessing fields (mean, std, interpolation, crop_pct) and label names travel with the
    checkpoint in ``config.json`` (timm's ``pretrained_cfg`` layout), so training, evaluation and the
    app all read them from one place. Every field's type and range is checked on creation (a
    ``ValueError`` naming each problem), because configs also come from untrusted ``config.json`` files.
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    global_pool: str = "token"  # 'token': class token (eq. 4); 'avg': mean of patch tokens
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-6  # LayerNorm epsilon (timm and the JAX code; transformers' ViT uses 1e-12)
    class_token: bool = True
    # The paper's pre-training head: a hidden layer with tanh before the classifier (section 3.1).
    representation_size: int | None = None
    drop_rate: float = 0.0  # dropout before the classifier
    pos_drop_rate: float = 0.0  # dropout after adding position embeddings
    proj_drop_rate: float = 0.0  # dropout after attention projection and MLP layers
    attn_drop_rate: float = 0.0  # dropout on attention probabilities
    drop_path_rate: float = 0.0  # stochastic depth, increasing linearly with depth
    # Hybrid (section 3.1): ResNetV2 stage depths of the stem, e.g. (3, 4, 9) for R50 stride 16.
    backbone_layers: tuple[int, ...] | None = None
    # Hybrid with a small convolutional stem instead (Xiao et al. 2021, "Early Convolutions Help
    # Transformers See Better"): one 3x3 conv + BatchNorm + ReLU per entry, with these output channels
    # and strides, each optionally followed by a max pool (stem_pools: its size and stride, 1 = none,
    # as airbench's conv-pool-norm-act layers); the feature map is cut into patch_size x patch_size
    # patches (1: one token per cell).
    stem_channels: tuple[int, ...] | None = None
    stem_strides: tuple[int, ...] | None = None
    stem_pools: tuple[int, ...] | None = None
    # airbench's additions to the conv stem (Jordan 2024): a frozen k x k "whitening" convolution first, whose
    # 2 * in_chans * k^2 filters are the eigenvectors of the training images' k x k patch covariance (and their
    # negatives) scaled to unit variance (``hybrid.whitening_weights``; 'same' padding, bias trained), and the
    # activation after every BatchNorm ("relu" or "gelu").
    stem_whiten: int | None = None
    stem_act: str = "relu"
    # Preprocessing, as timm's pretrained_cfg.
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    interpolation: str = "bicubic"
    crop_pct: float = 0.9
    crop_mode: str = "center"  # "squash": resize the whole image to the input size, ignoring its aspect ratio
    label_names: tuple[str, ...] | None = None
    # Registry name this config was made from (timm's architecture name), if any.
    name: str | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # lists from JSON become tuples, numpy scalars Python numbers
            object.__setattr__(self, f.name, _normalise(getattr(self, f.name)))
        problems = _type_problems(self) or _value_problems(self)
        if problems:
            raise ValueError("invalid ViTConfig: " + "; ".join(problems))

    @property
    def img_hw(self) -> tuple[int, int]:
        """Image size as (height, width)."""
        s = self.img_size
        return (s, s) if isinstance(s, int) else (int(s[0]), int(s[1]))

    @property
    def is_hybrid(self) -> bool:
        """Tokens come from a CNN feature map (ResNet or conv stem), not from pixel patches."""
        return self.backbone_layers is not None or self.stem_channels is not None

    @property
    def feature_stride(self) -> int:
        """Pixels per token side: the patch size, times the CNN's stride for hybrids."""
        if self.stem_channels is not None:
            return math.prod(self.stem_strides) * math.prod(self.stem_pools or ()) * self.patch_size
        if self.backbone_layers is None:
            return self.patch_size
        # stem /4, then every stage after the first halves the resolution
        return 4 * 2 ** (len(self.backbone_layers) - 1) * self.patch_size

    @property
    def grid_size(self) -> tuple[int, int]:
        """Token grid (rows, cols) at the configured image size."""
        s = self.feature_stride
        h, w = self.img_hw
        return (-(-h // s), -(-w // s))  # ceil: hybrids pad 'same'

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.class_token else 0

    def pretrained_cfg(self) -> dict[str, Any]:
        """Preprocessing and head facts in timm's ``pretrained_cfg`` layout."""
        return {
            "input_size": [self.in_chans, *self.img_hw],
            "fixed_input_size": False,  # any multiple of the patch size works
            "interpolation": self.interpolation,
            "crop_pct": self.crop_pct,
            "crop_mode": self.crop_mode,
            "mean": list(self.mean),
            "std": list(self.std),
            "num_classes": self.num_classes,
            "first_conv": "patch_embed.proj"
            if not self.is_hybrid
            else "patch_embed.backbone.layers.0.conv"
            if self.stem_channels
            else "patch_embed.backbone.stem.conv",
            "classifier": "head",
        }

    def replace(self, **changes: Any) -> ViTConfig:
        """A copy with fields changed; unknown fields are an error naming them."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown ViTConfig field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _normalise(value: Any) -> Any:
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple):
        return tuple(_normalise(v) for v in value)
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (int, float)):
        return float(value)
    return value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ints(v: Any) -> bool:
    return isinstance(v, tuple) and all(_is_int(x) for x in v)


def _strings(v: Any) -> bool:
    return isinstance(v, tuple) and all(isinstance(x, str) for x in v)


def _type_problems(c: ViTConfig) -> list[str]:
    """Fields of the wrong type: checked first, since the value checks do arithmetic on them."""
    integer, number, flag, text = "an integer", "a finite number", "true or false", "a string"
    checks = {  # field -> (right type?, what it should be)
        "img_size": (_is_int(c.img_size) or (_ints(c.img_size) and len(c.img_size) == 2), "an integer or [h, w]"),
        "patch_size": (_is_int(c.patch_size), integer),
        "in_chans": (_is_int(c.in_chans), integer),
        "num_classes": (_is_int(c.num_classes), integer),
        "global_pool": (isinstance(c.global_pool, str), text),
        "embed_dim": (_is_int(c.embed_dim), integer),
        "depth": (_is_int(c.depth), integer),
        "num_heads": (_is_int(c.num_heads), integer),
        "mlp_ratio": (_is_real(c.mlp_ratio), number),
        "qkv_bias": (isinstance(c.qkv_bias, bool), flag),
        "norm_eps": (_is_real(c.norm_eps), number),
        "class_token": (isinstance(c.class_token, bool), flag),
        "representation_size": (c.representation_size is None or _is_int(c.representation_size), "an integer or null"),
        "backbone_layers": (c.backbone_layers is None or _ints(c.backbone_layers), "a list of integers or null"),
        "stem_channels": (c.stem_channels is None or _ints(c.stem_channels), "a list of integers or null"),
        "stem_strides": (c.stem_strides is None or _ints(c.stem_strides), "a list of integers or null"),
        "stem_pools": (c.stem_pools is None or _ints(c.stem_pools), "a list of integers or null"),
        "stem_whiten": (c.stem_whiten is None or _is_int(c.stem_whiten), "an integer or null"),
        "stem_act": (isinstance(c.stem_act, str), text),
        "mean": (isinstance(c.mean, tuple) and all(_is_real(v) for v in c.mean), "a list of numbers"),
        "std": (isinstance(c.std, tuple) and all(_is_real(v) for v in c.std), "a list of numbers"),
        "interpolation": (isinstance(c.interpolation, str), text),
        "crop_pct": (_is_real(c.crop_pct), number),
        "crop_mode": (isinstance(c.crop_mode, str), text),
        "label_names": (c.label_names is None or _strings(c.label_names), "a list of strings or null"),
        "name": (c.name is None or isinstance(c.name, str), "a string or null"),
    }
    checks |= {k: (_is_real(getattr(c, k)), number) for k in _DROP_RATES}
    return [f"{k} must be {what}, got {_short(getattr(c, k))}" for k, (ok, what) in checks.items() if not ok]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_DROP_RATES = ("drop_rate", "pos_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate")


def _value_problems(c: ViTConfig) -> list[str]:
    """Values out of range, and fields that contradict each other (all of the right type)."""
    p = []
    for key, low in (("patch_size", 1), ("in_chans", 1), ("num_classes", 0), ("embed_dim", 1), ("num_heads", 1)):
        if getattr(c, key) < low:
            p.append(f"{key} must be >= {low}, got {getattr(c, key)}")
    if not 1 <= c.depth <= MAX_DEPTH:
        p.append(f"depth must be in 1..{MAX_DEPTH}, got {c.depth}")
    if min(c.img_hw) < 1:
        p.append(f"img_size must be >= 1, got {c.img_size}")
    if c.representation_size is not None and c.representation_size < 1:
        p.append(f"representation_size must be >= 1 or None, got {c.representation_size}")
    if c.mlp_ratio <= 0 or (c.embed_dim >= 1 and int(c.embed_dim * c.mlp_ratio) < 1):
        p.append(f"mlp_ratio must give an MLP of at least 1 unit, got {c.mlp_ratio}")
    if c.norm_eps <= 0:
        p.append(f"norm_eps must be > 0, got {c.norm_eps}")
    p += [f"{k} must be in [0, 1), got {getattr(c, k)}" for k in _DROP_RATES if not 0 <= getattr(c, k) < 1]
    if not 0 < c.crop_pct <= 1:
        p.append(f"crop_pct must be in (0, 1], got {c.crop_pct}")
    if c.crop_mode not in ("center", "squash"):
        p.append(f"crop_mode must be 'center' or 'squash', got {_short(c.crop_mode)}")
    if c.global_pool not in ("token", "avg"):
        p.append(f"global_pool must be 'token' or 'avg', got {c.global_pool!r}")
    elif c.global_pool == "token" and not c.class_token:
        p.append("global_pool='token' needs class_token=True")
    if c.embed_dim >= 1 and c.num_heads >= 1 and c.embed_dim % c.num_heads:
        p.append(f"embed_dim {c.embed_dim} is not divisible by num_heads {c.num_heads}")
    if c.interpolation not in INTERPOLATIONS:
        p.append(f"interpolation must be one of {', '.join(INTERPOLATIONS)}, got {c.interpolation!r}")
    if len(c.mean) != c.in_chans or len(c.std) != c.in_chans:
        p.append(f"mean/std need {c.in_chans} values (in_chans), got {c.mean} / {c.std}")
    if any(s <= 0 for s in c.std):
        p.append(f"std must be > 0, got {c.std}")
    if c.label_names is not None and len(c.label_names) != c.num_classes:
        p.append(f"{len(c.label_names)} label_names for num_classes={c.num_classes}")
    p += _stem_problems(c)
    if not p and not c.is_hybrid and any(s % c.patch_size for s in c.img_hw):
        p.append(f"img_size {c.img_size} is not a multiple of patch_size {c.patch_size}")
    return p


def _stem_problems(c: ViTConfig) -> list[str]:
    if c.stem_act not in STEM_ACTS:
        return [f"stem_act must be one of {', '.join(STEM_ACTS)}, got {c.stem_act!r}"]
    if c.stem_channels is None and (c.stem_whiten is not None or c.stem_act != "relu"):
        return ["stem_whiten and stem_act belong to a conv stem: give stem_channels and stem_strides too"]
    if c.stem_whiten is not None and not 1 <= c.stem_whiten <= 7:
        return [f"stem_whiten is the whitening convolution's kernel size, 1..7 (airbench: 2), got {c.stem_whiten}"]
    if c.backbone_layers is not None:
        if c.stem_channels is not None:
            return ["a hybrid has either a ResNet (backbone_layers) or a conv stem (stem_channels), not both"]
        layers = c.backbone_layers
        if not 1 <= len(layers) <= 4 or not all(1 <= n <= MAX_STAGE_DEPTH for n in layers):
            return [f"backbone_layers must be 1 to 4 stage depths in 1..{MAX_STAGE_DEPTH}, got {layers}"]
        if c.patch_size != 1:  # timm's hybrids fix it, and config.json does not store it for them
            return [f"a ResNet hybrid takes 1x1 patches of the feature map (patch_size=1), got {c.patch_size}"]
        return []
    if c.stem_channels is None and c.stem_strides is None and c.stem_pools is None:
        return []
    channels, strides = c.stem_channels or (), c.stem_strides or ()
    pools = c.stem_pools or (1,) * len(channels)
    if not len(channels) == len(strides) == len(pools):
        return ["stem_channels, stem_strides (and stem_pools) go together, one stride (and pool) per channel count"]
    if not 1 <= len(channels) <= MAX_STEM_LAYERS or min(channels) < 1 or min(strides) < 1 or min(pools) < 1:
        return [
            f"a conv stem needs 1..{MAX_STEM_LAYERS} layers, channels, strides and pools >= 1, got "
            f"{channels} / {strides} / {pools}"
        ]
    # each stride-s conv (padding 1) and each size-p pool (ceil mode) gives ceil(side / s), ceil(side / p)
    cells = [-(-s // (math.prod(strides) * math.prod(pools))) for s in c.img_hw]
    if c.patch_size >= 1 and any(n % c.patch_size for n in cells):
        return [f"the conv stem's {cells[0]}x{cells[1]} feature map is not a multiple of patch_size {c.patch_size}"]
    return []
