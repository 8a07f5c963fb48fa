"""Batch mode: many images (files or zip archives) in, one overlay each and a CSV of top-k predictions out.

Uploads are untrusted. Archives are read in memory, never extracted: member paths are only names, so
``../`` entries cannot write anywhere. An archive's entry count and directory size are read from its
end-of-central-directory record first, so a zip declaring a million entries is refused without reading its
directory; the archives of one batch share one budget of entries and directory bytes, and a file listed twice
is read once, so one request parses at most one full-size directory (a zip listed 200 times held the only
compute slot for 142 s). Only members with an image suffix are read; the number of images and the bytes read are capped
from the archive's directory *and* while reading (a member that inflates past its declared size is cut off
and refused), so a zip bomb costs at most ``MAX_TOTAL_BYTES``.

Images are then decoded, classified and let go one at a time (``classify_batch``): each goes through
``load_image`` (decompression bombs, corrupt data) like a single upload, decoded reduced to what the model
and the gallery's overlay need (``THUMB``), its decoding cost read from its header first: at most
``MAX_DECODE_BYTES`` for one image, and ``MAX_DECODED_PIXELS`` for the whole batch. Only the small results
stay: the overlays, the probabilities and the model inputs of one chunk (``chunk_size``).
"""

from __future__ import annotations

import csv
import io
import shutil
import struct
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
from PIL import Image

from vit_core import VisionTransformer, methods
from vit_core.calibration import predict
from vit_core.data import ImageDataError, ImageTransform, load_image

from . import render
from .analysis import MAX_PIXELS, autocast, needed_side, read_upload_header
from .model_info import UNSURE_BELOW, verdict
from .settings import Settings

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff"}
MAX_IMAGES = 64  # images per batch, across all files and archives
MAX_FILES = 256  # files in one request (``webapp.payloads`` refuses more before Gradio touches them)
MAX_MEMBERS = 10_000  # archive entries per batch, all archives together; more is refused unread
MAX_DIRECTORY_BYTES = 8 << 20  # archive directories per batch, together (about 300 bytes an entry at most)
MAX_IMAGE_BYTES = 32 << 20  # one image, compressed size
MAX_TOTAL_BYTES = 256 << 20  # all images of a batch, as read
MAX_DECODED_PIXELS = 400_000_000  # pixels decoded per batch: eight 50 MP PNGs, or hundreds of reduced JPEGs
MAX_DECODE_BYTES = 256 << 20  # memory decoding one image may take (``ImageHeader.decode_bytes``): a 50 MP RGB PNG
THUMB = 384  # long side of the gallery's overlays
CHUNK = 16  # images per forward pass
GRADIENT_CHUNK = 4  # per forward and backward pass: ViT-B/16 keeps about 180 MB an image for its backward pass
OUT_DIR = Path(tempfile.gettempdir()) / "vit_core_app"  # CSVs, removed after an hour
_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")


@dataclass
class Item:
    """One upload of a batch (an image file or an archive's member): its probabilities, or why it was skipped."""

    name: str
    error: str | None = None
    probs: torch.Tensor | None = None  # set by classify_batch
    ood_score: float | None = None  # and, for a model with a "none of my classes" detector, its score
    is_ood: bool | None = None  # and decision


