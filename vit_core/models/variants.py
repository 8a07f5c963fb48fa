"""The variant registry: named configs under timm's model names, every one checked against timm in the tests.

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

from typing import Any

from .config import ViTConfig

SIZES = {  # the paper's sizes: name -> (abbreviation, embed_dim, depth, num_heads)
    "tiny": ("Ti", 192, 12, 3),
    "small": ("S", 384, 12, 6),
    "base": ("B", 768, 12, 12),
    "large": ("L", 1024, 24, 16),
    "huge": ("H", 1280, 32, 16),
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

# timm builds a name as its default pretrained weights need. These default to backbones without a
# classifier (ImageNet-21k pre-training, DINO), so the name alone gives a headless model...
_HEADLESS = {"vit_base_r50_s16_224", "vit_huge_patch14_224", "vit_large_patch32_224", "vit_small_patch8_224"}
# ...and DINO's weights expect ImageNet's mean and std instead of the 0.5s of the others.
_IMAGENET_NORM = {"vit_small_patch8_224": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}

_REGISTRY: dict[str, ViTConfig] = {}


def _register(name: str, size: str, img_size: int, **kwargs: Any) -> None:
    _, embed_dim, depth, num_heads = SIZES[size]
    mean, std = _IMAGENET_NORM.get(name, ((0.5,) * 3, (0.5,) * 3))
    _REGISTRY[name] = ViTConfig(
        img_size=img_size,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        num_classes=0 if name in _HEADLESS else 1000,
        mean=mean,
        std=std,
        crop_pct=0.9 if img_size == 224 else 1.0,  # timm: full image (1.0) at fine-tuning resolutions
        name=name,
        **kwargs,
    )


for _size, _patch, _resolutions in _PLAIN:
    for _img in _resolutions:
        _register(f"vit_{_size}_patch{_patch}_{_img}", _size, _img, patch_size=_patch)
for _name, (_size, _layers, _img) in _HYBRID.items():
    _register(_name, _size, _img, patch_size=1, backbone_layers=_layers)


def size_name(cfg: ViTConfig) -> str | None:
    """The paper's size letter ('Ti', 'S', 'B', 'L', 'H') of ``cfg``'s transformer, or None for other shapes."""
    shape = (cfg.embed_dim, cfg.depth, cfg.num_heads)
    return next((abbr for abbr, *dims in SIZES.values() if tuple(dims) == shape), None)


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
