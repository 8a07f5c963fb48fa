"""Round one: bursts of 49.9 MP images and zips, a flood from one client, a 1 GB upload, zips of a million
entries. Each case fills its ``Row``."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from gradio_client import Client, handle_file

from .inputs import Inputs
from .server import MB, App, Raw, Result


@dataclass
class Row:
    case: str
    served: int = 0
    refused: int = 0
    peak: int = 0  # bytes above the baseline
    after: int = 0  # bytes above the baseline, --settle seconds later
    wait: float | None = None  # the other client's, seconds
    reference: float | None = None  # the same request with the server idle
    seconds: float | None = None  # how long the answer took (uploads)
    alive: bool = True
    note: str = ""
    messages: list[str] = field(default_factory=list)
    burst: bool = True
    hostile: int = 0  # hostile requests sent, when they are not simply served + refused
    log_bytes: int = 0  # what the server logged during the case
    partial_files: int = 0  # Gradio's temporary upload files left after it
    tracebacks: int = 0  # in the server's log during the case
    disk_free: int = 0  # bytes free on the disk of the app's temporary files, after it
    orphans: int = 0  # vit-train-* folders left (the restart case)

    @property
    def requests(self) -> int:
        return self.hostile or self.served + self.refused

    def add(self, r: Result) -> None:
        if r.ok:
            self.served += 1
        else:
            self.refused += 1
            self.messages.append(r.message)


def settings(model: str, layer: int = -1) -> list:
    """classify's inputs after the image: model, method (None: the default), class, layer (the page's slider
    counts from 0), head, fusion, discard ratio, opacity, top-k."""
    return [model, None, "(predicted class)", layer, "mean", "mean", 0.0, 0.5, 5]


def _explore_inputs(model: str, layer: int = -1) -> list:
    return [model, 3000.0, 3000.0, layer, "mean", "mean", 0.0, 0.5]


def _parallel(calls: list) -> list[Result]:
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda c: c(), calls))


def case_zip64(raw: Raw, inputs: Inputs, row: Row) -> None:
    archive = inputs.zip_of_big(64)
    row.note = f"{archive.stat().st_size / MB:.1f} MB zip"
    files = [raw.upload(archive)]
    r = raw.call("batch", [files, raw.app.model, "Attention rollout", 5, 0.5])
    row.add(r)
    row.note += f"; {r.seconds:.0f} s"


def case_mixed(raw: Raw, inputs: Inputs, row: Row) -> None:
    m = raw.app.model
    img = [raw.upload(inputs.unique_big()) for _ in range(10)]
    batch16 = [raw.upload(inputs.zip_of_big(16)) for _ in range(3)]
    click = {"index": [360, 360], "value": None, "selected": True}
    calls = [
        lambda: raw.call("classify", [img[0], *settings(m)]),
        lambda: raw.call("classify_page", [img[1], *settings(m, layer=1), None]),
        lambda: raw.call("explore_picture", [img[2], m, None]),
        lambda: raw.call("explore_point", [img[3], m, None], event_data=click),
        lambda: raw.call("explore_clicked", [img[9], *_explore_inputs(m, layer=1), None]),
        lambda: raw.call("explore", [img[4], *_explore_inputs(m)]),
        lambda: raw.call("explore_page", [img[5], *_explore_inputs(m, layer=1), None]),
        lambda: raw.call("compare", [img[6], m, "(predicted class)", -1, "mean", "mean", 0.0, 0.5]),
        lambda: raw.call("compare_page", [img[7], m, "(predicted class)", 1, "mean", "mean", 0.0, 0.5, None]),
        lambda: raw.call("classify_new", [img[8], *settings(m, layer=1), None]),
        lambda: raw.call("batch", [batch16[:1], m, "Gradient rollout", 5, 0.5]),
        lambda: raw.call("batch_page", [batch16[1:2], m, "AttnLRP", 5, 0.5, None]),
        lambda: raw.call("batch_new", [batch16[2:], m, "Attention rollout", 5, 0.5, None]),
        lambda: raw.call("inspect", [m]),
        lambda: raw.call("inspect_page", [m, None]),
    ]
    t0 = time.perf_counter()
    for r in _parallel(calls):
        row.add(r)
    row.note = f"{len(calls)} listeners; {time.perf_counter() - t0:.0f} s"


def case_round(raw: Raw, inputs: Inputs, row: Row) -> None:
    images = [raw.upload(inputs.unique_big()) for _ in range(5)]
    t0 = time.perf_counter()
    for r in _parallel([lambda i=i: raw.call("classify", [i, *settings(raw.app.model)]) for i in images]):
        row.add(r)
    row.note = f"{time.perf_counter() - t0:.0f} s"


def case_flood(app: App, inputs: Inputs, row: Row) -> None:
    """100 classifies from one client, another client's a second later; returns its time alone (reference)."""
    other = Client(app.url + "/", verbose=False, httpx_kwargs={"timeout": 120})
    alone = []
    for _ in range(3):
        t0 = time.perf_counter()
        other.predict(handle_file(str(inputs.unique_cat())), api_name="/classify")
        alone.append(time.perf_counter() - t0)
    reference = sorted(alone)[1]
    flooder = Client(app.url + "/", verbose=False, max_workers=100, httpx_kwargs={"timeout": 120})
    photos = [inputs.unique_cat() for _ in range(100)]
    jobs = [flooder.submit(handle_file(str(p)), api_name="/classify") for p in photos]
    time.sleep(1.0)
    t0 = time.perf_counter()
    other.predict(handle_file(str(inputs.unique_cat())), api_name="/classify")
    waited = time.perf_counter() - t0
    for job in jobs:
        try:
            job.result(timeout=600)
            row.add(Result(True, "", 0))
        except Exception as e:
            row.add(Result(False, str(e).splitlines()[-1], 0))
    row.wait, row.reference = waited, reference