def zip_directory(path: Path) -> tuple[int, int] | None:
    """(entries, central directory bytes) from the end-of-central-directory record (ZIP64's when the
    classic fields overflow), read from the file's last 64 KB without reading the directory; None when
    there is no such record."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        tail_start = max(0, size - _EOCD.size - 0xFFFF)  # the record, then at most a 64 KB comment
        f.seek(tail_start)
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + _EOCD.size > len(tail):
            return None
        _, _, _, _, entries, directory, _, _ = _EOCD.unpack_from(tail, at)
        if entries != 0xFFFF and directory != 0xFFFFFFFF:
            return entries, directory
        locator = tail_start + at - _EOCD64_LOCATOR.size
        if locator < 0:
            return None
        f.seek(locator)
        sig, _, record, _ = _EOCD64_LOCATOR.unpack(f.read(_EOCD64_LOCATOR.size))
        if sig != b"PK\x06\x07" or record > size - _EOCD64.size:
            return None
        f.seek(record)
        sig, _, _, _, _, _, _, entries, directory, _ = _EOCD64.unpack(f.read(_EOCD64.size))
        return (entries, directory) if sig == b"PK\x06\x06" else None


def _read_zip(path: Path, budget: list[int], room: list[int], parse: list[int]) -> Iterator[tuple[Item, bytes | None]]:
    """Image members of the archive at ``path``, one at a time: at most ``room[0]`` of them, their bytes
    charged to ``budget[0]``; its directory's entries and bytes charged to ``parse`` (what is left of
    ``MAX_MEMBERS`` and ``MAX_DIRECTORY_BYTES`` for the whole batch) before it is read."""
    declared = zip_directory(path)
    if declared is not None and (declared[0] > parse[0] or declared[1] > parse[1]):
        entries, directory = declared
        yield (
            Item(
                path.name,
                f"refused unread: {entries:,} entries, a {directory:,}-byte directory (a batch reads at most "
                f"{MAX_MEMBERS:,} entries and {MAX_DIRECTORY_BYTES >> 20} MB of directories)",
            ),
            None,
        )
        return
    if declared is not None:
        parse[1] -= declared[1]  # what zipfile reads and parses: the directory the end record declares
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        yield Item(path.name, error=f"not a readable zip archive ({e})"), None
        return
    with zf:
        members = zf.infolist()
        if len(members) > parse[0]:  # a directory that disagrees with its end record
            yield Item(path.name, error=f"refused: {len(members)} entries (at most {MAX_MEMBERS} a batch)"), None
            parse[0] = 0
            return
        parse[0] -= len(members)
        for info in members:
            name = PurePosixPath(info.filename).name
            if info.is_dir() or PurePosixPath(name).suffix.lower() not in IMAGE_SUFFIXES or name.startswith("."):
                continue
            label = f"{path.name}/{info.filename}"
            if room[0] == 0:
                yield Item(label, error=f"skipped: a batch holds at most {MAX_IMAGES} images"), None
                return
            limit = min(MAX_IMAGE_BYTES, budget[0])
            if info.file_size > limit:
                yield Item(label, error=f"skipped: {info.file_size:,} bytes uncompressed (limit {limit:,})"), None
                continue
            try:
                with zf.open(info) as f:
                    data = f.read(limit + 1)
            except (RuntimeError, zipfile.BadZipFile, OSError, NotImplementedError) as e:  # encrypted, corrupt
                yield Item(label, error=f"cannot read this member ({e})"), None
                continue
            if len(data) > limit:
                yield Item(label, error="refused: inflates past its declared size"), None
                continue
            budget[0] -= len(data)
            room[0] -= 1
            yield Item(label), data


def read_uploads(paths: list[str]) -> Iterator[tuple[Item, bytes | None]]:
    """The uploads in ``paths`` (image files and zip archives of images), in order, each with its bytes, read
    one at a time as the caller asks for them (None, with ``item.error`` saying why, for one skipped).
    Raises ``ValueError`` when nothing was uploaded."""
    if not paths:
        raise ValueError("Upload one or more images, or a zip archive of images.")
    return _read_uploads([Path(p) for p in paths])


def _read_uploads(paths: list[Path]) -> Iterator[tuple[Item, bytes | None]]:
    budget, room, parse = [MAX_TOTAL_BYTES], [MAX_IMAGES], [MAX_MEMBERS, MAX_DIRECTORY_BYTES]
    seen: set[str] = set()
    for p in paths:
        if str(p.resolve()) in seen:  # one file listed again (an archive 200 times) is read once
            yield Item(p.name, error="skipped: the same file again"), None
            continue
        seen.add(str(p.resolve()))
        if zipfile.is_zipfile(p):
            yield from _read_zip(p, budget, room, parse)
        elif room[0] == 0:
            yield Item(p.name, error=f"skipped: a batch holds at most {MAX_IMAGES} images"), None
        elif p.stat().st_size > min(MAX_IMAGE_BYTES, budget[0]):
            yield Item(p.name, error="skipped: file too large for this batch"), None
        else:
            data = p.read_bytes()
            budget[0] -= len(data)
            room[0] -= 1
            yield Item(p.name), data


def _decode(item: Item, data: bytes, need: int, pixels: list[int]) -> Image.Image | None:
    """The image in ``data`` decoded reduced (long side ``THUMB``, short side at least ``need``), its decoded
    pixels charged to ``pixels[0]`` from its header first; None (``item.error`` set) when it is unreadable or
    over what is left."""
    buf = io.BytesIO(data)
    buf.name = item.name  # load_image's messages name their source
    try:
        header = read_upload_header(buf)
        w, h = header.decoded_size(THUMB, need)
        if header.decode_bytes(THUMB, need) > MAX_DECODE_BYTES:
            item.error = (
                f"skipped: decoding this {header.size[0]}x{header.size[1]} {header.format} takes about "
                f"{header.decode_bytes(THUMB, need) >> 20:,} MB, more than a batch gives one image "
                f"({MAX_DECODE_BYTES >> 20} MB); classify it on its own"
            )
            return None
        if w * h > pixels[0]:
            item.error = (
                f"skipped: decoding it takes {w * h:,} pixels, more than the batch has left "
                f"({pixels[0]:,} of {MAX_DECODED_PIXELS:,}); send large images in smaller batches"
            )
            return None
        pixels[0] -= w * h
        buf.seek(0)
        return load_image(buf, MAX_PIXELS, THUMB, need)
    except ImageDataError as e:
        item.error = str(e)
        return None


def classify_batch(
    model: VisionTransformer, transform: ImageTransform, paths: list[str], s: Settings, device: torch.device
) -> tuple[list[Item], list[tuple[Image.Image, str]]]:
    """Every upload of ``paths`` (``read_uploads``) with its probabilities or the reason it was skipped, and
    the gallery: an overlay with a caption per image. Images are decoded, classified and let go one at a
    time, ``chunk_size(s.method)`` per forward pass; each item's ``probs`` are the mean over the views the model was
    calibrated for, as the Classify tab's (``vit_core.calibration.predict``), with its "none of my classes" decision.
    The map is ``s.method`` for each image's predicted class, with the options of ``s`` (raw attention: the
    last layer by default, heads averaged); only ``batchable`` methods: RISE, hundreds of forward passes per
    image, is for the Classify tab."""
    if not s.method.batchable:
        titles = ", ".join(m.title for m in batchable())
        raise ValueError(f"the Batch tab's explanations are {titles}; {s.method.title} is on the Classify tab")
    items: list[Item] = []
    gallery: list[tuple[Image.Image, str]] = []
    chunk: list[tuple[Item, torch.Tensor, Image.Image]] = []
    pixels, need = [MAX_DECODED_PIXELS], needed_side(transform)
    for item, data in read_uploads(paths):
        items.append(item)
        img = None if data is None else _decode(item, data, need, pixels)
        if img is None:
            continue
        shown = render.display_copy(img, THUMB)  # an extreme aspect ratio was kept larger for the model
        chunk.append((item, transform(img), shown))
        del img, data
        if len(chunk) == chunk_size(s.method):
            gallery += _classify_chunk(model, transform, chunk, s, device)
            chunk = []
    if chunk:
        gallery += _classify_chunk(model, transform, chunk, s, device)
    return items, gallery


def chunk_size(method: methods.Method) -> int:
    """Images per forward pass: ``GRADIENT_CHUNK`` for a method with a backward pass, else ``CHUNK``."""
    return GRADIENT_CHUNK if method.cost.backward else CHUNK


def _classify_chunk(
    model: VisionTransformer,
    transform: ImageTransform,
    chunk: list[tuple[Item, torch.Tensor, Image.Image]],
    s: Settings,
    device: torch.device,
) -> list[tuple[Image.Image, str]]:
    x = torch.stack([x for _, x, _ in chunk]).to(device)
    with autocast(device):
        _, maps = s.method.fn(model, x, **s.options(), return_logits=True)
        p = predict(model, x)  # as the Classify tab: the model's views, calibrated, checked
    gallery = []
    for j, ((item, _, shown), heat) in enumerate(zip(chunk, maps.float().cpu(), strict=True)):
        item.probs = p.probs[j].float().cpu()
        if p.ood_score is not None:
            item.ood_score, item.is_ood = float(p.ood_score[j]), bool(p.is_ood[j])
        box = tuple(round(v) for v in transform.crop_box(*shown.size))
        caption = f"{item.name}: {verdict(item.probs, model.class_names, item.is_ood)}"
        gallery.append((render.map_on_image(shown, box, heat, s.opacity, ""), caption))
    return gallery


def batchable() -> list[methods.Method]:
    """The methods the Batch tab offers: those of the table that map a batch in a few passes."""
    return [m for m in methods.METHODS if m.batchable]


def _cell(text: str) -> str:
    """A text cell a spreadsheet will not run: OWASP's rule for CSV injection, a cell starting with
    ``= + - @``, a tab or a carriage return gets a leading single quote (a file named ``@SUM(1+1).png``)."""
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def write_csv(items: list[Item], names: list[str], top_k: int) -> Path:
    """A CSV with one row per upload: the verdict, whether it is unsure, the "none of my classes" decision and
    score (empty for a model without a detector), the top-k classes and probabilities, or the error. Written to
    a fresh folder under ``OUT_DIR``; folders older than an hour are removed."""
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
        tops = [f"{c}_{r}" for r in range(1, k + 1) for c in ("class", "p")]
        w.writerow(["file", "prediction", "unsure", "none_of_my_classes", "ood_score", *tops, "error"])
        for item in items:
            p = item.probs
            if p is None:
                w.writerow([_cell(item.name), "", "", "", "", *[""] * (2 * k), _cell(item.error or "")])
                continue
            top = p.topk(k)
            cells = [
                v for pr, i in zip(top.values, top.indices, strict=True) for v in (_cell(names[i]), f"{float(pr):.4f}")
            ]
            ood = ["", ""] if item.is_ood is None else [item.is_ood, f"{item.ood_score:.4g}"]
            unsure = float(top.values[0]) < UNSURE_BELOW
            w.writerow([_cell(item.name), _cell(verdict(p, names, item.is_ood)), unsure, *ood, *cells, ""])
    return path
