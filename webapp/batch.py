"""Batch mode: many images (files or zip archives) in, one overlay each and a CSV of top-k predictions out.

Uploads are untrusted. Archives are read in memory, never extracted: member paths are only names, so
``../`` entries cannot write anywhere. Only members with an image suffix are read; the number of images and
the bytes read are capped from the archive's directory *and* while reading (a member that inflates past
its declared size is cut off and refused), so a zip bomb costs at most ``MAX_TOTAL_BYTES``. Every image then
goes through ``load_image`` (decompression bombs, corrupt data) like a single upload.
"""

from __future__ import annotations

import csv
import io
import shutil
import tempfile
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
from PIL import Image

from vit_core import VisionTransformer, methods
from vit_core.data import ImageDataError

from . import render
from .analysis import autocast, mirror_mean, read_upload
from .model_info import UNSURE_BELOW, verdict
from .settings import Settings

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff"}
MAX_IMAGES = 64  # images per batch, across all files and archives
MAX_MEMBERS = 10_000  # entries in one archive's directory; more is refused unread
MAX_IMAGE_BYTES = 32 << 20  # one image, compressed size
MAX_TOTAL_BYTES = 256 << 20  # all images of a batch, as read
THUMB = 384  # long side of the gallery's overlays
CHUNK = 16  # images per forward pass
OUT_DIR = Path(tempfile.gettempdir()) / "vit_core_app"  # CSVs, removed after an hour


@dataclass
class Item:
    """One image of a batch, or why it was skipped."""

    name: str
    image: Image.Image | None = None
    error: str | None = None
    probs: torch.Tensor | None = None  # set by classify_batch


def _read_zip(path: Path, budget: list[int], room: int) -> list[Item]:
    """Image members of the archive at ``path``, at most ``room``, charging their bytes to ``budget[0]``."""
    items: list[Item] = []
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        return [Item(path.name, error=f"not a readable zip archive ({e})")]
    with zf:
        members = zf.infolist()
        if len(members) > MAX_MEMBERS:
            return [Item(path.name, error=f"refused: {len(members)} entries (at most {MAX_MEMBERS})")]
        for info in members:
            name = PurePosixPath(info.filename).name
            if info.is_dir() or PurePosixPath(name).suffix.lower() not in IMAGE_SUFFIXES or name.startswith("."):
                continue
            if len(items) == room:
                items.append(Item(f"{path.name}/{name}", error=f"skipped: a batch holds at most {MAX_IMAGES} images"))
                break
            label = f"{path.name}/{info.filename}"
            limit = min(MAX_IMAGE_BYTES, budget[0])
            if info.file_size > limit:
                items.append(Item(label, error=f"skipped: {info.file_size:,} bytes uncompressed (limit {limit:,})"))
                continue
            try:
                with zf.open(info) as f:
                    data = f.read(limit + 1)
            except (RuntimeError, zipfile.BadZipFile, OSError, NotImplementedError) as e:  # encrypted, corrupt
                items.append(Item(label, error=f"cannot read this member ({e})"))
                continue
            if len(data) > limit:
                items.append(Item(label, error="refused: inflates past its declared size"))
                continue
            budget[0] -= len(data)
            items.append(_decode(data, label))
    return items


def _decode(data: bytes, name: str) -> Item:
    buf = io.BytesIO(data)
    buf.name = name  # load_image's messages name their source
    try:
        return Item(name, image=read_upload(buf))
    except ImageDataError as e:
        return Item(name, error=str(e))


def read_uploads(paths: list[str]) -> list[Item]:
    """The images in ``paths`` (image files and zip archives of images), in order, with a reason for each one
    skipped. Raises ``ValueError`` when nothing was uploaded."""
    if not paths:
        raise ValueError("Upload one or more images, or a zip archive of images.")
    items: list[Item] = []
    budget = [MAX_TOTAL_BYTES]
    for p in map(Path, paths):
        room = MAX_IMAGES - sum(i.image is not None for i in items)
        if zipfile.is_zipfile(p):
            items += _read_zip(p, budget, room)
        elif room == 0:
            items.append(Item(p.name, error=f"skipped: a batch holds at most {MAX_IMAGES} images"))
        elif p.stat().st_size > min(MAX_IMAGE_BYTES, budget[0]):
            items.append(Item(p.name, error="skipped: file too large for this batch"))
        else:
            data = p.read_bytes()
            budget[0] -= len(data)
            items.append(_decode(data, p.name))
    return items


def classify_batch(
    model: VisionTransformer, transform, items: list[Item], s: Settings, device: torch.device
) -> list[tuple[Image.Image, str]]:
    """Overlays with captions for the gallery, ``CHUNK`` images per forward pass; sets each item's ``probs``
    (with its mirror's, as the Classify tab: ``mirror_mean``).
    The map is ``s.method`` for each image's predicted class, with the options of ``s`` (raw attention: the
    last layer by default, heads averaged); only ``batchable`` methods: RISE, hundreds of forward passes per
    image, is for the Classify tab."""
    if not s.method.batchable:
        titles = ", ".join(m.title for m in batchable())
        raise ValueError(f"the Batch tab's explanations are {titles}; {s.method.title} is on the Classify tab")
    good = [i for i in items if i.image is not None]
    gallery = []
    names = model.class_names
    for start in range(0, len(good), CHUNK):
        chunk = good[start : start + CHUNK]
        x = torch.stack([transform(i.image) for i in chunk]).to(device)
        with autocast(device):
            logits, maps = s.method.fn(model, x, **s.options(), return_logits=True)
        with torch.no_grad(), autocast(device):
            mirrored = model(x.flip(-1))
        p = mirror_mean(logits, mirrored).cpu()
        for item, pi, heat in zip(chunk, p, maps.float().cpu(), strict=True):
            shown = render.display_copy(item.image, THUMB)
            box = tuple(round(v) for v in transform.crop_box(*shown.size))
            gallery.append((render.map_on_image(shown, box, heat, s.opacity, ""), f"{item.name}: {verdict(pi, names)}"))
            item.probs = pi
    return gallery


def batchable() -> list[methods.Method]:
    """The methods the Batch tab offers: those of the table that map a batch in a few passes."""
    return [m for m in methods.METHODS if m.batchable]


def write_csv(items: list[Item], names: list[str], top_k: int) -> Path:
    """A CSV with one row per upload: the verdict, whether it is unsure, the top-k classes and probabilities,
    or the error. Written to a fresh folder under ``OUT_DIR``; folders older than an hour are removed."""
    OUT_DIR.mkdir(exist_ok=True)
    for old in OUT_DIR.iterdir():
        if old.is_dir() and time.time() - old.stat().st_mtime > 3600:
            shutil.rmtree(old, ignore_errors=True)
    folder = OUT_DIR / uuid.uuid4().hex
    folder.mkdir()
    path = folder / "predictions.csv"
    k = max(1, min(top_k, len(names)))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["file", "prediction", "unsure", *[f"{c}_{r}" for r in range(1, k + 1) for c in ("class", "p")], "error"]
        )
        for item in items:
            p = item.probs
            if p is None:
                w.writerow([item.name, "", "", *[""] * (2 * k), item.error])
                continue
            top = p.topk(k)
            cells = [v for pr, i in zip(top.values, top.indices, strict=True) for v in (names[i], f"{float(pr):.4f}")]
            w.writerow([item.name, verdict(p, names), float(top.values[0]) < UNSURE_BELOW, *cells, ""])
    return path
