"""A checkpoint's files, read and written safely: their names (and those of the training run folder that holds
one, which the model card reads and ``training.run_folder`` writes), ``CheckpointError``, JSON objects of bounded size,
safetensors headers read before any tensor, shapes checked against what a model expects, and atomic writes (temp
file + rename). ``checkpoint`` and ``calibration_file`` build on these; no torch module is built here.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
RECIPE_NAME = "recipe.json"  # a run folder's: the resolved recipe
CHECKPOINT_NAME = "checkpoint.pt"  # the full training state after the last finished epoch
METRICS_NAME = "metrics.jsonl"  # one line per epoch
CURVES_NAME = "curves.png"  # training curves
MAX_JSON_BYTES = 16 * 2**20  # configs with ImageNet-21k's 21,843 label names are about 1.2 MB


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: the message says which file and what is wrong."""


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from a checkpoint's folder (``config.json``, ``preprocessor_config.json``)."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            raise CheckpointError(f"{path}: {path.stat().st_size:,} bytes, too large for a config file")
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: no {path.name}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: not valid JSON (nested too deeply)") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return d


def atomic_write(path: Path, write: Callable[[str], object]) -> None:
    """Write via a temp file in the same folder and rename, so a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it a normal file's mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_header(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a safetensors file, from its header alone: no tensor is read.
    (safetensors also checks that the declared tensors exactly cover the file.)"""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: no {path.name}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (a handle, not a dict)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file."""
    path = Path(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def check_shapes(got: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]], what: str) -> None:
    """One ``CheckpointError`` line naming every missing, unexpected and mis-shaped tensor, if any."""
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    mismatched = [f"{k}: checkpoint {got[k]} vs model {v}" for k, v in expected.items() if k in got and got[k] != v]
    parts = []
    for kind, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mismatched)):
        if items:
            parts.append(f"{kind} ({len(items)}): {', '.join(items[:10])}{' ...' if len(items) > 10 else ''}")
    if parts:
        raise CheckpointError(f"{what}: {'; '.join(parts)}")
