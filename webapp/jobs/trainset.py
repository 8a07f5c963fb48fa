"""A visitor's labelled photos as a training folder, in two steps that cost very differently.

- ``from_zip`` (the server, before the job's process starts: cheap). The zip (the ``--data`` layout) is read in
  memory (``archives.read_zip``: caps on entries and bytes, nothing extracted); each image member's *header* is
  read (``vit_core.data.read_header``: its size, its pixel limit) and its bytes are written under a name of ours,
  ``<dest>/<class>/<n>.img``. What decoding them all would cost (their decoded pixels, JPEG at its reduced scale)
  is summed and refused over ``Limits.max_decode_mp``, from the headers alone: 2,000 one-colour 36 MP PNGs make a
  2 MB zip that took 16 minutes to decode here, in the server, before any budget applied.
- ``decode_folder`` (the job's process, ``webapp.jobs.worker``: where the time budget and Cancel apply). Every
  image is decoded safely (``load_image``: corrupt files dropped) and re-encoded, reduced, as ``<n>.jpg``; the
  loop stops at the job's stop file or its deadline.

Nothing of the archive is served or read as it came: member paths only name a class (the folder that holds the
image), class names are cut to letters, digits, spaces, ``-`` and ``_``, the raw bytes lie under our names in the
job's own folder until their decoded copy replaces them. ``Limits`` are what the Train tab states before an
upload: public mode's are small (``PUBLIC``).

**What a job costs in memory** (``training_bytes``): its training process's peak RSS, reserved in the memory gate
(``webapp.server.admission.Gate``) before the process starts, from the zip's declared photos and the model's config.

**The Train tab** (``training_bytes``) reserves its training process's peak RSS (``webapp.jobs.worker``: it
reports it, ``peak_bytes``), measured with ``python -m bench.train_memory`` (``bench/results/train_memory.txt``)
on the largest jobs the public limits allow: the process's start with the model's code (``WORKER_BYTES``), then
the larger of decoding the photos (the costliest one, ``DECODE_BYTES``: the process hands decoding's freed pages
back before the model comes) and training: the model's weights in their four copies, the photos held decoded,
and the larger of a training step's activations and the largest pass without gradients (calibration's batches of
``INFER_BATCH``).
"""

from __future__ import annotations

import io
import math
import re
import shutil
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vit_core import ViTConfig
from vit_core.data import ImageHeader, load_image, read_header
from vit_core.data.datasets import OTHER_FOLDER
from vit_core.data.images import ImageDataError
from vit_core.models.cost import forward_bytes

from ..inference.archives import read_zip, zip_directory
from ..resources import MB, MIN_FREE_DISK

MAX_STORED_SIDE = 320  # images are stored reduced to this long side: enough for inputs up to 224 (and 2x a 64-px model)
MAX_PHOTO_PIXELS = 40_000_000  # one image's declared pixels (a decompression bomb is refused from its header)
MAX_CLASS_CHARS = 40
IGNORED_FOLDERS = {"__MACOSX"}  # what macOS's Finder adds to a zip
RAW = ".img"  # an image's bytes as uploaded, under our name, until ``decode_folder`` replaces them


class Stopped(Exception):
    """The job was cancelled while its photos were being read: nothing to train."""


@dataclass(frozen=True)
class Limits:
    """What one training job may take; stated on the page before the upload."""

    max_images: int
    max_classes: int
    max_minutes: float
    max_zip_mb: int
    min_per_class: int = 2  # one to train on, one held out
    # megapixels decoded in all (JPEG at its reduced scale), from the headers: about 70 MP a second here (PNG)
    max_decode_mp: int = 4000

    def text(self) -> str:
        return (
            f"at most {self.max_images:,} images in {self.max_classes} classes (at least {self.min_per_class} "
            f"images each), a zip of at most {self.max_zip_mb} MB and {self.max_decode_mp:,} megapixels to decode, "
            f"{self.max_minutes:g} minutes of training"
        )


PUBLIC = Limits(max_images=2000, max_classes=20, max_minutes=5, max_zip_mb=50, max_decode_mp=4000)
LOCAL = Limits(max_images=20_000, max_classes=20, max_minutes=30, max_zip_mb=256, max_decode_mp=40_000)


@dataclass
class TrainSet:
    """The folder written, its classes (sorted, as the dataset orders them) with their image counts, the
    members skipped with why, and the photos of other things (the folder ``_other``: none of the classes)."""

    folder: Path
    counts: dict[str, int]
    skipped: list[str]
    others: int = 0

    @property
    def images(self) -> int:
        return sum(self.counts.values()) + self.others

    def text(self) -> str:
        counts = ", ".join(f"{name} ({n})" for name, n in self.counts.items())
        others = f"; {self.others:,} photos of other things ({OTHER_FOLDER})" if self.others else ""
        more = f"; {len(self.skipped)} files skipped (e.g. {self.skipped[0]})" if self.skipped else ""
        return f"{sum(self.counts.values()):,} images in {len(self.counts)} classes: {counts}{others}{more}"


