"""The app as a user reaches it: ``python app.py`` on 127.0.0.1, driven with gradio_client: every named
endpoint (/classify, /explore, /compare, /batch, /inspect), bad input, concurrency and memory."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError, ValidationError
from PIL import Image

import vit_core
from vit_core.data import build_transform
from webapp.inference import estimates
from webapp.inference.model_info import format_count
from webapp.registry.catalog import BUNDLED
from webapp.tabs import batch, classify, compare, explore
from webapp.ui.endpoints import Prepared

from .net import free_port
from .rss import peak_above, reset_peak, rss_mb
from .test_admission import estimating

ROOT = Path(__file__).resolve().parents[1]
CAT = ROOT / "examples" / "cat_chelsea.jpg"
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
HEADS = json.loads((BUNDLED / "config.json").read_text())["model_args"]["num_heads"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app as the README launches it: the bundled default model, no network. Its output goes to a file
    (``server_log``): a pipe nobody reads would block the server once its buffer filled."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    log = tmp_path_factory.mktemp("server") / "app.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port), "--concurrency", "2"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    proc.log = log
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 600  # a shared 2-core machine can take minutes to import torch and gradio
    client = None
    while time.time() < deadline and client is None:
        if proc.poll() is not None:
            pytest.fail(f"app exited with {proc.returncode}:\n{server_log(proc)}")
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


def server_log(proc: subprocess.Popen, tail: int = 4000) -> str:
    """The last ``tail`` characters the ``server`` fixture's app has printed."""
    return proc.log.read_text(errors="replace")[-tail:]


