"""What a configuration costs, from the config alone: before anything is downloaded, allocated or run.

- ``state_shapes``: the shape of every weight, which loaders check a checkpoint's header against and count
  its parameters with (``vit_core.io.checkpoint``, the app's ``webapp.registry.sizing``);
- ``activation_bytes``: one explained image's activation memory, held to a limit on loading;
- ``forward_flops``: one image's forward pass, what perturbation explanations cost
  (``vit_core.methods``: RISE runs one per mask).
"""

from __future__ import annotations

import functools
import math

import torch
from torch.utils.flop_counter import FlopCounterMode

from .config import ViTConfig
from .hybrid import ConvStem, ResNetV2Stem
from .model import VisionTransformer


def state_shapes(cfg: ViTConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every entry of ``VisionTransformer(cfg).state_dict()``, from the config alone.

    What loaders check a checkpoint's tensors (read from the file's header) against, and count its size
    with, before anything is built; the tests hold it equal to the real model's for every layout."""
    D, hidden, P = cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio), cfg.patch_size
    s: dict[str, tuple[int, ...]] = {}
    if cfg.class_token:
        s["cls_token"] = (1, 1, D)
    s["pos_embed"] = (1, cfg.num_prefix_tokens + math.prod(cfg.grid_size), D)
    stem = {}
    if cfg.backbone_layers:
        stem = ResNetV2Stem.state_shapes(cfg.backbone_layers, cfg.in_chans)
    elif cfg.stem_channels:
        stem = ConvStem.state_shapes(cfg.stem_channels, cfg.in_chans, cfg.stem_whiten)
    maps = _cnn_feature_maps(cfg)
    in_dim = maps[-1][0] if maps else cfg.in_chans
    s |= {f"patch_embed.backbone.{k}": v for k, v in stem.items()}
    s |= {"patch_embed.proj.weight": (D, in_dim, P, P), "patch_embed.proj.bias": (D,)}
    for i in range(cfg.depth):
        layers = {"attn.qkv": (3 * D, D), "attn.proj": (D, D), "mlp.fc1": (hidden, D), "mlp.fc2": (D, hidden)}
        for name, shape in layers.items():
            s[f"blocks.{i}.{name}.weight"] = shape
            if name != "attn.qkv" or cfg.qkv_bias:
                s[f"blocks.{i}.{name}.bias"] = shape[:1]
        s |= {f"blocks.{i}.{n}.{p}": (D,) for n in ("norm1", "norm2") for p in ("weight", "bias")}
    final_norm = "fc_norm" if cfg.global_pool == "avg" else "norm"
    s |= {f"{final_norm}.weight": (D,), f"{final_norm}.bias": (D,)}
    features = cfg.representation_size or D
    if cfg.representation_size:
        s |= {"pre_logits.fc.weight": (features, D), "pre_logits.fc.bias": (features,)}
    if cfg.num_classes:
        s |= {"head.weight": (cfg.num_classes, features), "head.bias": (cfg.num_classes,)}
    return s


def activation_bytes(cfg: ViTConfig) -> int:
    """Estimated peak float32 memory of one image's forward pass at ``cfg``'s input size, with every
    block's attention probabilities returned (``return_attention=True``, as explanations run it).

    The probabilities of all blocks (depth x heads x T^2), one block's widest intermediates (q, k, v and
    output, the MLP's hidden layer and its activation, scores and probabilities), the image, and for
    hybrids the CNN's largest feature map with its input. An estimate for the size limit on loading
    (``vit_core.io.checkpoint.SizeLimits``), from the config alone."""
    (h, w), heads, D = cfg.img_hw, cfg.num_heads, cfg.embed_dim
    T = cfg.num_prefix_tokens + math.prod(cfg.grid_size)
    block = T * (5 * D + 2 * int(D * cfg.mlp_ratio)) + 2 * heads * T * T
    maps = _cnn_feature_maps(cfg)
    cnn = 2 * max((c * -(-h // stride) * -(-w // stride) for c, stride in maps), default=0)
    return 4 * (cfg.in_chans * h * w + cnn + cfg.depth * heads * T * T + block)


def forward_bytes(cfg: ViTConfig, images: int, attention: bool = True) -> int:
    """Activation memory of a forward pass of ``images`` images: ``activation_bytes`` each, less the stored
    attention probabilities when they are not returned (``attention=False``)."""
    per_image = activation_bytes(cfg)
    if not attention:
        tokens = cfg.num_prefix_tokens + math.prod(cfg.grid_size)
        per_image -= 4 * cfg.depth * cfg.num_heads * tokens * tokens
    return images * per_image


@functools.lru_cache(maxsize=64)
def forward_flops(cfg: ViTConfig) -> int:
    """Floating-point operations of one image's forward pass at ``cfg``'s input size (a multiply-add
    counts 2), counted by PyTorch's ``FlopCounterMode`` on a model built on the meta device: exact for
    the convolutions and matrix products, no weights allocated, no arithmetic run. What perturbation
    explanations (``explain.rise``: one forward pass per mask) cost, from the config alone."""
    with torch.device("meta"):
        model = VisionTransformer(cfg)
        x = torch.empty(1, cfg.in_chans, *cfg.img_hw)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    return counter.get_total_flops()


def _cnn_feature_maps(cfg: ViTConfig) -> list[tuple[int, int]]:
    """(channels, stride) of a hybrid's CNN layers, the last one feeding the patch projection."""
    if cfg.backbone_layers:
        return ResNetV2Stem.feature_maps(cfg.backbone_layers)
    if cfg.stem_channels:
        return ConvStem.feature_maps(cfg.stem_channels, cfg.stem_strides, cfg.stem_pools)
    return []
