"""Weights published in other layouts, converted to ours (timm's key names). No network, no pickle.

- **Hugging Face transformers** (``ViTForImageClassification``, ``ViTModel``: ``config.json`` with
  ``model_type: "vit"``, keys like ``vit.encoder.layer.0.attention.attention.query.weight``): separate
  query/key/value projections are concatenated into our fused ``qkv`` (rows in q, k, v order, as the
  paper's [U_q U_k U_v] of eq. 5). ``ViTModel``'s pooler (dense + tanh on the class token) is exactly the
  paper's pre-training head, so it becomes ``pre_logits`` (``representation_size``). transformers builds
  its LayerNorms with eps 1e-12 where timm and the JAX code use 1e-6; the converted config keeps
  transformers' ``layer_norm_eps`` (``norm_eps``), so logits are identical to transformers'.
- **Original JAX ``.npz``** of google-research/vision_transformer (``ViT-B_16.npz``, ``R50+ViT-B_16.npz``,
  the AugReg files): Flax names (``Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel``,
  ``embedding/kernel``, ``cls``, ``head/kernel``, hybrid ``conv_root``, ``block1/unit1/conv1/kernel``...)
  with kernels stored (in, out) or (h, w, in, out). The architecture is read from the arrays' shapes.

The converters are plain tensor reshuffles, so ``vit_core.io.checkpoint.load_model`` runs them first on
shape-only (meta) tensors made from the files' headers: a file whose arrays do not form the ViT its
config declares is refused before any array is read.
"""

from __future__ import annotations

import math
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.transforms import PIL_RESAMPLE
from ..models.config import ViTConfig
from ..models.model import VisionTransformer
from ..models.variants import get_config, list_models
from .checkpoint import SizeLimits, load_model
from .files import CheckpointError

PREPROCESSOR_NAME = "preprocessor_config.json"  # transformers' image processor settings
MAX_NPZ_ARRAYS = 10_000  # ViT-H/14 has about 400, R50+ViT-L/32 about 600

# PIL resampling codes, as transformers' image processors store them, for the filters vit_core.data
# applies; the others (1 lanczos, 4 box, 5 hamming) fall back to bilinear, transformers' default.
_RESAMPLE_NAMES = {int(code): name for name, code in PIL_RESAMPLE.items()}
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _registry_name(cfg: ViTConfig) -> str | None:
    """The registered variant with the same architecture, so config.json names a real timm model."""

    def shape(c: ViTConfig) -> tuple:
        return c.embed_dim, c.depth, c.num_heads, c.mlp_ratio, c.patch_size, c.img_hw, c.backbone_layers

    return next((n for n in list_models() if shape(get_config(n)) == shape(cfg)), None)


# ------------------------------------------------------------------------------- transformers


def check_transformers_config(d: dict[str, Any], source: str = "config.json") -> None:
    """Fail fast (before any weights are fetched) on transformers configs that are not a plain ViT."""
    if d.get("model_type") != "vit":
        raise CheckpointError(
            f"{source}: model_type {d.get('model_type')!r} is not a Vision Transformer "
            "(only transformers' plain ViT, model_type 'vit', converts to this library)"
        )
    if d.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{source}: hidden_act {d['hidden_act']!r} is not supported (ViT uses exact 'gelu')")


def transformers_config(
    d: dict[str, Any], preprocessor: dict[str, Any] | None = None, source: str = "config.json"
) -> ViTConfig:
    """The ViT a transformers ``config.json`` declares, before its weights are seen: the head from
    ``id2label`` (the weights decide in ``convert_transformers``). ``preprocessor``
    (``preprocessor_config.json``) supplies mean, std and resampling when given."""
    check_transformers_config(d, source)

    def integer(key: str, default: int | None = None) -> int:
        value = d.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(f"{source}: {key} must be a positive integer, got {value!r}")
        return value

    D, channels, labels = integer("hidden_size"), integer("num_channels", 3), d.get("id2label") or {}
    if not isinstance(labels, dict):
        raise CheckpointError(f"{source}: id2label must be a JSON object, got {type(labels).__name__}")
    fields: dict[str, Any] = dict(
        img_size=d.get("image_size", 224),
        patch_size=integer("patch_size", 16),
        in_chans=channels,
        num_classes=len(labels),
        embed_dim=D,
        depth=integer("num_hidden_layers"),
        num_heads=integer("num_attention_heads"),
        mlp_ratio=integer("intermediate_size") / D,
        qkv_bias=d.get("qkv_bias", True),
        crop_pct=1.0,  # ViTImageProcessor resizes straight to the input size (any aspect), no centre crop
        crop_mode="squash",
        norm_eps=d.get("layer_norm_eps", 1e-12),
        mean=(0.5,) * channels,
        std=(0.5,) * channels,
    )
    if preprocessor:
        if preprocessor.get("do_normalize", True):
            fields["mean"] = preprocessor.get("image_mean", fields["mean"])
            fields["std"] = preprocessor.get("image_std", fields["std"])
        else:
            fields["mean"], fields["std"] = (0.0,) * channels, (1.0,) * channels
        resample = preprocessor.get("resample")
        fields["interpolation"] = _RESAMPLE_NAMES.get(resample, "bilinear") if isinstance(resample, int) else "bilinear"
    try:
        return ViTConfig(**fields)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None


