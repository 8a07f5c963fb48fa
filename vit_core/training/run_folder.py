"""A training run's folder: the names of its files, which folders a run may write, and how an epoch's
files are committed so that a kill at any moment leaves a folder that a resume can trust.

    recipe.json        the resolved recipe, written when the run starts
    checkpoint.pt      the full training state after the last finished epoch: the commit record
    model.safetensors  the exported model (its header records the epoch) and
    config.json        its config: ``vit_core.from_pretrained(run)`` loads the pair (a ViT's; a CNN baseline's
                       weights, ``vit_core.models.cnn``, are in checkpoint.pt only)
    metrics.jsonl      one line per epoch
    curves.png         training curves (its text chunk records the epoch)
    ood.safetensors    OOD statistics, written with config.json's calibration by ``python -m train calibrate``

An epoch's files are all written to temporary names (``.<name>.tmp``) first, then renamed into place,
``checkpoint.pt`` first. A kill before that rename leaves the previous epoch's files; a kill between the
renames leaves files that are one epoch behind the checkpoint, which ``stale_files`` tells apart by the
epoch each records, and a resume rewrites them from the checkpoint. ``prepare`` removes the temporary
files a killed run leaves behind. A new run starts only in an empty folder, unless told to overwrite; even
then nothing here deletes a file that a run does not write.

A run is **complete** (``is_complete``) once it holds its weights, its calibration (config.json's section) and
its model card (``README.md``, written last by ``vit_core.finetune.finish_run``): what an app offers to load, so
that a run killed mid-way (its weights and checkpoint written every epoch) is never taken for a finished one.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch
from PIL import Image, PngImagePlugin
from safetensors import safe_open
from safetensors.torch import save as safetensors_bytes

from ..io.calibration_file import OOD_NAME
from ..io.checkpoint import config_to_dict
from ..io.files import CHECKPOINT_NAME, CONFIG_NAME, CURVES_NAME, METRICS_NAME, RECIPE_NAME, WEIGHTS_NAME
from .recipe import RecipeError

if TYPE_CHECKING:
    from ..models.model import VisionTransformer

_WRITTEN = (RECIPE_NAME, CHECKPOINT_NAME, WEIGHTS_NAME, CONFIG_NAME, METRICS_NAME, CURVES_NAME)  # by a run
# What a run writes, ``python -m train eval`` and ``calibrate`` included.
_RUN_FILES = (
    rf"(?:{'|'.join(map(re.escape, (*_WRITTEN, OOD_NAME)))}|eval_[\w-]+\.json|confusion_[\w-]+\.png"
    r"|reliability_[\w-]+\.png)"
)
# Their temporary files: ``.<name>.tmp`` (``commit``) and ``.<name>.<random>.tmp`` (``files.atomic_write``).
_TEMP_FILE = re.compile(rf"\.{_RUN_FILES}\.(?:.*\.)?tmp")

Writer = Callable[[IO[bytes]], Any]


class DiskFullError(OSError):
    """A run or evaluation file could not be written because its disk is full (or over quota)."""


CARD_NAME = "README.md"  # the model card, the last file a finished fine-tune writes


def is_complete(out: Path) -> bool:
    """Whether the run folder ``out`` is finished: its weights, its calibration and its model card are there."""
    if not ((out / WEIGHTS_NAME).is_file() and (out / CARD_NAME).is_file()):
        return False
    try:
        return isinstance(json.loads((out / CONFIG_NAME).read_text()).get("calibration"), dict)
    except (OSError, ValueError, AttributeError):
        return False


def check_out(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a folder a run must not write, with a ``RecipeError`` that says what to do instead.

    Resuming needs ``checkpoint.pt``. A new run takes a missing or empty folder; any folder with something in
    it is refused unless ``overwrite``, whatever it holds: a run (with or without its checkpoint: a copy of
    a model folder holds the same files), or anything else.
    """
    if out.exists() and not out.is_dir():
        raise RecipeError(f"--out {out} is a file, not a folder")
    if resume:
        if not (out / CHECKPOINT_NAME).is_file():
            raise RecipeError(f"{out}: no {CHECKPOINT_NAME} to resume from; start the run without --resume")
        return
    if overwrite or not out.is_dir():
        return
    names = sorted(p.name for p in out.iterdir())
    if CHECKPOINT_NAME in names:
        raise RecipeError(
            f"{out} already holds a run; pass --resume to continue it, --overwrite to start it again, or another --out"
        )
    if names and all(n == RECIPE_NAME or _TEMP_FILE.fullmatch(n) for n in names):
        raise RecipeError(
            f"{out} holds a run that never finished an epoch (nothing to resume); pass --overwrite to start it "
            "again, or choose another --out"
        )
    if names:
        shown = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
        raise RecipeError(
            f"{out} is not empty (it holds {shown}); choose another --out, or pass --overwrite to write a new run "
            "into it (a run's own files are replaced, every other file is kept)"
        )


