"""The app as a user reaches it: ``python app.py`` on 127.0.0.1, driven with gradio_client: every named
endpoint (/classify, /explore, /compare, /batch, /inspect), bad input, concurrency and memory."""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import time
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

import vit_core
from webapp.catalog import BUNDLED
from webapp.model_info import format_count

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
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 600  # a shared 2-core machine can take minutes to import torch and gradio
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
        pytest.fail("app did not start within 600 s")
    yield proc, client, url
    proc.terminate()
    proc.wait(timeout=30)


def _classify(client: Client, path: Path | str, **kwargs):
    return client.predict(handle_file(str(path)), api_name="/classify", **kwargs)


def _same_width_with_colour_bar(overlay: str, size: tuple[int, int]) -> None:
    """Overlays are the image (downscaled past 2048 px) with a colour bar strip below it."""
    w, h = Image.open(overlay).size
    assert w == size[0] and size[1] < h <= size[1] + 80


def test_classify_a_real_photo(server):
    _, client, _ = server
    labels, overlay, compute_ms, verdict, explains = _classify(client, CAT, top_k=3)
    confidences = labels["confidences"]
    assert len(confidences) == 3 and {c["label"] for c in confidences} <= set(LABELS)
    assert sum(c["confidence"] for c in confidences) <= 1.0 + 1e-6
    assert confidences == sorted(confidences, key=lambda c: -c["confidence"])
    _same_width_with_colour_bar(overlay, Image.open(CAT).size)
    assert isinstance(compute_ms, float) and 0 < compute_ms < 60_000
    top, p = confidences[0]["label"], confidences[0]["confidence"]
    assert verdict == f"{top} ({p:.0%})" if p >= 0.5 else verdict.startswith(f"Not sure — maybe {top} (")
    assert explains == f"Map explains: {top} (the predicted class)"  # RISE, the default: class-specific


@pytest.mark.parametrize("method", ["RISE (random masks)", "Gradient rollout", "Raw attention"])
def test_other_explanations(server, method):
    _, client, _ = server
    labels, overlay, _, _, explains = _classify(client, CAT, method=method, target="dog", layer=0, head="1")
    _same_width_with_colour_bar(overlay, Image.open(CAT).size)
    if method != "Raw attention":  # the class the map explains is named, with the prediction
        assert explains.startswith("Map explains: dog (") and labels["label"] in explains
    else:
        assert explains.startswith(f"Map explains: {labels['label']}")


def test_settings_changes_reuse_the_forward_pass_and_change_the_map(server):
    _, client, _ = server
    first = _classify(client, CAT, opacity=0.2)
    again = _classify(client, CAT, opacity=0.9)
    assert first[0] == again[0]  # same prediction
    assert not np.array_equal(np.asarray(Image.open(first[1])), np.asarray(Image.open(again[1])))


@pytest.mark.parametrize(
    ("setting", "pattern"),
    [  # sliders and radios are checked by Gradio against their range and choices, the rest by the app
        (dict(layer=99), r"layer must be 0\.\.1 for this 2-layer model \(0 = first\), or -1\.\.-2 from the end"),
        (dict(layer=-3), "layer must be 0..1"),
        (dict(head="7"), r"head must be 'mean' or 0\.\.2"),
        (dict(head="x"), "head must be"),
        (dict(target="zebra", method="Gradient rollout"), "'zebra' is not a class of this model"),
        (dict(opacity=3), "greater than maximum value 1"),
        (dict(discard_ratio=1.5), "greater than maximum value 0.99"),
        (dict(method="Saliency"), "not in the list of choices"),
        (dict(head_fusion="median"), "not in the list of choices"),
        (dict(top_k=0), "less than minimum value 1"),
    ],
)
def test_bad_settings_are_refused_with_the_valid_range(server, setting, pattern):
    _, client, _ = server
    with pytest.raises(AppError, match=pattern):
        _classify(client, CAT, **setting)


def _write(tmp: Path, name: str, make) -> Path:
    path = tmp / name
    make(path)
    return path


def _exif_rotated(path: Path) -> None:
    img = Image.new("RGB", (60, 30), "white")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise on display
    img.save(path, exif=exif)


