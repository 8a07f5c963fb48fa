"""A visitor's labelled photos as a training folder: a zip with one folder per class (the ``--data`` layout) read
in memory (``archives.read_zip``: caps on entries and bytes, nothing extracted), each image decoded safely and
written again, reduced, under a name of ours into a fresh folder ``<dest>/<class>/<n>.jpg``.

Nothing of the archive reaches the disk as it came: member paths only name a class (the folder that holds the
image), class names are cut to letters, digits, spaces, ``-`` and ``_``, and every image is decoded
(``vit_core.data.load_image``: its pixel limit, corrupt files refused) and re-encoded. ``Limits`` are what the
Train tab states before an upload: public mode's are small (``PUBLIC``).
"""

from __future__ import annotations

import io
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vit_core.data import load_image
from vit_core.data.images import ImageDataError

from .archives import read_zip

MB = 2**20
MAX_SIDE = 320  # images are stored reduced to this long side: enough for inputs up to 224 (and 2x a 64-px model)
MAX_PIXELS = 40_000_000  # one image's declared pixels (a decompression bomb is refused from its header)
MAX_CLASS_CHARS = 40
IGNORED_FOLDERS = {"__MACOSX"}  # what macOS's Finder adds to a zip


@dataclass(frozen=True)
class Limits:
    """What one training job may take; stated on the page before the upload."""

    max_images: int
    max_classes: int
    max_minutes: float
    max_zip_mb: int
    min_per_class: int = 2  # one to train on, one held out

    def text(self) -> str:
        return (
            f"at most {self.max_images:,} images in {self.max_classes} classes (at least {self.min_per_class} "
            f"images each), a zip of at most {self.max_zip_mb} MB, {self.max_minutes:g} minutes of training"
        )


PUBLIC = Limits(max_images=2000, max_classes=20, max_minutes=5, max_zip_mb=50)
LOCAL = Limits(max_images=20_000, max_classes=20, max_minutes=30, max_zip_mb=256)


@dataclass
class TrainSet:
    """The folder written, its classes (sorted, as the dataset orders them) with their image counts, and the
    members skipped with why."""

    folder: Path
    counts: dict[str, int]
    skipped: list[str]

    def text(self) -> str:
        counts = ", ".join(f"{name} ({n})" for name, n in self.counts.items())
        more = f"; {len(self.skipped)} files skipped (e.g. {self.skipped[0]})" if self.skipped else ""
        return f"{sum(self.counts.values()):,} images in {len(self.counts)} classes: {counts}{more}"


def class_name(text: str) -> str | None:
    """A class name safe as one folder name (and readable as a label): letters, digits, spaces, ``-`` and
    ``_`` kept, anything else dropped; None when nothing is left."""
    name = re.sub(r"[^\w\- ]+", "", text, flags=re.UNICODE).strip()[:MAX_CLASS_CHARS].strip()
    return name or None


def class_of(member: str) -> str | None:
    """The class of an archive member: the folder that holds it (``ants/1.jpg``, ``photos/ants/1.jpg``); None
    for an image at the archive's top level or in a folder that names no class."""
    parts = PurePosixPath(member).parts
    if len(parts) < 2 or any(p in IGNORED_FOLDERS for p in parts):
        return None
    return class_name(parts[-2])


def from_zip(path: str | Path, dest: Path, limits: Limits) -> TrainSet:
    """The images of the zip at ``path`` written into the new folder ``dest`` (see the module's docstring).
    ``ValueError`` with a sentence for the visitor when the archive breaks the limits or does not make a
    training set (fewer than 2 classes, a class with too few images)."""
    path = Path(path)
    size = path.stat().st_size
    if size > limits.max_zip_mb * MB:
        raise ValueError(f"The zip has {size / MB:,.0f} MB; at most {limits.max_zip_mb} MB are taken.")
    dest.mkdir(parents=True, exist_ok=False)
    counts: Counter[str] = Counter()
    skipped: list[str] = []
    for item, data in read_zip(path, limits.max_images, limits.max_zip_mb * MB * 4):
        name = class_of(item.name)
        if data is None or name is None:
            skipped.append(f"{item.name}: {item.error or 'not inside a class folder'}")
            continue
        if name not in counts and len(counts) == limits.max_classes:
            raise ValueError(f"More than {limits.max_classes} classes (folders) in the zip.")
        try:
            image = load_image(io.BytesIO(data), MAX_PIXELS, max_side=MAX_SIDE)
        except ImageDataError as e:
            skipped.append(f"{item.name}: {str(e).split(': ')[-1]}")
            continue
        folder = dest / name
        folder.mkdir(exist_ok=True)
        image.save(folder / f"{counts[name]:05d}.jpg", quality=95)
        counts[name] += 1
    return _checked(TrainSet(dest, dict(sorted(counts.items())), skipped), limits)


def _checked(found: TrainSet, limits: Limits) -> TrainSet:
    if len(found.counts) < 2:
        hint = f" ({found.skipped[0]})" if found.skipped else ""
        raise ValueError(
            f"The zip must hold at least 2 class folders of images (class/photo.jpg); found {len(found.counts)}{hint}."
        )
    few = [name for name, n in found.counts.items() if n < limits.min_per_class]
    if few:
        raise ValueError(f"Every class needs at least {limits.min_per_class} images; too few in: {', '.join(few)}.")
    return found