def prepare(out: Path, *, fresh: bool) -> None:
    """Make ``out`` ready for a run (on the first process, after ``check_out``): create it, remove the
    temporary files a killed run left, and for a ``fresh`` start (``--overwrite``) the files this run
    writes, so that nothing of an earlier run can be taken for this one's. Nothing else is removed: an
    earlier evaluation (``eval_*.json``), or any file a run did not write, stays."""
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if p.is_file() and (_TEMP_FILE.fullmatch(p.name) or (fresh and p.name in _WRITTEN)):
            p.unlink()


def commit(out: Path, files: dict[str, Writer]) -> None:
    """Write ``files`` (name -> function writing the content to an open binary file) into ``out``: every
    file to ``.<name>.tmp`` first, then each renamed into place in the order given, so that none is ever
    half-written. A write that fails (a full disk: ``DiskFullError``) leaves the old files as they were."""
    temps = {name: out / f".{name}.tmp" for name in files}
    try:
        for name, write in files.items():
            with open(temps[name], "wb") as f:
                write(f)
    except BaseException as e:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        if _disk_full(e):
            free = shutil.disk_usage(out).free / 2**20
            raise DiskFullError(f"the disk is full: could not write {out / name} ({free:.1f} MB free on it)") from e
        raise
    for name, tmp in temps.items():
        os.replace(tmp, out / name)


def _disk_full(e: BaseException | None) -> bool:
    """Whether ``e`` or an error it was raised from is ENOSPC / EDQUOT (torch.save wraps it in a RuntimeError)."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        e = e.__cause__ or e.__context__
    return False


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2) + "\n"
    commit(path.parent, {path.name: lambda f: f.write(text.encode())})


def commit_epoch(
    out: Path,
    epoch: int,
    state: dict[str, Any] | None,
    model: VisionTransformer | None,
    history: list[dict],
    curves: Image.Image,
) -> None:
    """Commit the files of ``epoch``: ``checkpoint.pt`` (the training ``state``; None: keep the one there,
    to rewrite the files that are behind it), then the model and its config (None: a CNN baseline, whose
    weights only the checkpoint holds), the metrics and the ``curves``."""
    metrics = "".join(json.dumps(row) + "\n" for row in history)
    png_text = PngImagePlugin.PngInfo()
    png_text.add_text("epoch", str(epoch))
    files: dict[str, Writer] = {} if state is None else {CHECKPOINT_NAME: lambda f: torch.save(state, f)}
    if model is not None:
        weights = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        config = json.dumps(config_to_dict(model.config), indent=2) + "\n"
        files |= {
            WEIGHTS_NAME: lambda f: f.write(safetensors_bytes(weights, metadata={"format": "pt", "epoch": str(epoch)})),
            CONFIG_NAME: lambda f: f.write(config.encode()),
        }
    files |= {
        METRICS_NAME: lambda f: f.write(metrics.encode()),
        CURVES_NAME: lambda f: curves.save(f, format="PNG", pnginfo=png_text),
    }
    commit(out, files)


def stale_files(out: Path, epoch: int, *, weights: bool = True) -> list[str]:
    """The files of ``out`` that do not hold ``epoch`` (the checkpoint's): missing, unreadable, or left one
    epoch behind by a kill between the renames of a commit. ``weights=False``: a run without model files (a
    CNN baseline)."""
    found = {
        METRICS_NAME: _metrics_epoch(out / METRICS_NAME),
        CURVES_NAME: _curves_epoch(out / CURVES_NAME),
    }
    if weights:
        found |= {
            WEIGHTS_NAME: _weights_epoch(out / WEIGHTS_NAME),
            CONFIG_NAME: epoch if (out / CONFIG_NAME).is_file() else None,  # the same every epoch
        }
    return [name for name, e in found.items() if e != epoch]


def _weights_epoch(path: Path) -> int | None:
    try:
        with safe_open(path, "pt") as f:
            return int((f.metadata() or {})["epoch"])
    except Exception:  # missing, torn or from elsewhere: all mean "rewrite it"
        return None


def _metrics_epoch(path: Path) -> int | None:
    try:
        epochs = [json.loads(line)["epoch"] for line in path.read_text().splitlines()]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return epochs[-1] if epochs == list(range(1, len(epochs) + 1)) and epochs else None


def _curves_epoch(path: Path) -> int | None:
    try:
        with Image.open(path) as img:
            return int(img.text["epoch"])
    except Exception:
        return None