def convert_transformers(
    d: dict[str, Any],
    state: Mapping[str, torch.Tensor],
    preprocessor: dict[str, Any] | None = None,
    source: str = "transformers checkpoint",
) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """A transformers ViT (``config.json`` dict ``d`` and its state dict) as our config and state dict.

    The head is read from the weights: ``classifier`` (``ViTForImageClassification``) gives the class
    count, ``pooler`` (``ViTModel``) a ``representation_size`` pre-logits layer and no classifier.
    """
    cfg = transformers_config(d, preprocessor, source)
    pre = "vit." if any(k.startswith("vit.") for k in state) else ""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in state:
            raise CheckpointError(f"{source}: missing weight {key!r} (is this a ViT saved by transformers?)")
        used.add(key)
        return state[key]

    out["cls_token"] = take(f"{pre}embeddings.cls_token")
    out["pos_embed"] = take(f"{pre}embeddings.position_embeddings")
    for p in ("weight", "bias"):
        out[f"patch_embed.proj.{p}"] = take(f"{pre}embeddings.patch_embeddings.projection.{p}")
    qkv_bias = f"{pre}encoder.layer.0.attention.attention.query.bias" in state
    for i in range(cfg.depth):
        src, dst = f"{pre}encoder.layer.{i}.", f"blocks.{i}."
        att = f"{src}attention.attention."
        out[f"{dst}attn.qkv.weight"] = torch.cat([take(f"{att}{n}.weight") for n in ("query", "key", "value")])
        if qkv_bias:
            out[f"{dst}attn.qkv.bias"] = torch.cat([take(f"{att}{n}.bias") for n in ("query", "key", "value")])
        for ours, theirs in (
            ("norm1", "layernorm_before"),
            ("attn.proj", "attention.output.dense"),
            ("norm2", "layernorm_after"),
            ("mlp.fc1", "intermediate.dense"),
            ("mlp.fc2", "output.dense"),
        ):
            for p in ("weight", "bias"):
                out[f"{dst}{ours}.{p}"] = take(f"{src}{theirs}.{p}")
    for p in ("weight", "bias"):
        out[f"norm.{p}"] = take(f"{pre}layernorm.{p}")
    representation_size = None
    if "pooler.dense.weight" in state or f"{pre}pooler.dense.weight" in state:
        pooler = "pooler.dense" if "pooler.dense.weight" in state else f"{pre}pooler.dense"
        if d.get("pooler_act", "tanh") != "tanh":
            raise CheckpointError(f"{source}: pooler_act {d['pooler_act']!r} is not supported (the paper's is tanh)")
        for p in ("weight", "bias"):
            out[f"pre_logits.fc.{p}"] = take(f"{pooler}.{p}")
        representation_size = out["pre_logits.fc.weight"].shape[0]
    num_classes = 0
    if "classifier.weight" in state:
        out["head.weight"], out["head.bias"] = take("classifier.weight"), take("classifier.bias")
        num_classes = out["head.weight"].shape[0]
    used.add(f"{pre}embeddings.mask_token")  # only for masked image modelling, never in the forward pass
    left = sorted(set(state) - used)
    if left:
        raise CheckpointError(f"{source}: weights this converter does not know ({len(left)}): {', '.join(left[:8])}")

    labels = None
    id2label = d.get("id2label") or {}
    if num_classes and len(id2label) == num_classes:
        names = [str(id2label.get(str(i), id2label.get(i, ""))) for i in range(num_classes)]
        if names != [f"LABEL_{i}" for i in range(num_classes)]:  # transformers' placeholder names
            labels = tuple(names)
    try:
        cfg = cfg.replace(
            num_classes=num_classes, qkv_bias=qkv_bias, representation_size=representation_size, label_names=labels
        )
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return cfg.replace(name=_registry_name(cfg)), out


# ------------------------------------------------------------------------------- JAX .npz