def _declaring(side: int):
    """A valid PNG whose header declares ``side`` x ``side`` pixels (its checksum right), with almost no data
    behind it: refused from the header, before anything is decoded."""

    def make(path: Path) -> None:
        buf = io.BytesIO()
        Image.new("L", (1, 1)).save(buf, "PNG")
        data = bytearray(buf.getvalue())
        data[16:24] = side.to_bytes(4, "big") * 2  # IHDR's width and height
        data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")  # IHDR's CRC, over its type and data
        path.write_bytes(bytes(data))

    return make


def _animated(path: Path) -> None:
    frames = [Image.new("P", (40, 40), i) for i in range(3)]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)


# (make, size shown): images under 256 px are shown enlarged by a whole factor to at least 256 px
HANDLED = {
    "gray.png": (lambda p: Image.new("L", (50, 40), 128).save(p), (300, 240)),
    "rgba.png": (lambda p: Image.new("RGBA", (40, 50), (255, 0, 0, 10)).save(p), (240, 300)),
    "palette.png": (lambda p: Image.new("P", (33, 33), 3).save(p), (264, 264)),
    "cmyk.jpg": (lambda p: Image.new("CMYK", (48, 48), (0, 255, 0, 0)).save(p), (288, 288)),
    "sixteen.png": (lambda p: Image.fromarray(np.full((36, 36), 40000, np.uint16)).save(p), (288, 288)),
    "one.png": (lambda p: Image.new("RGB", (1, 1), "red").save(p), (256, 256)),  # not a 1-pixel speck
    "exif.jpg": (_exif_rotated, (150, 300)),  # displayed (and classified) upright
    "animated.gif": (_animated, (280, 280)),
    "strip.png": (lambda p: Image.new("RGB", (6000, 8), "blue").save(p), (2048, 3)),  # shown downscaled
}

REFUSED = {
    "text.jpg": (lambda p: p.write_text("this is not an image"), "image"),
    "truncated.jpg": (lambda p: p.write_bytes(CAT.read_bytes()[:3000]), "truncated|corrupt|incomplete"),
    # over this server's 50 megapixels (not "raise max_pixels": a visitor cannot), and over Pillow's own limit
    "large.png": (_declaring(8000), "8000x8000 pixels is more than this server accepts"),
    "huge.png": (_declaring(60000), "too many pixels to decode safely"),
    "empty.png": (lambda p: p.write_bytes(b""), "empty|image"),
}


@pytest.mark.parametrize("name", sorted(HANDLED))
def test_odd_images_are_handled(server, tmp_path, name):
    _, client, _ = server
    make, size = HANDLED[name]
    _, overlay, *_ = _classify(client, _write(tmp_path, name, make))
    _same_width_with_colour_bar(overlay, size)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bad_files_get_a_clear_error_and_the_app_keeps_serving(server, tmp_path, name):
    _, client, _ = server
    make, pattern = REFUSED[name]
    with pytest.raises(AppError) as err:
        _classify(client, _write(tmp_path, name, make))
    assert re.search(pattern, str(err.value), re.IGNORECASE), str(err.value)
    labels, *_ = _classify(client, CAT)  # the next good request still succeeds
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
    n = vit_core.from_pretrained(BUNDLED).num_params()
    assert f"| Parameters | {n:,} ({format_count(n)}) |" in summary and "cat" in summary
    assert summary.startswith("| Property | Value |")  # a real header, not an empty row
    # the accuracy measured on the whole test split (as the README says), and the run in words
    assert (
        "| Accuracy (measured) | 90.14% top-1 (99.53% top-5) on the 10,000 images of the cifar10 test split" in summary
    )
    assert "91.01% top-1 (99.66% top-5) with flip averaging, as this app predicts" in summary
    assert "89.70% on the 2,000 test images checked each epoch" in summary and "train_top1" not in summary
    if (BUNDLED / "curves.png").is_file():
        assert "![curves](data:image/png;base64," in summary  # the card's images display


def test_every_endpoint_and_output_has_a_name(server):
    _, client, _ = server
    api = client.view_api(return_format="dict", print_info=False)
    named = api["named_endpoints"]
    assert {"/classify", "/explore", "/compare", "/batch", "/inspect"} <= set(named)
    assert not api["unnamed_endpoints"]
    for name, endpoint in named.items():
        for value in endpoint["parameters"] + endpoint["returns"]:
            assert value["label"] and not re.match(r"value_\d+", value["label"]), (name, value)
    returns = {r["label"]: r for r in named["/classify"]["returns"]}
    assert returns["Compute time (ms): decode, model, map"]["type"]["type"] == "number"


# ------------------------------------------------------------------------------------------ explorer


