"""Checkpoints: ``model.safetensors`` + ``config.json`` in timm's Hub layout, and the one path by which
any checkpoint (ours, timm's, converted from transformers or JAX) becomes a model. No network.

``config.json`` is the file timm writes with ``push_to_hf_hub`` and reads with ``local-dir:`` and
``hf-hub:``: ``architecture`` (a timm model name), ``num_classes``, ``num_features``, ``global_pool``,
``model_args`` (keyword arguments for that architecture), ``label_names`` and ``pretrained_cfg``
(preprocessing). Fields timm has no argument for (the paper's ``representation_size``, ``norm_eps``, the
conv stem) are kept under ``vit_core`` so our loader round-trips them; timm ignores that key.

A calibrated checkpoint (``vit_core.calibration``) also has a ``calibration`` section in ``config.json`` and
``ood.safetensors`` beside it (``calibration_file``); the files' names, errors and safe readers are ``files``'.

Checkpoints come from strangers (Hub repos, uploaded files), so ``load_model`` checks before it
allocates: the config's types and ranges (``ViTConfig``), the model's size against ``SizeLimits``
(parameters, and activation memory at the input size), and every tensor's name and shape as the
weight file's header declares it, all before a tensor is read or a model built. Weights are only ever
read from safetensors here: no pickle is unpickled.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..models.config import TIMM_MODEL_ARGS, ViTConfig
from ..models.cost import activation_bytes, state_shapes
from ..models.model import VisionTransformer
from ..models.variants import get_config, list_models
from .calibration_file import write_config
from .files import CONFIG_NAME, WEIGHTS_NAME, CheckpointError, atomic_write, check_shapes, read_json

_RUNTIME_ONLY_ARGS = {"dynamic_img_size", "dynamic_img_pad", "strict_img_size"}

# Default size limits for loading: ViT-H/14 (632M parameters) and the R50 hybrids at 384 px fit, absurd
# declarations (embed_dim 16384 and depth 64: 206 billion parameters; ViT-H at 2044 px: 900 GB of
# attention maps) do not. Raise them per call (max_params=, max_activation_bytes=) or per process
# (the environment variables) to load bigger models locally.
MAX_PARAMS = 1_000_000_000
MAX_ACTIVATION_BYTES = 4 * 2**30
MAX_PARAMS_ENV = "VIT_CORE_MAX_PARAMS"
MAX_ACTIVATION_BYTES_ENV = "VIT_CORE_MAX_ACTIVATION_BYTES"

Convert = Callable[[Mapping[str, torch.Tensor]], tuple[ViTConfig, dict[str, torch.Tensor]]]


# ------------------------------------------------------------------------------------ config.json


def _architecture(cfg: ViTConfig) -> str:
    """The timm model name that, with ``model_args``, rebuilds ``cfg`` in timm."""
    if cfg.name in list_models():
        return cfg.name
    if cfg.backbone_layers == (3, 4, 9):
        return "vit_base_r50_s16_224"
    if cfg.backbone_layers == (3, 4, 6, 3):
        return "vit_large_r50_s32_224"
    if cfg.backbone_layers is not None:
        raise CheckpointError(f"no timm architecture has ResNet stages {cfg.backbone_layers}")
    # Plain ViTs of any shape rebuild from this name plus model_args. A conv-stem hybrid has no timm
    # architecture: timm builds the transformer and then refuses the stem's weights, naming them.
    return "vit_base_patch16_224"


def config_to_dict(cfg: ViTConfig) -> dict[str, Any]:
    """``cfg`` as a timm ``config.json`` dict."""
    model_args = {k: getattr(cfg, k) for k in TIMM_MODEL_ARGS}
    h, w = cfg.img_hw
    model_args["img_size"] = h if h == w else [h, w]
    if cfg.backbone_layers is not None:
        model_args.pop("patch_size")  # fixed at 1 by timm's hybrid entry points
    return {
        "architecture": _architecture(cfg),
        "num_classes": cfg.num_classes,
        "num_features": cfg.representation_size or cfg.embed_dim,
        "global_pool": cfg.global_pool,
        "model_args": model_args,
        "label_names": list(cfg.label_names) if cfg.label_names else None,
        "pretrained_cfg": cfg.pretrained_cfg(),
        "vit_core": {
            "representation_size": cfg.representation_size,
            "norm_eps": cfg.norm_eps,
            "name": cfg.name,
            "stem_channels": list(cfg.stem_channels) if cfg.stem_channels else None,
            "stem_strides": list(cfg.stem_strides) if cfg.stem_strides else None,
            "stem_pools": list(cfg.stem_pools) if cfg.stem_pools else None,
            "stem_whiten": cfg.stem_whiten,
            "stem_act": cfg.stem_act,
        },
    }


def config_from_dict(d: dict[str, Any], source: str = "config.json") -> ViTConfig:
    """Read a timm-layout ``config.json`` dict (ours, or one timm wrote) into a ``ViTConfig``; anything
    of the wrong type or out of range is a ``CheckpointError`` that names the field."""
    if not isinstance(d, dict):
        raise CheckpointError(f"{source}: expected a JSON object")
    arch = d.get("architecture")
    if arch is None:
        raise CheckpointError(f"{source}: no 'architecture' field; is this a timm/vit_core config?")
    if not isinstance(arch, str) or arch not in list_models():
        raise CheckpointError(f"{source}: architecture {arch!r} is not a ViT this library builds (see list_models())")
    base = get_config(arch)
    model_args, pc, ours = (_section(d, key, source) for key in ("model_args", "pretrained_cfg", "vit_core"))
    args = {k: v for k, v in model_args.items() if k not in _RUNTIME_ONLY_ARGS}
    unknown = sorted(set(args) - set(TIMM_MODEL_ARGS))
    if unknown:
        raise CheckpointError(f"{source}: unsupported model_args {unknown}")
    for key in ("num_classes", "global_pool"):
        if d.get(key) is not None:
            args.setdefault(key, d[key])
    if "input_size" in pc and "img_size" not in args:
        size = pc["input_size"]
        if not isinstance(size, list) or len(size) != 3:
            raise CheckpointError(f"{source}: pretrained_cfg.input_size must be [channels, h, w], got {size!r}")
        args["img_size"] = size[1:]
    args |= {k: pc[k] for k in ("mean", "std", "interpolation", "crop_pct", "crop_mode") if k in pc}
    if "num_classes" not in args and "num_classes" in pc:
        args["num_classes"] = pc["num_classes"]
    args |= {
        k: ours[k]
        for k in (
            "norm_eps",
            "representation_size",
            "stem_channels",
            "stem_strides",
            "stem_pools",
            "stem_whiten",
            "stem_act",
        )
        if ours.get(k)
    }
    args["name"] = ours.get("name", arch)
    labels = d.get("label_names")
    if labels is not None and not isinstance(labels, list):
        raise CheckpointError(f"{source}: label_names must be a list of strings, got {type(labels).__name__}")
    # timm writes the label names of the pre-training dataset even when the head was changed: keep them
    # only when they name this head's classes
    args["label_names"] = labels if labels and len(labels) == args.get("num_classes", base.num_classes) else None
    img = args.get("img_size")
    if isinstance(img, list) and len(img) == 2 and img[0] == img[1] and isinstance(img[0], int):
        args["img_size"] = img[0]
    try:
        return base.replace(**args)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: {e}") from None


def _section(d: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = d.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{source}: {key} must be a JSON object, got {type(value).__name__}")
    return value


def read_config(directory: str | Path) -> ViTConfig:
    """The ``ViTConfig`` of a checkpoint folder's ``config.json`` (ours or timm's)."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_NAME} (expected a folder written by save_pretrained or timm)")
    return config_from_dict(read_json(path), str(path))