def class_name(text: str) -> str | None:
    """A class name safe as one folder name (and readable as a label): letters, digits, spaces, ``-`` and
    ``_`` kept, anything else dropped; None when nothing is left."""
    name = re.sub(r"[^\w\- ]+", "", text, flags=re.UNICODE).strip()[:MAX_CLASS_CHARS].strip()
    return name or None


def class_of(member: str) -> str | None:
    """The class of an archive member: the folder that holds it (``ants/1.jpg``, ``photos/ants/1.jpg``); None
    for an image at the archive's top level or in a folder that names no class. ``OTHER_FOLDER`` (any case) for
    the photos of other things."""
    parts = PurePosixPath(member).parts
    if len(parts) < 2 or any(p in IGNORED_FOLDERS for p in parts):
        return None
    name = class_name(parts[-2])
    return OTHER_FOLDER if name is not None and name.lower() == OTHER_FOLDER else name


def from_zip(path: str | Path, dest: Path, limits: Limits, declared: tuple[int, int] | None = None) -> TrainSet:
    """The image members of the zip at ``path`` checked from their headers and written, undecoded, under names of
    ours into the new folder ``dest`` (see the module's docstring; ``decode_folder`` decodes them). ``ValueError``
    with a sentence for the visitor when the archive breaks the limits or does not make a training set (fewer
    than 2 classes, a class with too few images). ``declared``: the zip's end record (``archives.zip_directory``)
    when the caller read it already: it is read once a job. ``dest`` is left for the caller to remove."""

    path = Path(path)
    if not zipfile.is_zipfile(path):  # said first: not "no class folders found" about a file that is no archive
        raise ValueError(
            "This file is not a zip archive: make one with one folder of photos per class (ants/1.jpg, bees/7.jpg, …)."
        )
    size = path.stat().st_size
    if size > limits.max_zip_mb * MB:
        raise ValueError(f"The zip has {size / MB:,.0f} MB; at most {limits.max_zip_mb} MB are taken.")
    dest.mkdir(parents=True, exist_ok=False)
    counts: Counter[str] = Counter()
    skipped: list[str] = []
    pixels = 0
    declared = declared or zip_directory(path)
    for item, data in read_zip(path, limits.max_images, limits.max_zip_mb * MB * 4, declared):
        name = class_of(item.name)
        if data is None or name is None:
            skipped.append(f"{item.name}: {item.error or 'not inside a class folder'}")
            continue
        if name not in counts and name != OTHER_FOLDER and len(counts) == limits.max_classes:
            raise ValueError(f"More than {limits.max_classes} classes (folders) in the zip.")
        try:
            w, h = read_header(io.BytesIO(data), MAX_PHOTO_PIXELS).decoded_size(max_side=MAX_STORED_SIDE)
        except ImageDataError as e:
            skipped.append(f"{item.name}: {str(e).split(': ')[-1]}")
            continue
        pixels += w * h
        if pixels > limits.max_decode_mp * 1_000_000:
            raise ValueError(
                f"These photos are too large to decode here: more than {limits.max_decode_mp:,} megapixels in all "
                "(JPEG counts at the reduced size it is decoded at). Send smaller photos, or fewer."
            )
        if shutil.disk_usage(dest).free - len(data) < MIN_FREE_DISK:
            raise ValueError("The server's disk is nearly full; try again later.")
        folder = dest / name
        folder.mkdir(exist_ok=True)
        (folder / f"{counts[name]:05d}{RAW}").write_bytes(data)
        counts[name] += 1
    return _enough(_found(dest, counts, skipped), limits.min_per_class, declared)


def decode_folder(
    folder: Path,
    should_stop: Callable[[], bool],
    deadline: float,
    min_per_class: int = 2,
    clock: Callable[[], float] = time.time,
) -> TrainSet:
    """Decode every image ``from_zip`` wrote into ``folder`` and write it again, reduced, as ``<n>.jpg`` (the raw
    bytes removed as it goes); corrupt ones are dropped. Checked before each image: ``should_stop`` (``Stopped``)
    and the ``deadline`` on ``clock`` (``ValueError`` with a sentence). The classes are checked again after."""
    counts: Counter[str] = Counter()
    skipped: list[str] = []
    for raw in sorted(folder.glob(f"*/*{RAW}")):
        if should_stop():
            raise Stopped("Cancelled while reading the photos: nothing was trained.")
        if clock() > deadline:
            raise ValueError("Reading the photos took the whole time budget: send smaller photos, or fewer.")
        try:
            image = load_image(raw, MAX_PHOTO_PIXELS, max_side=MAX_STORED_SIDE)
        except ImageDataError as e:
            skipped.append(f"{raw.parent.name}/{raw.name}: {str(e).split(': ')[-1]}")
        else:
            image.save(raw.with_suffix(".jpg"), quality=95)
            counts[raw.parent.name] += 1
        raw.unlink()
    return _enough(_found(folder, counts, skipped), min_per_class)


