"""The named datasets fetched on first use (``vit_core.data.downloads``), against a local HTTP server serving
the real files from the shared data folder (no internet): digests, resuming, the CIFAR-10 binary archive
turned into the npz shards, and one line when there is no network."""

import dataclasses
import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import numpy as np
import pytest
import torch

from tests.net import free_port
from vit_core.data import build_dataset, default_data_root, downloads
from vit_core.data.downloads import DownloadError

SHARED = default_data_root()
REPO = Path(__file__).resolve().parents[1]
MNIST_TEST = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not (SHARED / name).is_dir(), reason=f"real data not found: {SHARED / name}")


class Mirror(ThreadingHTTPServer):
    """Serves ``files`` (URL path -> bytes), honouring ``Range: bytes=N-`` while ``ranges`` is true, and logs
    each request as (path, Range header)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Serve)
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.ranges = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Serve(BaseHTTPRequestHandler):
    server: Mirror

    def log_message(self, format: str, *args) -> None:
        pass

    def do_GET(self) -> None:
        asked = self.headers.get("Range")
        self.server.requests.append((self.path, asked))
        data = self.server.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        start = int(asked.removeprefix("bytes=").removesuffix("-")) if asked and self.server.ranges else None
        if start is not None and start >= len(data):
            self.send_error(416)
            return
        self.send_response(200 if start is None else 206)
        if start is not None:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - (start or 0)))
        self.end_headers()
        self.wfile.write(data[start or 0 :])


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """The mirror as ``VIT_DATA_MIRROR``, and ``VIT_DATA`` an empty folder: nothing is on disk yet."""
    server = Mirror()
    Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("VIT_DATA_MIRROR", server.url)
    monkeypatch.setenv("VIT_DATA", str(tmp_path / "data"))
    yield server
    server.shutdown()
    server.server_close()


def _serve_mnist(mirror: Mirror) -> None:
    for name in MNIST_TEST:
        mirror.files[f"/mnist/{name}"] = (SHARED / "mnist" / name).read_bytes()


@_needs("mnist")
def test_mnist_is_fetched_on_first_use_then_read_from_disk(mirror, tmp_path):
    """The quick start on a fresh machine (issue #48, item 4): before, "mnist" outside the project's shared
    folder stopped with "...t10k-images-idx3-ubyte.gz not found"."""
    _serve_mnist(mirror)
    test = build_dataset("mnist", "test")
    reference = build_dataset("mnist", "test", root=SHARED)
    assert torch.equal(test.images, reference.images) and torch.equal(test.targets, reference.targets)
    folder = tmp_path / "data" / "mnist"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(MNIST_TEST)
    assert all((folder / n).read_bytes() == (SHARED / "mnist" / n).read_bytes() for n in MNIST_TEST)
    assert sorted(path for path, _ in mirror.requests) == [f"/mnist/{n}" for n in sorted(MNIST_TEST)]  # test only
    build_dataset("mnist", "val")
    assert len(mirror.requests) == 2  # on disk now: no request


@_needs("mnist")
def test_a_file_whose_digest_differs_is_refused_and_deleted(mirror, tmp_path):
    _serve_mnist(mirror)
    labels = bytearray(mirror.files["/mnist/t10k-labels-idx1-ubyte.gz"])
    labels[100] ^= 1
    mirror.files["/mnist/t10k-labels-idx1-ubyte.gz"] = bytes(labels)
    with pytest.raises(DownloadError, match="checksum mismatch, sha256 [0-9a-f]{64} is not the published f7ae6") as e:
        build_dataset("mnist", "test")
    assert "no network" not in str(e.value) and "\n" not in str(e.value)
    labels = tmp_path / "data" / "mnist" / "t10k-labels-idx1-ubyte.gz"
    assert not labels.exists() and not labels.with_name(f"{labels.name}.part").exists()


@_needs("mnist")
@pytest.mark.parametrize("ranges", [True, False])
def test_an_interrupted_download_resumes_where_it_stopped(mirror, tmp_path, ranges):
    """A part left by an interrupted run is continued with a range request; a server that ignores ranges
    sends the whole file, which replaces the part. Either way the file is whole and verified."""
    _serve_mnist(mirror)
    mirror.ranges = ranges
    name, folder = MNIST_TEST[0], tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    whole = mirror.files[f"/mnist/{name}"]
    (folder / f"{name}.part").write_bytes(whole[:1_000_000])
    build_dataset("mnist", "test")
    assert (folder / name).read_bytes() == whole and not (folder / f"{name}.part").exists()
    assert (f"/mnist/{name}", "bytes=1000000-") in mirror.requests


def _cifar_binary_archive(per_batch: int) -> bytes:
    """The CIFAR-10 binary distribution's layout, written from the shared npz shards (their first ``per_batch``
    images each): ``cifar-10-batches-bin/<batch>.bin`` of 3073-byte records, a label byte then the red, green
    and blue 32x32 planes (the CIFAR page's description), and ``batches.meta.txt``; plus a member whose path
    leaves the folder, which must never be written."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("../escaped.bin", b"never written")
        for batch in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
            with np.load(SHARED / "cifar10" / f"{batch}.npz") as shard:
                x, y = shard["x"][:per_batch], shard["y"][:per_batch]
            planes = x.transpose(0, 3, 1, 2).reshape(len(x), -1)  # HWC -> R, G, B planes
            add(f"cifar-10-batches-bin/{batch}.bin", np.concatenate([y[:, None], planes], axis=1).tobytes())
        names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
        add("cifar-10-batches-bin/batches.meta.txt", "\n".join(names).encode() + b"\n\n")
    return buffer.getvalue()


@_needs("cifar10")
def test_cifar10_comes_from_the_binary_archive_as_npz_shards(mirror, tmp_path, monkeypatch):
    """Never the pickled python archive: the binary one, converted to the shards the loader reads, pixel for
    pixel the shared copy's."""
    archive = _cifar_binary_archive(per_batch=40)
    digest = f"md5:{hashlib.md5(archive).hexdigest()}"
    cifar = dataclasses.replace(downloads.SOURCES["cifar10"], digests={downloads.CIFAR_ARCHIVE: digest})
    monkeypatch.setitem(downloads.SOURCES, "cifar10", cifar)
    mirror.files["/cifar10/cifar-10-binary.tar.gz"] = archive
    train, test = build_dataset("cifar10", "train"), build_dataset("cifar10", "test")
    reference = build_dataset("cifar10", "train", root=SHARED), build_dataset("cifar10", "test", root=SHARED)
    first = torch.cat([torch.arange(40) + 10000 * i for i in range(5)]), torch.arange(40)
    for ours, theirs, index in zip((train, test), reference, first, strict=True):
        assert torch.equal(ours.images, theirs.images[index]) and torch.equal(ours.targets, theirs.targets[index])
    assert train.classes == reference[0].classes
    folder = tmp_path / "data" / "cifar10"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(
        [*(f"data_batch_{i}.npz" for i in range(1, 6)), "test_batch.npz", "meta.json"]
    )  # the archive is gone once converted
    assert not (tmp_path / "data" / "escaped.bin").exists() and not (tmp_path / "escaped.bin").exists()
    assert len(mirror.requests) == 1


def test_no_network_is_one_line_from_the_command_line(tmp_path):
    """``python -m train --recipe mnist_tiny`` with nothing on disk and no source reachable: exit status 2 and
    one line naming the dataset, the folder and what to do; no traceback."""
    dead = free_port()  # closed again: connections are refused
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), VIT_DATA=str(tmp_path / "data"))
    env["VIT_DATA_MIRROR"] = f"http://127.0.0.1:{dead}"
    cmd = [sys.executable, "-m", "train", "--recipe", "mnist_tiny", "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.fullmatch(
        rf"error: mnist is not in {re.escape(str(tmp_path / 'data' / 'mnist'))} and could not be downloaded "
        rf"\(no network\?\): http://127\.0\.0\.1:{dead}/mnist/train-images-idx3-ubyte\.gz: .*Connection refused.*\. "
        r"Put its files there, or set VIT_DATA to a folder holding mnist/\n",
        proc.stderr,
    ), proc.stderr
    assert not (tmp_path / "run").exists()
