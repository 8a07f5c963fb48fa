"""Reading a batch's uploads: image files and zip archives of images, one image's bytes at a time.

Uploads are untrusted. Archives are read in memory, never extracted: member paths are only names, so
``../`` entries cannot write anywhere. An archive's entry count and directory size are read from its
end-of-central-directory record first, so a zip declaring a million entries is refused without reading its
directory; the archives of one batch share one budget of entries and directory bytes, and a file listed twice
is read once, so one request parses at most one full-size directory (a zip listed 200 times held the only
compute slot for 142 s). Only members with an image suffix are read; the number of images and the bytes read are capped
from the archive's directory *and* while reading (a member that inflates past its declared size is cut off
and refused), so a zip bomb costs at most ``MAX_TOTAL_BYTES``.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff"}
MAX_IMAGES = 64  # images per batch, across all files and archives
MAX_FILES = 256  # files in one request (``webapp.server.payloads`` refuses more before Gradio touches them)
MAX_MEMBERS = 10_000  # archive entries per batch, all archives together; more is refused unread
MAX_DIRECTORY_BYTES = 8 << 20  # archive directories per batch, together (about 300 bytes an entry at most)
MAX_IMAGE_BYTES = 32 << 20  # one image, compressed size
MAX_TOTAL_BYTES = 256 << 20  # all images of a batch, as read
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


@dataclass
class Allowance:
    """What a request may still read, charged as it reads: image bytes, images (of ``cap`` in all), and zip
    directories' entries and bytes (what zipfile parses before any member is read)."""

    bytes: int = MAX_TOTAL_BYTES
    images: int = MAX_IMAGES
    members: int = MAX_MEMBERS
    directory: int = MAX_DIRECTORY_BYTES
    cap: int = MAX_IMAGES


def read_zip(
    path: Path, max_images: int, max_bytes: int, declared: tuple[int, int] | None = None
) -> Iterator[tuple[Item, bytes | None]]:
    """The image members of one archive with caps of the caller's (the Train tab's: thousands of images),
    each ``Item`` named by its path in the archive, as ``read_uploads`` reads them; ``declared``: its end
    record (``zip_directory``), when the caller has read it already."""
    prefix = f"{path.name}/"
    left = Allowance(bytes=max_bytes, images=max_images, cap=max_images)
    for item, data in _read_zip(path, left, declared or zip_directory(path)):
        item.name = item.name.removeprefix(prefix)
        yield item, data


def _read_zip(path: Path, left: Allowance, declared: tuple[int, int] | None) -> Iterator[tuple[Item, bytes | None]]:
    """Image members of the archive at ``path``, one at a time, charged to ``left``: its directory (``declared``:
    its end record's entries and bytes) before it is read, then each member read."""
    if declared is not None and (declared[0] > left.members or declared[1] > left.directory):
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
        left.directory -= declared[1]  # what zipfile reads and parses: the directory the end record declares
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        yield Item(path.name, error=f"not a readable zip archive ({e})"), None
        return
    with zf:
        members = zf.infolist()
        if len(members) > left.members:  # a directory that disagrees with its end record
            yield Item(path.name, error=f"refused: {len(members)} entries (at most {MAX_MEMBERS} a batch)"), None
            left.members = 0
            return
        left.members -= len(members)
        for info in members:
            name = PurePosixPath(info.filename).name
            if info.is_dir() or PurePosixPath(name).suffix.lower() not in IMAGE_SUFFIXES or name.startswith("."):
                continue
            label = f"{path.name}/{info.filename}"
            if left.images == 0:
                yield Item(label, error=f"skipped: at most {left.cap:,} images are read"), None
                return
            limit = min(MAX_IMAGE_BYTES, left.bytes)
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
            left.bytes -= len(data)
            left.images -= 1
            yield Item(label), data


def read_uploads(paths: list[str]) -> Iterator[tuple[Item, bytes | None]]:
    """The uploads in ``paths`` (image files and zip archives of images), in order, each with its bytes, read
    one at a time as the caller asks for them (None, with ``item.error`` saying why, for one skipped).
    Raises ``ValueError`` when nothing was uploaded."""
    if not paths:
        raise ValueError("Upload one or more images, or a zip archive of images.")
    return _read_uploads([Path(p) for p in paths])


def _read_uploads(paths: list[Path]) -> Iterator[tuple[Item, bytes | None]]:
    left = Allowance()
    seen: set[str] = set()
    for p in paths:
        if str(p.resolve()) in seen:  # one file listed again (an archive 200 times) is read once
            yield Item(p.name, error="skipped: the same file again"), None
            continue
        seen.add(str(p.resolve()))
        if not p.is_file():  # named in the request, in the upload folder, but not there (or gone): no traceback
            yield Item(p.name, error="skipped: no such uploaded file"), None
        elif zipfile.is_zipfile(p):
            yield from _read_zip(p, left, zip_directory(p))
        elif left.images == 0:
            yield Item(p.name, error=f"skipped: a batch holds at most {MAX_IMAGES} images"), None
        elif p.stat().st_size > min(MAX_IMAGE_BYTES, left.bytes):
            yield Item(p.name, error="skipped: file too large for this batch"), None
        else:
            data = p.read_bytes()
            left.bytes -= len(data)
            left.images -= 1
            yield Item(p.name), data