# ------------------------------------------------------------------------------------ writing


def save_pretrained(model: VisionTransformer, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``model.safetensors`` and ``config.json`` into ``directory`` (created if needed), and the model's
    calibration when it has one (``write_calibration``).

    ``dtype`` (e.g. ``torch.bfloat16``) stores the floating-point weights at lower precision.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        v = v.detach().to("cpu")
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        state[k] = v.contiguous()
    atomic_write(directory / WEIGHTS_NAME, lambda p: save_file(state, p, metadata={"format": "pt"}))
    write_config(directory, config_to_dict(model.config), model.calibration)
    return directory


# ------------------------------------------------------------------------------------ size limits


@dataclass(frozen=True)
class SizeLimits:
    """The largest model a load may build: parameters (state-dict values) and the activation memory of
    one image at the model's input size (``vit_core.models.cost.activation_bytes``)."""

    max_params: int
    max_activation_bytes: int

    @classmethod
    def resolve(cls, max_params: int | None = None, max_activation_bytes: int | None = None) -> SizeLimits:
        """The limits in force: the arguments, else ``VIT_CORE_MAX_PARAMS`` / ``VIT_CORE_MAX_ACTIVATION_BYTES``
        from the environment, else ``MAX_PARAMS`` / ``MAX_ACTIVATION_BYTES``."""
        return cls(
            _limit(max_params, MAX_PARAMS_ENV, MAX_PARAMS),
            _limit(max_activation_bytes, MAX_ACTIVATION_BYTES_ENV, MAX_ACTIVATION_BYTES),
        )


def _limit(value: int | None, env: str, default: int) -> int:
    if value is not None:
        return int(value)
    text = os.environ.get(env)
    if not text:
        return default
    try:
        return int(float(text))  # "2e9" works as well as "2000000000"
    except ValueError:
        raise ValueError(f"{env}={text!r} is not a number") from None


def check_size(cfg: ViTConfig, limits: SizeLimits | None = None, source: str = "checkpoint") -> None:
    """Refuse (``CheckpointError``) a config whose model exceeds ``limits`` (default: ``SizeLimits.resolve()``),
    from arithmetic on the config alone."""
    limits = limits or SizeLimits.resolve()
    params = sum(math.prod(shape) for shape in state_shapes(cfg).values())
    if params > limits.max_params:
        raise CheckpointError(
            f"{source}: the model has {params:,} parameters, more than the limit of {limits.max_params:,} "
            f"(max_params= or {MAX_PARAMS_ENV} raise it)"
        )
    acts = activation_bytes(cfg)
    if acts > limits.max_activation_bytes:
        h, w = cfg.img_hw
        raise CheckpointError(
            f"{source}: at {h}x{w} px the model needs about {acts / 2**20:,.0f} MiB of activations per image, "
            f"more than the limit of {limits.max_activation_bytes / 2**20:,.0f} MiB "
            f"(max_activation_bytes= or {MAX_ACTIVATION_BYTES_ENV} raise it)"
        )


# ------------------------------------------------------------------------------------ loading


def load_model(
    header: Mapping[str, Sequence[int]],
    read: Callable[[], Mapping[str, torch.Tensor]],
    convert: Convert,
    source: str,
    overrides: Mapping[str, Any] | None = None,
    limits: SizeLimits | None = None,
) -> VisionTransformer:
    """The model a checkpoint holds, strictly loaded, in eval mode: every loader ends here.

    ``header``: the weight file's tensor shapes by name (read without loading). ``read``: its tensors.
    ``convert``: tensors in the file's layout -> (the config they describe, tensors in ours), run first on
    shape-only (meta) tensors and only after every check again on the real ones. ``overrides`` change the
    config before building: ``img_size=384`` loads a 224 checkpoint at 384 (position embeddings
    interpolated), dropout rates and ``drop_path_rate`` for training; fields that would change other
    weight shapes make loading fail clearly.

    Order: config (its types and ranges are checked by ``ViTConfig``), size limits, names and shapes;
    only then are the tensors read and the model built, on the meta device first so that no memory is
    spent on an initialisation the weights overwrite.
    """
    try:
        cfg, shapes = convert({k: torch.empty(tuple(s), device="meta") for k, s in header.items()})
    except CheckpointError:
        raise
    except (KeyError, IndexError, RuntimeError, TypeError, ValueError) as e:  # indexing, reshaping a wrong layout
        raise CheckpointError(f"{source}: tensors not in its format's layout ({type(e).__name__}: {e})") from None
    target = cfg.replace(**overrides) if overrides else cfg
    check_size(target, limits, source)
    expected = state_shapes(target)
    if "pos_embed" in expected:  # the file holds the checkpoint's own grid; the model resizes it on load
        expected["pos_embed"] = (1, cfg.num_prefix_tokens + math.prod(cfg.grid_size), cfg.embed_dim)
    check_shapes({k: tuple(v.shape) for k, v in shapes.items()}, expected, f"{source} does not fit {_name(target)}")

    _, state = convert(read())
    with torch.device("meta"):
        model = VisionTransformer(target)
    dtypes = {k: v.dtype for k, v in model.state_dict().items()}
    for k in list(state):  # the model's own copy, one tensor at a time (peak: one model plus one tensor), in
        # its dtype (fp16, bf16 files) and freshly allocated: readers hand out buffers at any alignment, on
        # which the CPU kernels round differently (logits would not equal the saved model's bit for bit)
        state[k] = state[k].to(dtypes[k], copy=True)
    model.load_state_dict(state, assign=True, pos_embed_grid=cfg.grid_size)
    return model.eval()


def _name(cfg: ViTConfig) -> str:
    return f"the model ({cfg.name})" if cfg.name else "the model its config describes"