def _t(a: torch.Tensor) -> torch.Tensor:
    """A Flax kernel as a PyTorch weight: (in, out) -> (out, in); (h, w, in, out) -> (out, in, h, w)."""
    return a.permute(3, 2, 0, 1) if a.ndim == 4 else a.T if a.ndim == 2 else a


def convert_npz(w: Mapping[str, torch.Tensor], source: str = "npz") -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """An original JAX checkpoint (float32 tensors by Flax name) as our config and state dict.

    Everything is inferred from the arrays' shapes: width, depth, heads and MLP ratio from the first
    encoder block, patch size and channels from ``embedding/kernel``, the token grid (hence image size)
    from the position embeddings, ResNet stage depths of hybrids from ``block{i}/unit{j}``, the class
    count from ``head`` and ``representation_size`` from ``pre_logits`` (the paper's pre-training head,
    kept in the ImageNet-21k files).
    """
    prefix = "opt/target/" if "opt/target/embedding/kernel" in w else ""
    if f"{prefix}embedding/kernel" not in w:
        sample = ", ".join(sorted(w)[:6])
        hint = " (big_vision layout, e.g. SigLIP, is not supported)" if "params/embedding/kernel" in w else ""
        raise CheckpointError(f"{source}: no 'embedding/kernel': not a google-research ViT .npz{hint}; keys: {sample}")
    a = {k[len(prefix) :]: v for k, v in w.items() if k.startswith(prefix)}
    if "cls" not in a:
        raise CheckpointError(
            f"{source}: no class token: global-average-pooled JAX checkpoints apply the final norm before "
            "pooling, a layout this library (and timm) does not build"
        )
    depth = len({m.group(1) for k in a if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    if depth == 0:
        raise CheckpointError(f"{source}: no 'Transformer/encoderblock_N' arrays")
    mha, mlp = "MultiHeadDotProductAttention_1", "MlpBlock_3"
    b0 = "Transformer/encoderblock_0/"
    embed = a["embedding/kernel"]  # (P, P, C_in, D)
    hybrid = "conv_root/kernel" in a
    layers = []
    while hybrid and f"block{len(layers) + 1}/unit1/conv1/kernel" in a:
        i = len(layers) + 1
        layers.append(sum(1 for k in a if re.fullmatch(rf"block{i}/unit\d+/conv1/kernel", k)))
    if hybrid and not layers:
        raise CheckpointError(f"{source}: a hybrid with a stem but no ResNet stages is not supported")
    pos = a["Transformer/posembed_input/pos_embedding"]  # (1, 1 + N, D)
    side = math.isqrt(pos.shape[1] - 1)
    if side * side != pos.shape[1] - 1:
        raise CheckpointError(f"{source}: {pos.shape[1] - 1} position embeddings do not form a square grid")
    head, pre_logits = a.get("head/kernel"), a.get("pre_logits/kernel")
    in_chans = a["conv_root/kernel"].shape[2] if hybrid else embed.shape[2]
    D = embed.shape[-1]
    try:
        cfg = ViTConfig(
            img_size=embed.shape[0],  # one token, for now: feature_stride below gives the pixels per token
            patch_size=embed.shape[0],
            in_chans=in_chans,
            num_classes=head.shape[1] if head is not None else 0,
            embed_dim=D,
            depth=depth,
            num_heads=a[f"{b0}{mha}/query/kernel"].shape[1],  # (D, heads, head_dim)
            mlp_ratio=a[f"{b0}{mlp}/Dense_0/kernel"].shape[1] / D,
            qkv_bias=f"{b0}{mha}/query/bias" in a,
            representation_size=pre_logits.shape[1] if pre_logits is not None else None,
            backbone_layers=tuple(layers) or None,
            # The original input pipeline scales pixels to [-1, 1].
            mean=(0.5,) * in_chans,
            std=(0.5,) * in_chans,
        )
        cfg = cfg.replace(img_size=side * cfg.feature_stride)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None
    cfg = cfg.replace(name=_registry_name(cfg))

    s: dict[str, torch.Tensor] = {}
    s["patch_embed.proj.weight"] = _t(a["embedding/kernel"])
    s["patch_embed.proj.bias"] = a["embedding/bias"]
    s["cls_token"] = a["cls"]
    s["pos_embed"] = pos
    if hybrid:
        bb = "patch_embed.backbone."
        s[f"{bb}stem.conv.weight"] = _t(a["conv_root/kernel"])
        s[f"{bb}stem.norm.weight"], s[f"{bb}stem.norm.bias"] = a["gn_root/scale"], a["gn_root/bias"]
        for i, n_units in enumerate(layers):
            for j in range(n_units):
                src, dst = f"block{i + 1}/unit{j + 1}/", f"{bb}stages.{i}.blocks.{j}."
                for r in (1, 2, 3):
                    s[f"{dst}conv{r}.weight"] = _t(a[f"{src}conv{r}/kernel"])
                    s[f"{dst}norm{r}.weight"] = a[f"{src}gn{r}/scale"]
                    s[f"{dst}norm{r}.bias"] = a[f"{src}gn{r}/bias"]
                if f"{src}conv_proj/kernel" in a:
                    s[f"{dst}downsample.conv.weight"] = _t(a[f"{src}conv_proj/kernel"])
                    s[f"{dst}downsample.norm.weight"] = a[f"{src}gn_proj/scale"]
                    s[f"{dst}downsample.norm.bias"] = a[f"{src}gn_proj/bias"]
    for i in range(depth):
        src, dst = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        att = f"{src}{mha}/"
        # query/key/value kernels are (D, heads, head_dim): one (D, D) matrix each, fused in q, k, v order.
        qkv = ("query", "key", "value")
        s[f"{dst}attn.qkv.weight"] = torch.cat([a[f"{att}{n}/kernel"].flatten(1).T for n in qkv])
        if cfg.qkv_bias:
            s[f"{dst}attn.qkv.bias"] = torch.cat([a[f"{att}{n}/bias"].flatten() for n in qkv])
        s[f"{dst}attn.proj.weight"] = a[f"{att}out/kernel"].flatten(0, 1).T  # (heads, head_dim, D)
        s[f"{dst}attn.proj.bias"] = a[f"{att}out/bias"]
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            s[f"{dst}{ours}.weight"] = a[f"{src}{theirs}/scale"]
            s[f"{dst}{ours}.bias"] = a[f"{src}{theirs}/bias"]
        for r in (0, 1):
            s[f"{dst}mlp.fc{r + 1}.weight"] = _t(a[f"{src}{mlp}/Dense_{r}/kernel"])
            s[f"{dst}mlp.fc{r + 1}.bias"] = a[f"{src}{mlp}/Dense_{r}/bias"]
    s["norm.weight"], s["norm.bias"] = a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"]
    if pre_logits is not None:
        s["pre_logits.fc.weight"], s["pre_logits.fc.bias"] = _t(pre_logits), a["pre_logits/bias"]
    if head is not None:
        s["head.weight"], s["head.bias"] = _t(head), a["head/bias"]
    return cfg, {k: v.contiguous() for k, v in s.items()}


def npz_header(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every array in an ``.npz``, from the ``.npy`` headers alone: no array is read (a
    compressed file can declare gigabytes of zeros in a few kilobytes). Arrays that need pickle (object
    dtypes), that are not numbers, or whose data is shorter than declared are refused."""
    path = Path(path)
    shapes = {}
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
            if len(members) > MAX_NPZ_ARRAYS:
                raise CheckpointError(f"{path}: {len(members):,} arrays, more than any ViT has")
            for info in members:
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    if version not in _NPY_HEADERS or not info.filename.endswith(".npy"):
                        raise ValueError(f"{info.filename} is not a .npy array of a supported version")
                    shape, _, dtype = _NPY_HEADERS[version](f)
                    if dtype.kind not in "biuf":
                        raise ValueError(f"{info.filename} holds {dtype} values, not numbers")
                    if f.tell() + math.prod(shape) * dtype.itemsize > info.file_size:
                        raise ValueError(f"{info.filename} is shorter than its declared shape {shape}")
                shapes[info.filename.removesuffix(".npy")] = tuple(shape)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{path}: not a readable .npz of arrays ({e})") from None
    return shapes


def read_npz(path: str | Path) -> dict[str, torch.Tensor]:
    """Every array of an ``.npz`` as a float32 tensor, read with ``allow_pickle=False``."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: torch.from_numpy(np.asarray(f[k], dtype=np.float32)) for k in f.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{path}: not a readable .npz of arrays ({e})") from None


def load_npz(path: str | Path, *, limits: SizeLimits | None = None, **overrides: Any) -> VisionTransformer:
    """Load an original JAX ``.npz`` (``ViT-B_16.npz``, ``R50+ViT-B_16.npz``...) as a model, its arrays'
    headers checked before any array is read (``vit_core.io.checkpoint.load_model``)."""
    path, source = Path(path), str(path)
    return load_model(
        npz_header(path), lambda: read_npz(path), lambda a: convert_npz(a, source), source, overrides, limits
    )