def _unique_cat(i: int) -> Path:
    """The cat photo with a JPEG comment of its own: the same pixels in a file the server has not seen."""
    data, comment = CAT.read_bytes(), f"{os.getpid()}-{time.time()}-{i}".encode()
    path = Path(tempfile.mkdtemp()) / f"cat{i}.jpg"
    path.write_bytes(data[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + data[2:])
    return path


def _classify(client: Client, path: Path | str, **kwargs):
    return client.predict(handle_file(str(path)), api_name="/classify", **kwargs)


def _same_width_with_colour_bar(overlay: str, size: tuple[int, int]) -> None:
    """Overlays are the image (downscaled past 2048 px) with a colour bar strip below it."""
    w, h = Image.open(overlay).size
    assert w == size[0] and size[1] < h <= size[1] + 80


def test_classify_a_real_photo(server):
    _, client, _ = server
    labels, overlay, compute_ms, verdict, explains, ood = _classify(client, CAT, top_k=3)
    confidences = labels["confidences"]
    assert len(confidences) == 3 and {c["label"] for c in confidences} <= set(LABELS)
    assert sum(c["confidence"] for c in confidences) <= 1.0 + 1e-6
    assert confidences == sorted(confidences, key=lambda c: -c["confidence"])
    _same_width_with_colour_bar(overlay, Image.open(CAT).size)
    assert isinstance(compute_ms, float) and 0 < compute_ms < 60_000
    top, p = confidences[0]["label"], confidences[0]["confidence"]
    assert verdict == f"{top} ({p:.0%})" if p >= 0.5 else verdict.startswith("Not sure — ")
    assert explains == f"Map explains: {top} (the predicted class)"  # AttnLRP, the default: class-specific
    # the "none of my classes" check in numbers: the bundled model's detector, the threshold stored with it
    stored = json.loads((BUNDLED / "config.json").read_text())["calibration"]["ood"]
    assert ood["score"] == stored["score"] and ood["threshold"] == pytest.approx(stored["threshold"])
    assert ood["none_of_my_classes"] is (ood["ood_score"] > ood["threshold"]) is False  # a cat is one of its classes
    # the same decision as the page's, with its reason in words (empty for a plain answer)
    if p >= 0.5:
        assert (ood["decision"], ood["reason"]) == ("answer", "")
    else:
        assert ood["decision"] in ("torn", "not sure") and ood["reason"] and verdict.endswith(f"\n\n{ood['reason']}")


@pytest.mark.parametrize("method", ["RISE (random masks)", "Gradient rollout", "Raw attention"])
def test_other_explanations(server, method):
    _, client, _ = server
    labels, overlay, _, _, explains, _ = _classify(client, CAT, method=method, target="dog", layer=0, head="1")
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
    [  # sliders are checked by Gradio against their range, the rest by the app (webapp.ui.inputs says why)
        (dict(layer=99), r"layer must be 0\.\.1 for this 2-layer model \(0 = first\), or -1\.\.-2 from the end"),
        (dict(layer=-3), "layer must be 0..1"),
        (dict(head="7"), rf"head must be 'mean' or 0\.\.{HEADS - 1}"),
        (dict(head="x"), "head must be"),
        (dict(target="zebra", method="Gradient rollout"), "'zebra' is not a class of this model"),
        (dict(opacity=3), "greater than maximum value 1"),
        (dict(discard_ratio=1.5), "greater than maximum value 0.99"),
        (dict(method="Saliency"), "method must be one of RISE .*, got 'Saliency'"),
        (dict(head_fusion="median"), "head fusion must be one of mean, max, min, got 'median'"),
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


def test_40_concurrent_requests_and_memory_returns_to_baseline(server):
    """40 clients at once from one address: at most 32 of its requests wait or compute at once (the others
    are refused at once, saying why), every admitted one is served, and memory returns."""
    proc, _, url = server
    _classify(Client(url, verbose=False), CAT)  # warm: model, buffers, caches
    baseline = rss_mb(proc.pid)

    clients = [Client(url, verbose=False, httpx_kwargs={"timeout": 300}) for _ in range(40)]  # connected first

    def one(client):
        try:
            return _classify(client, CAT)[0]["confidences"]
        except ValidationError as e:
            assert "This address has 32 requests waiting or running" in str(e), str(e)
            return None

    with ThreadPoolExecutor(max_workers=40) as pool:
        results = list(pool.map(one, clients))
    assert sum(r is not None for r in results) >= 32  # the first 32 to join are all admitted
    time.sleep(1)
    assert rss_mb(proc.pid) - baseline < 150, "server memory kept growing after the burst"


_BIG_PNG: list[bytes] = []


def _unique_big_png(tmp: Path, name: str) -> Path:
    """A one-colour 7063x7063 PNG (49.9 MP in 161 KB) with a text chunk of its own: a file never sent before."""
    if not _BIG_PNG:
        buf = io.BytesIO()
        Image.new("RGB", (7063, 7063), (200, 30, 60)).save(buf, "PNG")
        _BIG_PNG.append(buf.getvalue())
    data, text = _BIG_PNG[0], b"Comment\x00" + name.encode()
    chunk = struct.pack(">I", len(text)) + b"tEXt" + text + struct.pack(">I", zlib.crc32(b"tEXt" + text))
    path = tmp / name
    path.write_bytes(data[:-12] + chunk + data[-12:])  # before IEND
    return path


def test_the_memory_estimate_bounds_the_peak_of_real_requests(server, tmp_path):
    """The admission gate's estimate (``webapp.inference.estimates``) of each request, against the server's measured
    peak RSS above where it stood (VmHWM, reset before each): 49.9 MP uploads to /classify (AttnLRP, the
    default), /explore and /compare, a batch of three of them, and a small photo. The estimate bounds each (10%
    tolerance) and is not loose by more than 3x."""
    proc, client, _ = server
    model = vit_core.from_pretrained(BUNDLED).eval()
    ctx = estimating(model, build_transform(model.pretrained_cfg))
    archive = tmp_path / "three.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i in range(3):
            z.write(_unique_big_png(tmp_path, f"z{i}.png"), f"{i}.png")
    big = [_unique_big_png(tmp_path, f"b{i}.png") for i in range(3)]
    small = _unique_cat(0)
    cases = {
        "classify 49.9 MP": (
            lambda: _classify(client, big[0]),
            lambda args: classify.estimate(ctx, Prepared(args)),
            {"image": big[0]},
        ),
        "explore 49.9 MP": (
            lambda: client.predict(handle_file(str(big[1])), x=3000, y=3000, api_name="/explore"),
            lambda args: explore.estimate(ctx, Prepared(args)),
            {"image": big[1]},
        ),
        "compare 49.9 MP": (
            lambda: client.predict(handle_file(str(big[2])), api_name="/compare"),
            lambda args: compare.estimate(ctx, Prepared(args)),
            {"image": big[2]},
        ),
        "batch of three": (
            lambda: client.predict([handle_file(str(archive))], api_name="/batch"),
            lambda args: batch.estimate(ctx, Prepared(args)),
            {"method": "Attention rollout"},
        ),
        "classify 451x300": (
            lambda: _classify(client, small),
            lambda args: classify.estimate(ctx, Prepared(args)),
            {"image": small},
        ),
    }
    for name, (request, cost, arguments) in cases.items():
        estimate = cost({"model_choice": "bundled", **{k: str(v) for k, v in arguments.items()}})
        time.sleep(0.5)  # the previous response's last bytes
        before = reset_peak(proc.pid)
        request()
        peak = peak_above(proc.pid, before)
        print(f"{name}: peak {peak / 2**20:.0f} MB, estimate {estimate / 2**20:.0f} MB")
        assert peak <= 1.1 * estimate, (name, peak >> 20, estimate >> 20)
        assert estimate <= 3 * peak + estimates.REQUEST_BYTES, (name, peak >> 20, estimate >> 20)


def test_one_client_cannot_fill_the_queue_and_another_is_served_first(server):
    """Twenty classifies at once from one client: at most sixteen wait or compute (the rest are refused at once,
    saying why); another client's request joins ahead of that client's waiting ones (round robin), so it
    is answered before the first client's last one."""
    _, _, url = server
    flooder, other = Client(url, verbose=False, max_workers=20), Client(url, verbose=False)
    photos = [_unique_cat(i) for i in range(21)]
    done: list[tuple[float, str]] = []
    jobs = [flooder.submit(handle_file(str(p)), api_name="/classify") for p in photos[:20]]
    for job in jobs:
        job.add_done_callback(lambda j: done.append((time.monotonic(), "flood")))
    time.sleep(1.0)  # the flood has joined the queue
    labels, *_ = _classify(other, photos[20])
    answered = time.monotonic()
    assert labels["confidences"]
    served, refused = 0, []
    for job in jobs:
        try:
            served += bool(job.result(timeout=300)[0]["confidences"])
        except ValidationError as e:
            refused.append(str(e))
    assert served >= 16 and refused and served + len(refused) == 20
    assert all("You have 16 requests waiting or running" in m for m in refused), refused[0]
    assert answered < max(t for t, _ in done)  # ahead of the flooder's last admitted request


def test_uploads_over_the_limit_are_refused_as_they_arrive(server):
    """``--max-file-mb`` (default 64): a 65 MB upload gets 413 once the first 64 MB have arrived."""
    _, _, url = server
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    body = head + bytes(65 << 20) + f"\r\n--{boundary}--\r\n".encode()
    r = httpx.post(
        f"{url}gradio_api/upload",
        content=body,
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        timeout=120,
    )
    assert r.status_code == 413 and "maximum allowed size of 67108864 bytes" in r.text


def _headers_only(url: str, headers: str) -> str:
    """Send a POST to the upload route with these headers and no body; the status line of the answer."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"POST /gradio_api/upload HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n".encode())
        return s.recv(4096).decode().splitlines()[0]


def test_uploads_too_large_or_of_unknown_length_are_refused_from_their_headers(server):
    """An upload declaring 1 GB is refused before a byte of it is sent (the batch reads 256 MB at most); one
    that does not declare its length at all (chunked) too."""
    _, _, url = server
    form = "Content-Type: multipart/form-data; boundary=x\r\n"
    assert _headers_only(url, form + f"Content-Length: {1 << 30}\r\n").startswith("HTTP/1.1 413")
    assert _headers_only(url, form + "Transfer-Encoding: chunked\r\n").startswith("HTTP/1.1 411")


def test_inspect_shows_figure_7_and_the_model_summary(server):
    _, client, _ = server
    filters, similarity, distance, summary = client.predict(api_name="/inspect")
    for path in (filters, similarity, distance):
        assert Image.open(path).size[0] > 200
    n = vit_core.from_pretrained(BUNDLED).num_params()
    assert f"| Parameters | {n:,} ({format_count(n)}) |" in summary and "cat" in summary
    assert summary.startswith("| Property | Value |")  # a real header, not an empty row
    # the accuracy measured on the whole test split (as the README says), and the run in words
    views = vit_core.from_pretrained(BUNDLED).calibration.tta  # the views the app averages for it
    single, shown = (json.loads((BUNDLED / f"eval_test{tta}.json").read_text()) for tta in ("", f"_{views}"))
    measured = f"{single['top1']:.2f}% top-1 ({single['top5']:.2f}% top-5) on the 10,000 images of the cifar10 test"
    assert f"| Accuracy (measured) | {measured}" in summary
    how = "flip averaging" if views == "flip" else f"{views} views"
    assert f"{shown['top1']:.2f}% top-1 ({shown['top5']:.2f}% top-5) with {how}, as this app predicts" in summary
    last = json.loads((BUNDLED / "metrics.jsonl").read_text().splitlines()[-1])
    top1 = last.get("ema_test_top1", last["test_top1"])  # the weight average's when there is one
    assert f"{top1:.2f}% on the 2,000 test images checked each epoch" in summary
    assert "train_top1" not in summary
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
    assert len(gallery) == 7 and "class" in text
    assert [row[0] for row in table["data"]] == [
        "RISE (random masks)",
        "AttnLRP",
        "Attention rollout",
        "Gradient rollout",
        "Chefer et al. (LRP x gradient)",
        "Raw attention",
        "Centre Gaussian (baseline: ignores the image)",
    ]
    for item, row in zip(gallery, table["data"], strict=True):
        assert 0 <= row[1] <= 1 and 0 <= row[2] <= 1
        found = re.fullmatch(r".*: deletion (\S+), insertion ([\d.]+)(?:; ([\d,.]+ ms))?", item["caption"])
        deletion, insertion, took = found.groups()
        assert item["caption"].startswith(row[0]) and abs(float(deletion) - row[1]) < 1e-3
        assert abs(float(insertion) - row[2]) < 1e-3 and len(row) == 3
        assert bool(took) is (row[0] != "Centre Gaussian (baseline: ignores the image)")  # the time the map took
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
    assert len(gallery) == 3 and note == "3 image(s) classified, 1 skipped (see the CSV); maps: AttnLRP"
    assert gallery[0]["caption"].startswith("cat_chelsea.jpg: ")
    rows = Path(csv_path).read_text().splitlines()
    header = "file,prediction,unsure,none_of_my_classes,ood_score,class_1,p_1,class_2,p_2,class_3,p_3,error"
    assert rows[0] == header
    # the bundled model has a "none of my classes" detector: the cat is one of its classes, with its score
    cat = rows[1].split(",")
    threshold = json.loads((BUNDLED / "config.json").read_text())["calibration"]["ood"]["threshold"]
    assert cat[3] == "False" and 0 < float(cat[4]) < threshold, cat  # the stored threshold
    assert [r.split(",")[0] for r in rows[1:]] == [
        "cat_chelsea.jpg",
        "photos.zip/nested/cat.jpg",
        "photos.zip/../../../tmp/evil.jpg",
        "photos.zip/broken.png",
    ]
    assert rows[1].split(",")[5] in LABELS and "not an image" in rows[4]
    with pytest.raises(AppError, match="Upload"):
        client.predict([], api_name="/batch")
    with pytest.raises(AppError, match="RISE .* is on the Classify tab"):  # hundreds of passes per image: not here
        client.predict([handle_file(str(CAT))], method="RISE (random masks)", api_name="/batch")


def test_unloadable_model_gives_a_clear_error_and_the_app_keeps_serving(server):
    _, client, _ = server
    deadline = time.time() + 300
    with pytest.raises(
        AppError, match=r"Could not load .nobody/no-such-vit.: it needs the Hub, and this server is offline"
    ):
        while True:  # a request waits a moment for a load, then answers "still loading": ask again
            try:
                _classify(client, CAT, model_choice="nobody/no-such-vit")
            except AppError as e:
                if "still loading" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(1)
    labels, *_ = _classify(client, CAT)
    assert labels["confidences"]


def test_the_docs_api_examples_run_as_written(server, monkeypatch, capsys):
    """The README's and docs/app.md's gradio_client blocks (marked ``docs-test: app``), run against this server
    from the repository root with only the address changed."""
    from .test_docs import code_blocks

    _, _, url = server
    blocks = [(doc, code) for doc, marker, code in code_blocks("python") if marker == "app"]
    assert {doc for doc, _ in blocks} == {"README.md", "docs/app.md"}
    monkeypatch.chdir(ROOT)
    for doc, code in blocks:
        assert "http://127.0.0.1:7860/" in code
        exec(compile(code.replace("http://127.0.0.1:7860/", url), doc, "exec"), {})
    assert "cat (" in capsys.readouterr().out  # the README prints the verdict on the example cat


def test_the_docs_train_example_runs_as_written(server, monkeypatch, tmp_path, capsys):
    """docs/app.md's ``/train`` block (marked ``docs-test: train``), run in a folder holding its ``photos.zip``
    (ants and bees as colours) and ``photos/ants/1.jpg``, with only the address changed: the model's value is read
    where the page says, and /classify answers with it in the zip's classes."""
    from .test_docs import marked_block

    _, _, url = server
    code = marked_block("train")
    (tmp_path / "photos" / "ants").mkdir(parents=True)
    Image.new("RGB", (40, 40), (200, 30, 10)).save(tmp_path / "photos" / "ants" / "1.jpg")
    with zipfile.ZipFile(tmp_path / "photos.zip", "w") as zf:
        for i in range(8):
            for name, colour in (("ants", (200 + 5 * i, 20 * i, 10)), ("bees", (10, 20 * i, 200 + 5 * i))):
                buf = io.BytesIO()
                Image.new("RGB", (40, 40), colour).save(buf, "JPEG")
                zf.writestr(f"photos/{name}/{i}.jpg", buf.getvalue())
    monkeypatch.chdir(tmp_path)
    before = set((ROOT / "runs").glob("app-*"))
    try:
        exec(compile(code.replace("http://127.0.0.1:7860/", url), "docs/app.md", "exec"), {})
    finally:
        for run in set((ROOT / "runs").glob("app-*")) - before:  # a local server writes its runs there
            shutil.rmtree(run)
    out = capsys.readouterr().out
    assert "Done." in out and ("ants" in out.splitlines()[-1] or "bees" in out.splitlines()[-1]), out[-2000:]