def case_upload(app: App, size: int, row: Row) -> None:
    """``size`` bytes of zeros uploaded as one file, streamed (the client never holds it)."""
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.bin"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body():
        yield head
        chunk = bytes(MB)
        for _ in range(size // MB):
            yield chunk
        yield tail

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    headers["Content-Length"] = str(len(head) + size + len(tail))
    before = _disk(app.gradio_tmp)
    t0 = time.perf_counter()
    try:
        r = httpx.post(f"{app.url}/gradio_api/upload", content=body(), headers=headers, timeout=600)
        ok, text = r.status_code == 200, f"HTTP {r.status_code}: {r.text[:80]}"
    except httpx.HTTPError as e:
        ok, text = False, f"{type(e).__name__} (connection closed by the server)"
    row.seconds = time.perf_counter() - t0
    row.add(Result(ok, text, row.seconds))
    kept = _disk(app.gradio_tmp) - before
    row.note = f"answered in {row.seconds:.2f} s; {kept / MB:+.0f} MB in the upload cache"


def _disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def case_entries(raw: Raw, inputs: Inputs, n: int, row: Row) -> None:
    archive = inputs.zip_of_entries(n)
    size = archive.stat().st_size
    t0 = time.perf_counter()
    try:
        files = [raw.upload(archive)]
    except httpx.HTTPStatusError as e:
        row.add(Result(False, f"upload refused: HTTP {e.response.status_code}", 0))
        row.note = f"{size / MB:.0f} MB; upload refused in {time.perf_counter() - t0:.2f} s"
        return
    r = raw.call("batch", [files, raw.app.model, "Attention rollout", 5, 0.5])
    summary = str(r.output[2]) if r.ok and r.output else r.message
    row.add(Result(r.ok and not summary.startswith("0 image"), summary, r.seconds))
    row.note = f"{size / MB:.0f} MB; answered in {r.seconds:.2f} s: {summary}"
