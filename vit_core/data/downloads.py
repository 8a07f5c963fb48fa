"""The named datasets (MNIST, Fashion-MNIST, CIFAR-10) fetched on first use from their public sources.

``fetch(key, folder, split)`` makes sure ``folder`` holds the files ``datasets.py`` reads for ``split``: the
IDX files of MNIST and Fashion-MNIST as published, and CIFAR-10 as npz shards converted from the authors'
*binary* archive (``cifar-10-binary.tar.gz``: plain label and pixel bytes; the python archive is pickled and
is never read). Every download is checked against the digest its publisher states, written to ``<name>.part``
and renamed when whole, and resumed with an HTTP range request after an interruption. ``VIT_DATA_MIRROR``
(a base URL serving ``<dataset>/<file>``) replaces the public sources, e.g. for an institution's mirror.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import sys
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .images import ImageDataError

try:
    import fcntl  # POSIX: one process downloads while the others (torchrun's ranks) wait for it
except ImportError:  # Windows: no lock; one process per data folder
    fcntl = None

TIMEOUT = 30  # seconds without an answer or a byte before a mirror counts as unreachable
CHUNK = 1 << 20


class DownloadError(ImageDataError):
    """A named dataset is not on disk and no source gave it (no network, or no file with the right digest)."""


@dataclass(frozen=True)
class Source:
    """Where a dataset comes from and what of it ``datasets.py`` reads.

    ``digests``: each downloaded file and its publisher's digest, "sha256:<hex>" or "md5:<hex>" (MD5 where that
    is all the publisher states). ``reads``: per split, the files the loader opens. ``convert`` turns the
    downloaded files into those (None: they are the downloaded files themselves)."""

    mirrors: tuple[str, ...]
    digests: dict[str, str]
    reads: dict[str, tuple[str, ...]]
    convert: Callable[[Path], None] | None = None


def _idx_files(prefix: str) -> tuple[str, ...]:
    return (f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz")


_IDX_READS = {"train": _idx_files("train"), "test": _idx_files("t10k")}
CIFAR_ARCHIVE = "cifar-10-binary.tar.gz"
_CIFAR_SHARDS = {f"{batch}.bin": f"{batch}.npz" for batch in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]}
_CIFAR_RECORD = 1 + 3 * 32 * 32  # one label byte, then the red, green and blue 32x32 planes


def _cifar_binary_to_npz(folder: Path) -> None:
    """The binary archive's six batches as the npz shards ``datasets.py`` reads (x uint8 (N, 32, 32, 3) HWC RGB,
    y uint8 (N,)), and its class names as ``meta.json``. Members are read by name from the stream, never
    extracted, so no path in the archive is ever written."""
    archive, found, classes = folder / CIFAR_ARCHIVE, set(), None
    with tarfile.open(archive, "r|gz") as tar:
        for member in tar:
            name = member.name.rsplit("/", 1)[-1]
            if not member.isfile() or (name not in _CIFAR_SHARDS and name != "batches.meta.txt"):
                continue
            data = tar.extractfile(member).read()
            if name == "batches.meta.txt":
                classes = data.decode("ascii").split()
                continue
            if len(data) % _CIFAR_RECORD:
                raise DownloadError(f"{archive}: {member.name} is not whole {_CIFAR_RECORD}-byte records; corrupt")
            records = np.frombuffer(data, np.uint8).reshape(-1, _CIFAR_RECORD)
            x = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # CHW planes -> HWC
            shard = io.BytesIO()
            np.savez(shard, x=np.ascontiguousarray(x), y=records[:, 0].copy())
            _write_atomic(folder / _CIFAR_SHARDS[name], shard.getvalue())
            found.add(name)
    missing = sorted(set(_CIFAR_SHARDS) - found) + ([] if classes else ["batches.meta.txt"])
    if missing:
        raise DownloadError(f"{archive}: no {', '.join(missing)} in it; not the CIFAR-10 binary archive")
    _write_atomic(folder / "meta.json", json.dumps({"classes": classes}).encode())
    archive.unlink()


SOURCES = {
    "mnist": Source(
        # torchvision's mirror first: yann.lecun.com has refused downloads at times
        ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
        {
            "train-images-idx3-ubyte.gz": "sha256:440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            "train-labels-idx1-ubyte.gz": "sha256:3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            "t10k-images-idx3-ubyte.gz": "sha256:8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            "t10k-labels-idx1-ubyte.gz": "sha256:f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        },
        _IDX_READS,
    ),
    "fashion-mnist": Source(
        (
            "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        ),
        {
            "train-images-idx3-ubyte.gz": "sha256:3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
            "train-labels-idx1-ubyte.gz": "sha256:a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
            "t10k-images-idx3-ubyte.gz": "sha256:346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
            "t10k-labels-idx1-ubyte.gz": "sha256:67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        },
        _IDX_READS,
    ),
    "cifar10": Source(
        ("https://www.cs.toronto.edu/~kriz/",),
        {CIFAR_ARCHIVE: "md5:c32a1d4ab5d03f1284b67883e8d87530"},  # the MD5 on the CIFAR page, its only digest
        {"train": tuple(_CIFAR_SHARDS.values())[:5], "test": ("test_batch.npz",)},
        _cifar_binary_to_npz,
    ),
}


def fetch(key: str, folder: Path, split: str) -> None:
    """Download what ``folder`` lacks of dataset ``key`` (a key of ``SOURCES``) for ``split`` ("train" or
    "test"); nothing when the files are there. Raises ``DownloadError``, in one line, when no source gives them."""
    source = SOURCES[key]
    if _has(folder, source.reads[split]):
        return
    folder.mkdir(parents=True, exist_ok=True)
    with _lock(folder):
        if _has(folder, source.reads[split]):  # another process fetched them while this one waited
            return
        names = list(source.digests) if source.convert else [n for n in source.reads[split] if not _has(folder, [n])]
        for name in names:
            _download(key, name, source.digests[name], _mirrors(key, source), folder)
        if source.convert:
            source.convert(folder)


def _has(folder: Path, names: tuple[str, ...] | list[str]) -> bool:
    """Whether every file is in ``folder`` (an IDX file also counts when gunzipped, as the loader reads it)."""
    return all((folder / n).is_file() or (n.endswith(".gz") and (folder / n[:-3]).is_file()) for n in names)


def _mirrors(key: str, source: Source) -> tuple[str, ...]:
    mirror = os.environ.get("VIT_DATA_MIRROR")
    return (f"{mirror.rstrip('/')}/{key}/",) if mirror else source.mirrors


@contextmanager
def _lock(folder: Path) -> Iterator[None]:
    with open(folder / ".download.lock", "w") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _download(key: str, name: str, digest: str, mirrors: tuple[str, ...], folder: Path) -> None:
    """``name`` from the first mirror that serves it with ``digest``, into ``folder`` (atomically)."""
    algorithm, expected = digest.split(":")
    part, failures, answered = folder / f"{name}.part", [], False
    for base in mirrors:
        url = base + name
        try:
            _get(url, part)  # an error of the disk (OSError) ends the download; the part stays to be resumed
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as e:
            answered |= isinstance(e, urllib.error.HTTPError)
            failures.append(f"{url}: {getattr(e, 'reason', None) or e}")
            continue
        answered, actual = True, _digest(part, algorithm)
        if actual != expected:
            part.unlink()
            failures.append(f"{url}: checksum mismatch, {algorithm} {actual} is not the published {expected}")
            continue
        os.replace(part, folder / name)
        return
    raise DownloadError(
        f"{key} is not in {folder} and could not be downloaded{'' if answered else ' (no network?)'}: "
        f"{'; '.join(failures)}. Put its files there, or set VIT_DATA to a folder holding {key}/"
    )


def _get(url: str, part: Path) -> None:
    """``url`` into ``part``, continuing after the bytes already there when the server takes a range."""
    offset = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": "vit_core"} | ({"Range": f"bytes={offset}-"} if offset else {})
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing after the part: it is whole, and its digest decides
            return
        raise
    with response:
        if response.status != 206:
            offset = 0  # the server sends the whole file
        length = response.headers.get("Content-Length")
        print(f"downloading {url} into {part.parent}", file=sys.stderr, flush=True)  # said once it answers
        with (
            open(part, "ab" if offset else "wb") as out,
            tqdm(
                total=int(length) + offset if length else None,
                initial=offset,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=part.name.removesuffix(".part"),
                disable=None,  # a bar on a terminal, nothing in a log
            ) as bar,
        ):
            while chunk := response.read(CHUNK):
                out.write(chunk)
                bar.update(len(chunk))


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` into a temporary file beside ``path``, renamed to it when whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
