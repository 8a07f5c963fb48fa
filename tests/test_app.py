"""The app as a user reaches it: ``python app.py`` on 127.0.0.1, driven with gradio_client."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CAT = ROOT / "examples" / "cat_chelsea.jpg"
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def server():
    """The app as the README launches it: the bundled default model, no network."""
    port = _free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port), "--concurrency", "2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 180
    client = None
    while time.time() < deadline and client is None:
        if proc.poll() is not None:
            pytest.fail(f"app exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            client = Client(url, verbose=False)
        except Exception:
            time.sleep(1)
    if client is None:
        proc.kill()
        pytest.fail("app did not start within 180 s")
    yield proc, client, url
    proc.terminate()
    proc.wait(timeout=30)


def _classify(client: Client, path: Path | str, **kwargs):
    return client.predict(handle_file(str(path)), api_name="/classify", **kwargs)


def test_classify_a_real_photo(server):
    _, client, _ = server
    labels, overlay, timing = _classify(client, CAT, top_k=3)
    confidences = labels["confidences"]
    assert len(confidences) == 3 and {c["label"] for c in confidences} <= set(LABELS)
    assert sum(c["confidence"] for c in confidences) <= 1.0 + 1e-6
    assert confidences == sorted(confidences, key=lambda c: -c["confidence"])
    assert Image.open(overlay).size == Image.open(CAT).size
    assert "ms" in timing


@pytest.mark.parametrize("method", ["Gradient rollout", "Raw attention"])
def test_other_explanations(server, method):
    _, client, _ = server
    _, overlay, _ = _classify(client, CAT, method=method, target="dog", layer=0, head="1")
    assert Image.open(overlay).size == Image.open(CAT).size


def _write(tmp: Path, name: str, make) -> Path:
    path = tmp / name
    make(path)
    return path


def _exif_rotated(path: Path) -> None:
    img = Image.new("RGB", (60, 30), "white")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise on display
    img.save(path, exif=exif)


def _bomb(path: Path) -> None:
    # A valid PNG header declaring 60000 x 60000 pixels, with almost no data behind it.
    buf = io.BytesIO()
    Image.new("L", (1, 1)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    data[16:24] = (60000).to_bytes(4, "big") + (60000).to_bytes(4, "big")
    path.write_bytes(bytes(data))


def _animated(path: Path) -> None:
    frames = [Image.new("P", (40, 40), i) for i in range(3)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)


HANDLED = {
    "gray.png": (lambda p: Image.new("L", (50, 40), 128).save(p), (50, 40)),
    "rgba.png": (lambda p: Image.new("RGBA", (40, 50), (255, 0, 0, 10)).save(p), (40, 50)),
    "palette.png": (lambda p: Image.new("P", (33, 33), 3).save(p), (33, 33)),
    "cmyk.jpg": (lambda p: Image.new("CMYK", (48, 48), (0, 255, 0, 0)).save(p), (48, 48)),
    "sixteen.png": (lambda p: Image.fromarray(np.full((36, 36), 40000, np.uint16)).save(p), (36, 36)),
    "one.png": (lambda p: Image.new("RGB", (1, 1), "red").save(p), (1, 1)),
    "exif.jpg": (_exif_rotated, (30, 60)),  # displayed (and classified) upright
    "animated.gif": (_animated, (40, 40)),
    "strip.png": (lambda p: Image.new("RGB", (6000, 8), "blue").save(p), (2048, 3)),  # shown downscaled
}

REFUSED = {
    "text.jpg": (lambda p: p.write_text("this is not an image"), "image"),
    "truncated.jpg": (lambda p: p.write_bytes(CAT.read_bytes()[:3000]), "truncated|corrupt|incomplete"),
    "bomb.png": (_bomb, "pixels|large|bomb"),
    "empty.png": (lambda p: p.write_bytes(b""), "empty|image"),
}


@pytest.mark.parametrize("name", sorted(HANDLED))
def test_odd_images_are_handled(server, tmp_path, name):
    _, client, _ = server
    make, size = HANDLED[name]
    _, overlay, _ = _classify(client, _write(tmp_path, name, make))
    assert Image.open(overlay).size == size


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bad_files_get_a_clear_error_and_the_app_keeps_serving(server, tmp_path, name):
    _, client, _ = server
    make, pattern = REFUSED[name]
    with pytest.raises(AppError) as err:
        _classify(client, _write(tmp_path, name, make))
    assert re.search(pattern, str(err.value), re.IGNORECASE), str(err.value)
    labels, _, _ = _classify(client, CAT)  # the next good request still succeeds
    assert labels["confidences"]


def test_32_concurrent_requests_and_memory_returns_to_baseline(server):
    proc, _, url = server
    _classify(Client(url, verbose=False), CAT)  # warm: model, buffers, caches
    baseline = _rss_mb(proc.pid)

    def one(_):
        return _classify(Client(url, verbose=False), CAT)

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(one, range(32)))
    assert all(r[0]["confidences"] for r in results)
    time.sleep(1)
    assert _rss_mb(proc.pid) - baseline < 150, "server memory kept growing after the burst"


def test_inspect_shows_figure_7_and_the_model_summary(server):
    _, client, _ = server
    filters, similarity, distance, summary = client.predict(api_name="/inspect")
    for path in (filters, similarity, distance):
        assert Image.open(path).size[0] > 200
    assert "Parameters" in summary and "208,842" in summary and "cat" in summary
    assert "test_top1" in summary  # the run's last-epoch metrics are shown


def test_unloadable_model_gives_a_clear_error_and_the_app_keeps_serving(server):
    _, client, _ = server
    with pytest.raises(AppError, match=r"Could not load .nobody/no-such-vit.*HF_HUB_OFFLINE is set"):
        _classify(client, CAT, model_choice="nobody/no-such-vit")
    labels, _, _ = _classify(client, CAT)
    assert labels["confidences"]
