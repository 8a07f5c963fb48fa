"""What loading a checkpoint would cost, judged from its config and file sizes before anything large is
downloaded or allocated.

A model is built from its config before its weights are read, so a 1 KB weights file next to a config
declaring ``embed_dim`` 16384 and ``depth`` 64 would allocate 800 GB, and a compressed ``.npz`` can inflate
far beyond its size. Here the declared parameters are counted from the shapes vit_core derives from a
config (no model is built), with vit_core's estimate of one explained image's activation memory; ``.npz``
array sizes are read from their headers, and weight files' sizes from the folder or the Hub's file listing.
``check`` refuses what exceeds the server's per-model limit, and configs that declare far more parameters
than their weights hold.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit_core import ViTConfig
from vit_core.io import hub
from vit_core.io.checkpoint import config_from_dict
from vit_core.io.convert import npz_header, transformers_config
from vit_core.io.files import CONFIG_NAME, WEIGHTS_NAME, CheckpointError
from vit_core.io.hub import CHECKPOINT_FILES, PICKLED_WEIGHTS_NAME
from vit_core.models.cost import activation_bytes, state_shapes

from ..resources import MB
from .access import Choice, ModelError

MAX_CONFIG_BYTES = 8 * 2**20  # ImageNet-21k configs with 21,843 labels are ~1.2 MB


@dataclass(frozen=True)
class Footprint:
    """Declared parameters and the activation memory of one explained image."""

    params: int
    activations: int  # bytes

    @property
    def bytes(self) -> int:
        return 4 * self.params + self.activations  # float32 weights


def vit_footprint(cfg: ViTConfig) -> Footprint:
    """Parameters (and buffers) counted from the state dict's shapes, which vit_core derives from the config
    alone, and vit_core's estimate of one explained image's activation memory."""
    return Footprint(sum(math.prod(shape) for shape in state_shapes(cfg).values()), activation_bytes(cfg))


def config_footprint(d: dict[str, Any]) -> Footprint | None:
    """The footprint a ``config.json`` declares (timm/vit_core or transformers layout); None for other
    layouts, which the loader refuses with its own message."""
    try:
        if "architecture" in d:
            return vit_footprint(config_from_dict(d, CONFIG_NAME))
        if d.get("model_type") == "vit":
            return vit_footprint(transformers_config(d))
    except Exception as e:  # untrusted JSON: wrong types and values fail in many ways, all mean "invalid"
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"its config.json is not a valid ViT configuration ({reason[:200]})") from None
    return None


def npz_footprint(path: Path) -> tuple[Footprint, int]:
    """The footprint of an original JAX ``.npz`` and its arrays' float32 bytes, from the array headers only
    (``vit_core.io.convert.npz_header``: a compressed file can declare gigabytes of zeros in a few kilobytes)."""
    try:
        shapes = npz_header(path)
    except CheckpointError as e:  # refused before any array is read; the message without the server path
        raise ModelError(f"its .npz is refused: {str(e).removeprefix(f'{path}: ')}") from None
    params = sum(math.prod(s) for s in shapes.values())
    return Footprint(params, _npz_activations(shapes)), 4 * params


def _npz_activations(shapes: dict[str, tuple[int, ...]]) -> int:
    """Activation memory of the transformer an npz describes (token grid from the position embeddings,
    widths from the first block); 0 when it is not the layout the converter reads (it then refuses the file)."""

    def shape(suffix: str, ndim: int) -> tuple[int, ...] | None:
        found = next((s for k, s in shapes.items() if k.endswith(suffix)), ())
        return found if len(found) == ndim else None

    pos, query, mlp = shape("pos_embedding", 3), shape("query/kernel", 3), shape("Dense_0/kernel", 2)
    depth = len({m[1] for k in shapes if (m := re.search(r"encoderblock_(\d+)/", k))})
    if pos is None or query is None or mlp is None:
        return 0
    (_, tokens, dim), heads, hidden = pos, query[1], mlp[1]
    try:  # the same transformer on a grid of 1-pixel patches: same tokens, widths and depth
        side = math.isqrt(tokens - 1)
        cfg = ViTConfig(
            img_size=side,
            patch_size=1,
            embed_dim=dim,
            depth=depth,
            num_heads=heads,
            mlp_ratio=hidden / dim,
            num_classes=0,
        )
    except (ValueError, TypeError, ZeroDivisionError):
        return 0
    return activation_bytes(cfg)


# ------------------------------------------------------------------------------------ the files


@dataclass(frozen=True)
class Files:
    """A checkpoint's files: name -> size in bytes, and a way to get a small one's local path."""

    sizes: dict[str, int]
    path: Callable[[str], Path]


def files_of(choice: Choice) -> Files | None:
    """The files of a local checkpoint, or of a Hub repo (``vit_core.io.hub.file_sizes``: its file listing, or the
    local cache when offline). None when the Hub says the repo or revision does not exist or is gated: the
    loader says which."""
    if choice.local:
        source = Path(choice.source)
        if source.is_file():
            return Files({source.name: source.stat().st_size}, lambda name: source)
        if not source.is_dir():
            return None  # gone since it was chosen: the loader says so
        found = [p for p in source.iterdir() if p.name in CHECKPOINT_FILES or p.suffix == ".npz"]
        return Files({p.name: p.stat().st_size for p in found if p.is_file()}, lambda name: source / name)
    owner, name, *rest = choice.source.split("/", 2)
    repo, filename = f"{owner}/{name}", rest[0] if rest else None
    try:
        sizes = hub.file_sizes(repo, choice.revision, filename)
    except hub.HubError:  # network or server trouble: nothing is loaded unchecked
        raise ModelError("the Hub did not answer with the repo's file list; try again later") from None
    if sizes is None:
        return None
    return Files(sizes, lambda name: hub.download(repo, name, choice.revision))


def check(choice: Choice, limit: int) -> Footprint | None:
    """Refuse (ModelError) a checkpoint whose weights or declared model exceed ``limit`` bytes, or whose
    config declares more than twice the parameters its weights file can hold (less than 2 bytes each);
    return its footprint when known."""
    files = files_of(choice)
    if files is None:
        return None
    sizes = files.sizes
    npz = [n for n in sizes if n.endswith(".npz")]
    if CONFIG_NAME in sizes:
        if sizes[CONFIG_NAME] > MAX_CONFIG_BYTES:
            raise ModelError(f"its config.json is {sizes[CONFIG_NAME] / MB:.0f} MB, too large for a ViT config")
        weights = next((n for n in (WEIGHTS_NAME, PICKLED_WEIGHTS_NAME) if n in sizes), None)
        weight_bytes = sizes[weights] if weights else None
        _check_weights(weight_bytes, limit)
        footprint = _config_file_footprint(files)
    elif len(npz) == 1:
        _check_weights(sizes[npz[0]], limit)  # before downloading it
        footprint, weight_bytes = npz_footprint(files.path(npz[0]))
        _check_weights(weight_bytes, limit)  # what it inflates to
    else:
        return None  # nothing the loader reads: it says so
    if footprint is None:
        return None
    if footprint.bytes > limit:
        raise ModelError(
            f"it declares {footprint.params:,} parameters, about {footprint.bytes / MB:,.0f} MB with the memory "
            f"one explanation needs; this server loads at most {limit / MB:,.0f} MB"
        )
    if weight_bytes is not None and weight_bytes < 2 * footprint.params:
        raise ModelError(
            f"its config declares {footprint.params:,} parameters but its weights file holds only "
            f"{weight_bytes / MB:,.1f} MB: the two do not belong together"
        )
    return footprint


def _check_weights(size: int | None, limit: int) -> None:
    if size is not None and size > limit:
        raise ModelError(f"its weights are {size / MB:,.0f} MB; this server loads at most {limit / MB:,.0f} MB")


def _config_file_footprint(files: Files) -> Footprint | None:
    try:
        path = files.path(CONFIG_NAME)
    except Exception:  # listed but not downloadable: nothing is loaded unchecked
        raise ModelError("its config.json could not be downloaded; try again later") from None
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the loader reports unreadable or invalid JSON
    return config_footprint(d) if isinstance(d, dict) else None
