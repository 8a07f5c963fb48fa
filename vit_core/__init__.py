"""vit_core: the Vision Transformer of Dosovitskiy et al. (ICLR 2021), weight-compatible with timm.

import vit_core
model = vit_core.create_model("vit_base_patch16_224", num_classes=10)
logits, attentions = model(images, return_attention=True)
model.save_pretrained("runs/b16")
model = vit_core.from_pretrained("runs/b16", img_size=384)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checkpoint import CheckpointError, load_pretrained, save_pretrained
from .config import ViTConfig, get_config, list_models
from .model import VisionTransformer, resample_pos_embed

__all__ = [
    "CheckpointError",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "from_pretrained",
    "get_config",
    "list_models",
    "resample_pos_embed",
    "save_pretrained",
]


def create_model(name: str | ViTConfig, **overrides: Any) -> VisionTransformer:
    """A freshly initialised model: a registry name (``list_models()``) or a ``ViTConfig``, with
    config fields overridden by keyword (``num_classes=10``, ``img_size=384``, ``global_pool='avg'``...)."""
    cfg = name.replace(**overrides) if isinstance(name, ViTConfig) else get_config(name, **overrides)
    return VisionTransformer(cfg)


def from_pretrained(path: str | Path, **overrides: Any) -> VisionTransformer:
    """Load a checkpoint folder (``model.safetensors`` + ``config.json``, ours or timm's), strictly,
    in eval mode. ``img_size=...`` loads it at another resolution (position embeddings interpolated)."""
    return load_pretrained(path, **overrides)