def test_explore_shows_the_patch_under_the_point(server):
    _, client, _ = server
    w, h = Image.open(CAT).size  # 451 x 300; the bundled model squashes the whole photo to its input
    results = {}
    for x, y in [(5, 5), (w - 5, h - 5)]:
        attention, rollout, heads, text = client.predict(
            handle_file(str(CAT)), x=x, y=y, layer=-1, head="mean", api_name="/explore"
        )
        assert "token grid" in text
        for path in (attention, rollout, heads):
            assert Image.open(path).size[0] >= 300
        results[x] = (np.asarray(Image.open(attention)), text)
    (a1, t1), (a2, t2) = results.values()
    assert t1.startswith("Patch at row 1, column 1 ") and t2 != t1
    assert not np.array_equal(a1, a2)


def test_explore_refuses_points_outside_the_crop_and_bad_layers(server):
    _, client, _ = server
    with pytest.raises(AppError, match="outside the region"):
        client.predict(handle_file(str(CAT)), x=-5, y=150, api_name="/explore")
    with pytest.raises(AppError, match="layer must be 0..1"):
        client.predict(handle_file(str(CAT)), x=225, y=150, layer=50, api_name="/explore")
    with pytest.raises(AppError, match="head must be"):
        client.predict(handle_file(str(CAT)), x=225, y=150, head="9", api_name="/explore")


def test_compare_scores_each_method_against_the_centre_baseline(server):
    _, client, _ = server
    gallery, table, text = client.predict(handle_file(str(CAT)), api_name="/compare")
    assert len(gallery) == 5 and "class" in text
    assert [row[0] for row in table["data"]] == [
        "RISE (random masks)",
        "Attention rollout",
        "Gradient rollout",
        "Raw attention",
        "Centre Gaussian (baseline: ignores the image)",
    ]
    for item, row in zip(gallery, table["data"], strict=True):
        assert 0 <= row[1] <= 1 and 0 <= row[2] <= 1
        deletion, insertion = map(float, re.fullmatch(r".*: deletion (\S+), insertion (\S+)", item["caption"]).groups())
        assert item["caption"].startswith(row[0]) and abs(deletion - row[1]) < 1e-3 and abs(insertion - row[2]) < 1e-3
        assert Image.open(item["image"]).size[0] >= 300


# ------------------------------------------------------------------------------------------- batch


def test_batch_of_files_and_a_zip_gives_a_gallery_and_a_csv(server, tmp_path):
    _, client, _ = server
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(CAT, "nested/cat.jpg")
        z.write(CAT, "../../../tmp/evil.jpg")  # only a name: nothing is extracted
        z.writestr("readme.txt", "skipped: not an image")
        z.writestr("broken.png", b"not a png")
    gallery, csv_path, note = client.predict(
        [handle_file(str(CAT)), handle_file(str(archive))], top_k=3, api_name="/batch"
    )
    assert len(gallery) == 3 and note == "3 image(s) classified, 1 skipped (see the CSV); maps: Attention rollout"
    assert gallery[0]["caption"].startswith("cat_chelsea.jpg: ")
    rows = Path(csv_path).read_text().splitlines()
    assert rows[0] == "file,prediction,unsure,class_1,p_1,class_2,p_2,class_3,p_3,error"
    assert [r.split(",")[0] for r in rows[1:]] == [
        "cat_chelsea.jpg",
        "photos.zip/nested/cat.jpg",
        "photos.zip/../../../tmp/evil.jpg",
        "photos.zip/broken.png",
    ]
    assert rows[1].split(",")[3] in LABELS and "not an image" in rows[4]
    with pytest.raises(AppError, match="Upload"):
        client.predict([], api_name="/batch")
    with pytest.raises(AppError, match="not in the list of choices"):  # hundreds of passes per image: not here
        client.predict([handle_file(str(CAT))], method="RISE (random masks)", api_name="/batch")


def test_unloadable_model_gives_a_clear_error_and_the_app_keeps_serving(server):
    _, client, _ = server
    deadline = time.time() + 300
    with pytest.raises(AppError, match=r"Could not load .nobody/no-such-vit.*HF_HUB_OFFLINE is set"):
        while True:  # a request waits a moment for a load, then answers "still loading": ask again
            try:
                _classify(client, CAT, model_choice="nobody/no-such-vit")
            except AppError as e:
                if "still loading" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(1)
    labels, *_ = _classify(client, CAT)
    assert labels["confidences"]
