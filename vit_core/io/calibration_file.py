"""A calibration stored with its checkpoint: the ``calibration`` section of ``config.json`` (temperature, and the
OOD score, threshold and file) and ``ood.safetensors`` beside it holding the OOD score's statistics of training
images, linked by its SHA-256; timm ignores both. Read back, the section and the file are checked against the
model (the score's name in ``ood.SCORES``, its statistics' names and shapes, the file's size and SHA-256) before
any tensor is used.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load as load_bytes
from safetensors.torch import save as safetensors_bytes

from ..calibration import Calibration, to_json
from ..calibration.ood import CLASSES, FEATURES, ONE, RESIDUAL, SCORES, OODDetector
from .files import CONFIG_NAME, CheckpointError, atomic_write, check_shapes, read_header, read_json

if TYPE_CHECKING:
    from ..models.model import VisionTransformer

OOD_NAME = "ood.safetensors"
MAX_OOD_ROWS = 1_000_000  # training images' features in a statistic (a kNN bank's rows)
MAX_OOD_BYTES = 512 * 2**20  # an OOD statistics file: a bank of 10,000 x 192 features in fp16 is 3.8 MB


def statistics_shapes(
    score: str, classes: int, features: int, found: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int | str, ...]]:
    """The shapes ``score``'s statistics must have (``ood.Score.statistics``) for a model of ``classes`` and
    ``features``: a count of training images is read from ``found`` (the file's header) where it lies in 1 ..
    ``MAX_OOD_ROWS``, else named as that range (it then appears in the error)."""
    sizes: dict[str, int] = {CLASSES: classes, FEATURES: features, RESIDUAL: features - features // 2, ONE: 1}
    shapes = {}
    for name, dims in SCORES[score].statistics.items():
        got, shape = found.get(name, ()), []
        for i, d in enumerate(dims):
            if d in sizes:
                shape.append(sizes[d])
            elif len(got) == len(dims) and 1 <= got[i] <= MAX_OOD_ROWS:
                shape.append(got[i])
            else:
                shape.append(f"1..{MAX_OOD_ROWS:,}")  # no count the file may hold: named in the error only
        shapes[name] = tuple(shape)
    return shapes


def write_calibration(directory: str | Path, calibration: Calibration | None) -> None:
    """Store ``calibration`` with the checkpoint in ``directory``: the "calibration" section of its
    ``config.json`` (removed for None; the rest of the file is kept) and ``ood.safetensors``. The weights
    are not touched."""
    directory = Path(directory)
    write_config(directory, read_json(directory / CONFIG_NAME), calibration)


def write_config(directory: Path, d: dict[str, Any], calibration: Calibration | None) -> None:
    """``config.json`` from the dict ``d`` with ``calibration``'s section (none for None), and its statistics
    in ``ood.safetensors`` first."""
    d = {k: v for k, v in d.items() if k != "calibration"}
    if calibration is not None:
        sha256 = None
        if calibration.ood is not None and calibration.ood.statistics:
            stats = {k: v.detach().to("cpu").contiguous() for k, v in calibration.ood.statistics.items()}
            data = safetensors_bytes(stats, metadata={"score": calibration.ood.score})
            sha256 = hashlib.sha256(data).hexdigest()
            # the statistics first, then the config naming their SHA-256: a crash in between leaves a pair the
            # loader refuses (the SHA-256 differs), never one it misreads
            atomic_write(directory / OOD_NAME, lambda p: Path(p).write_bytes(data))
        d["calibration"] = to_json(calibration, OOD_NAME, sha256)
    text = json.dumps(d, indent=2) + "\n"
    atomic_write(directory / CONFIG_NAME, lambda p: Path(p).write_text(text))


def read_calibration(
    d: dict[str, Any], fetch: Callable[..., Path | None], source: str, model: VisionTransformer
) -> Calibration | None:
    """The ``Calibration`` a ``config.json`` dict ``d`` declares (None when it has none), its OOD statistics
    read with ``fetch(OOD_NAME)`` and checked against ``model`` (names, shapes, SHA-256) before use."""
    where = f"{source}/{CONFIG_NAME}: calibration"
    section = d.get("calibration")
    if section is None:
        return None
    if not isinstance(section, dict):
        raise CheckpointError(f"{where} must be a JSON object, got {type(section).__name__}")
    ood = section.get("ood")
    detector = None
    if ood is not None:
        if not isinstance(ood, dict):
            raise CheckpointError(f"{where}.ood must be a JSON object, got {type(ood).__name__}")
        score = ood.get("score")
        if not isinstance(score, str) or score not in SCORES:
            raise CheckpointError(f"{where}.ood.score must be one of {', '.join(SCORES)}, got {score!r}")
        statistics = _read_ood_statistics(ood, score, fetch, source, model) if SCORES[score].statistics else {}
        try:
            q = ood.get("held_out_quantiles")  # absent from files written before they were stored
            q = tuple(q) if isinstance(q, list) else q
            detector = OODDetector(
                score, ood.get("threshold"), ood.get("keep"), statistics, ood.get("fitted_on") or "", q
            )
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{where}.ood: {e}") from None
    try:
        return Calibration(section.get("temperature"), section.get("tta"), section.get("fitted_on") or "", detector)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: {e}") from None


def _read_ood_statistics(
    ood: dict[str, Any], score: str, fetch: Callable[..., Path | None], source: str, model: VisionTransformer
) -> dict[str, torch.Tensor]:
    if ood.get("file", OOD_NAME) != OOD_NAME:  # a fixed name: a config never chooses which file is read
        raise CheckpointError(f"{source}/{CONFIG_NAME}: calibration.ood.file must be {OOD_NAME!r}")
    path = fetch(OOD_NAME)
    header = read_header(path)
    expected = statistics_shapes(score, model.config.num_classes, model.num_features, header)
    check_shapes(header, expected, f"{path} does not fit the {score} score of this model")
    if Path(path).stat().st_size > MAX_OOD_BYTES:
        raise CheckpointError(
            f"{path}: {Path(path).stat().st_size:,} bytes, more than {MAX_OOD_BYTES:,} for OOD statistics"
        )
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != ood.get("sha256"):
        raise CheckpointError(
            f"{path} is not the file config.json was calibrated with (SHA-256 differs); calibrate again"
        )
    tensors = load_bytes(data)
    if not all(t.is_floating_point() for t in tensors.values()):
        raise CheckpointError(f"{path}: OOD statistics must be floating-point tensors")
    return tensors