def _found(folder: Path, counts: Counter[str], skipped: list[str]) -> TrainSet:
    others = counts.pop(OTHER_FOLDER, 0)
    return TrainSet(folder, dict(sorted(counts.items())), skipped, others)


def _enough(found: TrainSet, min_per_class: int, declared: tuple[int, int] | None = None) -> TrainSet:
    """``found`` if it makes a training set, else ``ValueError`` in words that say what the zip held: nothing, no
    photos among its files, or too few classes or images (``declared``: the zip's entries and directory size)."""
    entries = declared[0] if declared is not None else None
    if not found.counts and entries == 0:
        raise ValueError("The zip is empty: put one folder of photos per class in it (ants/1.jpg, bees/7.jpg, …).")
    if not found.counts and entries and not found.skipped and not found.others:
        raise ValueError(
            f"The zip holds {entries:,} {'file' if entries == 1 else 'files'} but no photos (JPEG, PNG, WebP, …): "
            "every one was skipped. Put one folder of photos per class in it."
        )
    if len(found.counts) < 2:
        hint = f" ({found.skipped[0]})" if found.skipped else ""
        if found.others:  # photos of none of the classes only set where "none of my classes" starts
            hint += f"; the {found.others:,} photos in {OTHER_FOLDER} are of none of the classes, so they make none"
        raise ValueError(
            f"The zip must hold at least 2 class folders of images (class/photo.jpg); found {len(found.counts)}{hint}."
        )
    few = [name for name, n in found.counts.items() if n < min_per_class]
    if few:
        raise ValueError(f"Every class needs at least {min_per_class} images; too few in: {', '.join(few)}.")
    return found


# The training process (``training_bytes``), measured with ``python -m bench.train_memory`` on 2 CPU threads
# (bench/results/train_memory.txt): 920 MB peak for the bundled model on 16 photos (its imports alone: about 780 MB),
# 1,588 MB on 2,000 photos, the whole model fine-tuned (calibration's batches of 500: 1.34 MB an image), 5,050 MB
# for ViT-B/16 on 40 (a training step of 32 images).
WORKER_BYTES = 1024 * MB  # python, torch and vit_core imported, the model's code (the 16-photo job peaked at 920 MB)
TRAIN_BATCH = 32  # vit_core.finetune.FINETUNE_RECIPE's batch
INFER_BATCH = 500  # ``evaluation.calibrate_model``'s batch: the largest pass without gradients (the engine's: 256)
TRAIN_PASSES = 3.5  # a training step's activations in forward passes of ``forward_bytes`` (ViT-B/16: 2.8 measured)
# a pass without gradients, an image: ``forward_bytes`` and a stem's largest map before its pooling twice, which
# measured 1.34 MB (bundled, 32 px; 1.32 estimated), 3.5 (64 px; 6.8) and 10.1 (ViT-B/16, a pass alone; 11.6): x 1.25
INFER_MARGIN = 1.25
WEIGHT_COPIES = 4  # fp32 weights, their gradients, SGD's momentum, and bf16 copies under autocast (half) with the
# run's exported model (half)
STORED_SIDE = 1.15  # photos are held at the eval transform's resize: at most the input size / crop_pct (0.875)
# decoding the costliest photo: WebP (its own buffer, copied, converted) or 16-bit gray (through float64)
DECODE_BYTES = max(
    ImageHeader((MAX_PHOTO_PIXELS // 5000, 5000), fmt, mode).decode_bytes(MAX_STORED_SIDE)
    for fmt, mode in (("WEBP", "RGBA"), ("PNG", "I;16"))
)


def training_bytes(cfg: ViTConfig, params: int, images: int) -> int:
    """The training process's peak RSS for ``images`` photos on a model of ``cfg`` with ``params`` parameters
    (``cfg`` at the input size it trains at), whatever strategy it chooses (see the module's docstring)."""
    side_h, side_w = (math.ceil(STORED_SIDE * s) for s in cfg.img_hw)
    stored = 2 * images * 3 * side_h * side_w  # uint8, and a second copy while they are stacked into one tensor
    train = TRAIN_PASSES * forward_bytes(cfg, TRAIN_BATCH)
    per_image = forward_bytes(cfg, 1, attention=False) + 2 * stem_map_bytes(cfg)
    infer = INFER_MARGIN * min(images, INFER_BATCH) * per_image
    return WORKER_BYTES + int(max(DECODE_BYTES, WEIGHT_COPIES * 4 * params + stored + max(train, infer)))


def stem_map_bytes(cfg: ViTConfig) -> int:
    """The largest map of a convolutional stem (``stem_channels``) before its pooling, float32; 0 without one
    (``activation_bytes`` counts a stem's maps after their pooling)."""
    if not cfg.stem_channels:
        return 0
    (h, w), scale, largest = cfg.img_hw, 1, 0
    pools = cfg.stem_pools or (1,) * len(cfg.stem_channels)
    for channels, stride, pool in zip(cfg.stem_channels, cfg.stem_strides, pools, strict=True):
        scale *= stride
        largest = max(largest, channels * -(-h // scale) * -(-w // scale))
        scale *= pool
    return 4 * largest
