"""vit_core: the Vision Transformer of Dosovitskiy et al. (ICLR 2021), weight-compatible with timm.

import vit_core
model = vit_core.create_model("vit_base_patch16_224", num_classes=10)
logits, attentions = model(images, return_attention=True)
vit_core.save_pretrained(model, "runs/b16")
model = vit_core.from_pretrained("runs/b16", img_size=384)
p = vit_core.calibration.predict(model, images)  # calibrated probabilities, "none of my classes" (p.is_ood)
model = vit_core.from_pretrained("timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")  # or transformers, .npz
vit_core.push_to_hub(model, "me/my-vit")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The submodules the docs and the app use by name (vit_core.calibration.predict, vit_core.explain.attention_rollout,
# vit_core.methods.METHODS, vit_core.data.load_image): bound here, whatever folder holds them.
from . import calibration as calibration
from . import data as data
from . import explain as explain
from .explain import methods as methods
from .io import hub
from .io.checkpoint import save_pretrained
from .io.files import CheckpointError
from .io.hub import push_to_hub
from .models.config import ViTConfig
from .models.model import VisionTransformer
from .models.pos_embed import resample_pos_embed
from .models.variants import get_config, list_models

__version__ = "0.1.0"  # the package's version (pyproject.toml reads it from here)
__all__ = [
    "CheckpointError",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "from_pretrained",
    "get_config",
    "list_models",
    "push_to_hub",
    "resample_pos_embed",
    "save_pretrained",
]


def create_model(name: str | ViTConfig, **overrides: Any) -> VisionTransformer:
    """A freshly initialised model: a registry name (``list_models()``) or a ``ViTConfig``, with
    config fields overridden by keyword (``num_classes=10``, ``img_size=384``, ``global_pool='avg'``...)."""
    cfg = name.replace(**overrides) if isinstance(name, ViTConfig) else get_config(name, **overrides)
    return VisionTransformer(cfg)


def from_pretrained(
    path: str | Path,
    revision: str | None = None,
    token: str | None = None,
    *,
    max_params: int | None = None,
    max_activation_bytes: int | None = None,
    **overrides: Any,
) -> VisionTransformer:
    """Load a ViT, strictly, in eval mode, from the first of: a local checkpoint folder (ours, timm's or
    transformers'), a local original JAX ``.npz``, a Hub repo (``owner/name``, at ``revision``; ``token`` or
    ``HF_TOKEN`` for private ones). ``img_size=...`` loads it at another resolution (position embeddings
    interpolated); other keywords override config fields. The config and the weight file's tensor shapes
    are checked, and the model's size held to ``max_params`` / ``max_activation_bytes`` (defaults in
    ``vit_core.io.checkpoint``), before anything is allocated. See ``vit_core.io.hub``."""
    return hub.from_pretrained(
        path,
        revision=revision,
        token=token,
        max_params=max_params,
        max_activation_bytes=max_activation_bytes,
        **overrides,
    )
