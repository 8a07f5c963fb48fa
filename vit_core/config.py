"""Model configuration and the variant registry.

Pure data: no torch modules. Names and shapes follow timm, so ``config.json`` files written by
either library describe the same network.

The paper's variants (Dosovitskiy et al. 2021, table 1), plus DeiT's Tiny and Small:

    name    layers  width  MLP    heads
    Ti      12      192    768    3
    S       12      384    1536   6
    B       12      768    3072   12
    L       24      1024   4096   16
    H       32      1280   5120   16

"ViT-L/16" means the Large model with 16x16 patches; "R50+ViT-B/16" the hybrid of section 3.1, whose
ResNet-50 stem (stages (3, 4, 9), total stride 16) feeds 1x1 patches to the transformer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# Fields that timm's VisionTransformer takes under the same name (config.json "model_args").
TIMM_MODEL_ARGS = (
    "img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depth",
    "num_heads", "mlp_ratio", "qkv_bias", "class_token", "drop_rate", "pos_drop_rate",
    "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
)  # fmt: skip


@dataclass(frozen=True)
class ViTConfig:
    """Everything needed to build a ViT and preprocess its input.

    The preprocessing fields (mean, std, interpolation, crop_pct) and label names travel with the
    checkpoint in ``config.json`` (timm's ``pretrained_cfg`` layout), so training, evaluation and the
    app all read them from one place.
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
    # and strides; its feature map is cut into patch_size x patch_size patches (1: one token per cell).
    stem_channels: tuple[int, ...] | None = None
    stem_strides: tuple[int, ...] | None = None
    # Preprocessing, as timm's pretrained_cfg.
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    interpolation: str = "bicubic"
    crop_pct: float = 0.9
    label_names: tuple[str, ...] | None = None
    # Registry name this config was made from (timm's architecture name), if any.
    name: str | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.global_pool not in ("token", "avg"):
            problems.append(f"global_pool must be 'token' or 'avg', got {self.global_pool!r}")
        if self.global_pool == "token" and not self.class_token:
            problems.append("global_pool='token' needs class_token=True")
        if self.embed_dim % self.num_heads:
            problems.append(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.patch_size < 1:
            problems.append(f"patch_size must be >= 1, got {self.patch_size}")
        if (self.stem_channels is None) != (self.stem_strides is None) or len(self.stem_channels or ()) != len(
            self.stem_strides or ()
        ):
            problems.append("stem_channels and stem_strides go together, one stride per channel count")
        elif self.stem_channels is not None and (
            not self.stem_channels or min(self.stem_channels) < 1 or min(self.stem_strides) < 1
        ):
            problems.append(f"stem channels/strides must be >= 1, got {self.stem_channels} / {self.stem_strides}")
        if self.stem_channels is not None and self.backbone_layers is not None:
            problems.append("a hybrid has either a ResNet (backbone_layers) or a conv stem (stem_channels), not both")
        if not self.is_hybrid and any(s % self.patch_size for s in self.img_hw):
            problems.append(f"img_size {self.img_size} is not a multiple of patch_size {self.patch_size}")
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            problems.append(f"mean/std need {self.in_chans} values (in_chans), got {self.mean} / {self.std}")
        if self.label_names is not None and len(self.label_names) != self.num_classes:
            problems.append(f"{len(self.label_names)} label_names for num_classes={self.num_classes}")
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
            return math.prod(self.stem_strides) * self.patch_size
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
            "crop_mode": "center",
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
        for key in ("mean", "std", "label_names", "backbone_layers", "stem_channels", "stem_strides"):
            if changes.get(key) is not None:
                changes[key] = tuple(changes[key])
        if isinstance(changes.get("img_size"), (list, tuple)):
            changes["img_size"] = tuple(int(v) for v in changes["img_size"])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Registry. Keys are timm's model names; every entry is checked against timm in the tests.
# --------------------------------------------------------------------------------------------

_WIDTHS = {  # embed_dim, depth, num_heads
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}

# (size, patch, resolutions) that timm defines as plain ViTs.
_PLAIN = [
    ("tiny", 16, (224, 384)),
    ("small", 8, (224,)),
    ("small", 16, (224, 384)),
    ("small", 32, (224, 384)),
    ("base", 8, (224,)),
    ("base", 16, (224, 384)),
    ("base", 32, (224, 384)),
    ("large", 14, (224,)),
    ("large", 16, (224, 384)),
    ("large", 32, (224, 384)),
    ("huge", 14, (224,)),
]

# The paper's hybrids: name -> (ViT size, ResNetV2 stage depths).
_HYBRID = {
    "vit_base_r50_s16_224": ("base", (3, 4, 9), 224),
    "vit_base_r50_s16_384": ("base", (3, 4, 9), 384),
    "vit_large_r50_s32_224": ("large", (3, 4, 6, 3), 224),
    "vit_large_r50_s32_384": ("large", (3, 4, 6, 3), 384),
}

_REGISTRY: dict[str, ViTConfig] = {}


def _register(name: str, **kwargs: Any) -> None:
    size = kwargs.pop("size")
    embed_dim, depth, num_heads = _WIDTHS[size]
    img = kwargs["img_size"]
    # timm: crop_pct 0.9 at 224, full image (1.0) at fine-tuning resolutions.
    crop_pct = 0.9 if img == 224 else 1.0
    _REGISTRY[name] = ViTConfig(
        embed_dim=embed_dim, depth=depth, num_heads=num_heads, crop_pct=crop_pct, name=name, **kwargs
    )


for _size, _patch, _resolutions in _PLAIN:
    for _img in _resolutions:
        _register(f"vit_{_size}_patch{_patch}_{_img}", size=_size, patch_size=_patch, img_size=_img)
for _name, (_size, _layers, _img) in _HYBRID.items():
    _register(_name, size=_size, patch_size=1, img_size=_img, backbone_layers=_layers)


def list_models() -> list[str]:
    """Names of the registered variants (timm's names), sorted."""
    return sorted(_REGISTRY)


def get_config(name: str, **overrides: Any) -> ViTConfig:
    """The registered config ``name`` with ``overrides`` applied."""
    if name not in _REGISTRY:
        close = [n for n in _REGISTRY if name.split("_")[1:2] and name.split("_")[1] in n]
        hint = f"; similar: {', '.join(sorted(close)[:6])}" if close else ""
        raise KeyError(f"unknown model {name!r}{hint}. See vit_core.list_models().")
    cfg = _REGISTRY[name]
    return cfg.replace(**overrides) if overrides else cfg
