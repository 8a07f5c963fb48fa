"""The public app under hostile load, in a memory cgroup of its own: does it hold, and does it give back?

    python -m bench.hostile [--quick] [--cap-mb 5120] [--public] [--settle 30] [--app-args "--concurrency 4"]

Starts ``python app.py --model bundled`` (no network) as a subprocess inside a cgroup v1 memory controller
capped at ``--cap-mb`` (created under /sys/fs/cgroup/memory and removed at the end; without a writable one
it says so and runs uncapped), then sends, over plain HTTP (every listener, the UI-only ones included) and
``gradio_client``:

1. a 9.3 MB zip of 64 one-colour 7063x7063 PNGs (49.9 MP each) to /batch;
2. a mixed burst of 49.9 MP requests to every compute listener at once, the API's and the page's (/classify, the
   page's classify on a setting and on a new image, the explorer's picture, a click, /explore, the page's
   redraws after a click and after a setting, /compare and the page's, three 16-image batches (/batch, the
   button, new files), /inspect and the page's);
3. four rounds of five 49.9 MP classifies at once (two with ``--quick``);
4. 100 classifies at once from one client, and one from another client a second later (timed against the
   same request with the server idle: the reference);
5. a 1 GB upload;
6. a zip of 1,000,000 empty entries (88 MB), and one of 200,000 (15 MB, under the upload limit).

For each: requests served / refused, the peak RSS above the idle baseline (VmHWM, reset before each case),
the RSS ``--settle`` seconds later, the other client's wait, and whether the server is alive. Targets:
alive through all; peak above baseline <= 1.5 GB for every burst; RSS after a burst <= baseline +
max(20%, 300 MB); the other client answered within 10 s during the flood; the 1 GB upload refused at once.
Every request sends an image the server has not seen (a PNG text chunk or a JPEG comment makes each file
unique), so the cache of analyses answers none of them.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from gradio_client import Client, handle_file
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CAT = ROOT / "examples" / "cat_chelsea.jpg"
SIDE = 7063  # 49.9 MP
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
MB = 2**20
PEAK_TARGET = 1536 * MB


# ---------------------------------------------------------------------------------------------- inputs


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


class Inputs:
    """The files the attacks send, in a temporary folder; each ``unique_*`` call gives a file never sent before."""

    def __init__(self, folder: Path) -> None:
        self.folder, self._n = folder, 0
        buf = io.BytesIO()
        Image.new("RGB", (SIDE, SIDE), (200, 30, 60)).save(buf, "PNG")
        self.big = buf.getvalue()  # one colour: 161 KB that decode to 49.9 MP
        self.cat = CAT.read_bytes()

    def _write(self, data: bytes, suffix: str) -> Path:
        self._n += 1
        path = self.folder / f"f{self._n:05d}{suffix}"
        path.write_bytes(data)
        return path

    def unique_big(self) -> Path:
        """The 49.9 MP PNG with a text chunk of its own before IEND: same pixels, new file."""
        text = _png_chunk(b"tEXt", b"Comment\x00" + uuid.uuid4().hex.encode())
        return self._write(self.big[:-12] + text + self.big[-12:], ".png")

    def unique_cat(self) -> Path:
        """The cat photo with a JPEG comment of its own after SOI."""
        comment = uuid.uuid4().hex.encode()
        return self._write(
            self.cat[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + self.cat[2:], ".jpg"
        )

    def zip_of_big(self, n: int) -> Path:
        path = self.folder / f"big{n}-{uuid.uuid4().hex[:6]}.zip"
        with zipfile.ZipFile(path, "w") as z:
            for i in range(n):
                z.writestr(f"img{i:02d}.png", self.unique_big().read_bytes())
        return path

    def zip_of_entries(self, n: int) -> Path:
        """A zip of ``n`` empty entries named with 6 digits, ZIP64 end records (over 65,535 entries)."""
        local, central = struct.Struct("<4s5H3L2H"), struct.Struct("<4s6H3L5H2L")
        out = bytearray()
        directory = bytearray()
        for i in range(n):
            name = f"{i:06d}".encode()
            offset = len(out)
            out += local.pack(b"PK\x03\x04", 20, 0, 0, 0, 0x21, 0, 0, 0, len(name), 0) + name
            directory += central.pack(b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, 0, 0, 0, len(name), 0, 0, 0, 0, 0, offset)
            directory += name
        start, size = len(out), len(directory)
        out += directory
        record = len(out)
        out += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, size, start)
        out += struct.pack("<4sLQL", b"PK\x06\x07", 0, record, 1)
        out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
        return self._write(bytes(out), ".zip")


# ------------------------------------------------------------------------------------------ the server


class Cgroup:
    """A cgroup v1 memory controller of our own, capped at ``limit`` bytes; ``None`` path when not writable."""

    def __init__(self, limit: int) -> None:
        self.path: Path | None = CGROUP_ROOT / f"vit_core_hostile_{os.getpid()}"
        try:
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            self.note = f"in its own memory cgroup capped at {limit / MB:,.0f} MB ({self.path})"
        except OSError as e:
            self.path = None
            self.note = (
                f"NOT capped: cannot create a cgroup v1 memory controller under {CGROUP_ROOT} ({e.strerror}); "
                "run as root on a machine with a writable cgroup v1 memory hierarchy to cap it"
            )

    def enter(self) -> None:
        """In the child before exec: move this process into the cgroup."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        if self.path is None:
            return 0
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """``python app.py --model bundled`` in ``cgroup``, its temporary files under ``tmp``."""

    def __init__(self, cgroup: Cgroup, tmp: Path, extra: list[str]) -> None:
        self.port, self.cgroup, self.log = _free_port(), cgroup, tmp / "app.log"
        self.gradio_tmp = tmp / "gradio"
        env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
        env["GRADIO_TEMP_DIR"] = str(self.gradio_tmp)
        cmd = [sys.executable, str(ROOT / "app.py"), "--model", "bundled", "--port", str(self.port)]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                cmd + extra,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=cgroup.enter,
            )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the app exited:\n{self.log.read_text()}")
            try:
                httpx.get(f"{self.url}/gradio_api/info", timeout=5).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(1)
        config = httpx.get(f"{self.url}/config", timeout=30).json()
        self.fn = {d["api_name"]: i for i, d in enumerate(config["dependencies"]) if d.get("api_name")}
        picker = next(c for c in config["components"] if str(c["props"].get("label", "")).startswith("Model:"))
        self.model = picker["props"]["value"]

    def _status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(key)

    @property
    def rss(self) -> int:
        return self._status("VmRSS")

    @property
    def peak(self) -> int:
        return self._status("VmHWM")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Result:
    ok: bool
    message: str
    seconds: float
    output: list | None = None


class Raw:
    """The app's queue over plain HTTP, each call in a session of its own (so UI-only listeners are reachable
    as a browser reaches them)."""

    def __init__(self, app: App) -> None:
        self.app, self.base = app, f"{app.url}/gradio_api"

    def upload(self, path: Path) -> dict:
        with path.open("rb") as f:
            r = httpx.post(f"{self.base}/upload", files={"files": (path.name, f)}, timeout=300)
        r.raise_for_status()
        return {"path": r.json()[0], "meta": {"_type": "gradio.FileData"}, "orig_name": path.name}

    def call(self, api_name: str, data: list, event_data: dict | None = None) -> Result:
        session, t0 = uuid.uuid4().hex, time.perf_counter()
        body = {"data": data, "fn_index": self.app.fn[api_name], "session_hash": session, "event_data": event_data}
        try:
            r = httpx.post(f"{self.base}/queue/join", json=body, timeout=60)
            if r.status_code != 200:
                return Result(False, f"HTTP {r.status_code}: {r.text[:120]}", time.perf_counter() - t0)
            with httpx.stream("GET", f"{self.base}/queue/data", params={"session_hash": session}, timeout=600) as s:
                for line in s.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_completed":
                        out = msg.get("output") or {}
                        ok = bool(msg.get("success")) and "error" not in out
                        text = str(out.get("error") if not ok else "")
                        return Result(ok, text, time.perf_counter() - t0, out.get("data"))
        except httpx.HTTPError as e:
            return Result(False, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        return Result(False, "stream ended", time.perf_counter() - t0)


# -------------------------------------------------------------------------------------------- the cases


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

    def add(self, r: Result) -> None:
        if r.ok:
            self.served += 1
        else:
            self.refused += 1
            self.messages.append(r.message)


def _settings(model: str, layer: int = -1) -> list:
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
        lambda: raw.call("classify", [img[0], *_settings(m)]),
        lambda: raw.call("classify_page", [img[1], *_settings(m, layer=1), None]),
        lambda: raw.call("explore_picture", [img[2], m, None]),
        lambda: raw.call("explore_point", [img[3], m, None], event_data=click),
        lambda: raw.call("explore_clicked", [img[9], *_explore_inputs(m, layer=1), None]),
        lambda: raw.call("explore", [img[4], *_explore_inputs(m)]),
        lambda: raw.call("explore_page", [img[5], *_explore_inputs(m, layer=1), None]),
        lambda: raw.call("compare", [img[6], m, "(predicted class)", -1, "mean", "mean", 0.0, 0.5]),
        lambda: raw.call("compare_page", [img[7], m, "(predicted class)", 1, "mean", "mean", 0.0, 0.5, None]),
        lambda: raw.call("classify_new", [img[8], *_settings(m, layer=1), None]),
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
    for r in _parallel([lambda i=i: raw.call("classify", [i, *_settings(raw.app.model)]) for i in images]):
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


# ------------------------------------------------------------------------------------------------ main


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="vit_hostile_"))
    cgroup = Cgroup(args.cap_mb * MB)
    inputs = Inputs(tmp)
    app = None
    rows: list[Row] = []
    try:
        extra = (["--public"] if args.public else []) + args.app_args.split()
        print(f"starting python app.py --model bundled {' '.join(extra)} {cgroup.note}", flush=True)
        app = App(cgroup, tmp, extra)
        print(next(line for line in app.log.read_text().splitlines() if line.startswith("memory budget")), flush=True)
        raw = Raw(app)
        for _ in range(3):  # warm up: imports, the first request's allocations
            raw.call("classify", [raw.upload(inputs.unique_cat()), *_settings(app.model)])
        time.sleep(args.settle)
        baseline = app.rss
        print(f"idle baseline RSS {baseline / MB:,.0f} MB; settle {args.settle:.0f} s after each case", flush=True)
        rounds = 2 if args.quick else 4
        cases = [
            ("64 x 49.9 MP zip to /batch", lambda row: case_zip64(raw, inputs, row), True),
            ("mixed 49.9 MP burst, every listener", lambda row: case_mixed(raw, inputs, row), True),
            *[
                (f"five 49.9 MP classifies, round {i + 1}", lambda row: case_round(raw, inputs, row), True)
                for i in range(rounds)
            ],
            ("100 classifies from one client", lambda row: case_flood(app, inputs, row), True),
            ("1 GB upload", lambda row: case_upload(app, 1024 * MB, row), False),
            ("zip of 1,000,000 empty entries", lambda row: case_entries(raw, inputs, 1_000_000, row), False),
            ("zip of 200,000 empty entries", lambda row: case_entries(raw, inputs, 200_000, row), False),
        ]
        for name, case, burst in cases:
            row = Row(name, burst=burst)
            rows.append(row)
            print(f"- {name} ...", flush=True)
            app.reset_peak()
            try:
                case(row)
            except Exception as e:  # a dead server: recorded, the next cases say so too
                row.note += f" failed: {type(e).__name__}: {e}"
            row.alive = app.alive
            if not row.alive:
                break
            row.peak = app.peak - baseline
            time.sleep(args.settle)
            row.after = app.rss - baseline
        return report(rows, baseline, cgroup, args)
    finally:
        if app is not None:
            app.stop()
        cgroup.remove()
        shutil.rmtree(tmp, ignore_errors=True)


def report(rows: list[Row], baseline: int, cgroup: Cgroup, args: argparse.Namespace) -> int:
    settle = f"{args.settle:.0f} s after"
    print()
    print(f"| case | served / refused | peak above baseline | {settle} | other client's wait | alive | notes |")
    print("|---|---:|---:|---:|---|---|---|")
    for r in rows:
        wait = "-" if r.wait is None else f"{r.wait:.1f} s (alone {r.reference:.1f} s: x{r.wait / r.reference:.1f})"
        print(
            f"| {r.case} | {r.served} / {r.refused} | {r.peak / MB:+,.0f} MB | {r.after / MB:+,.0f} MB | {wait} | "
            f"{'yes' if r.alive else 'NO'} | {r.note} |"
        )
    refusals = sorted({m for r in rows for m in r.messages})
    if refusals:
        print("\nrefusals, as the clients read them:")
        for m in refusals[:8]:
            print(f"  {m[:160]}")
    settle_limit = max(0.2 * baseline, 300 * MB)
    flood = next((r for r in rows if r.case.startswith("100")), None)
    upload = next((r for r in rows if r.case.startswith("1 GB")), None)
    checks = {
        "alive through all": all(r.alive for r in rows) and cgroup.oom_kills() == 0,
        "peak above baseline <= 1.5 GB for every burst": all(r.peak <= PEAK_TARGET for r in rows if r.burst),
        f"RSS {settle} a burst <= baseline + {settle_limit / MB:,.0f} MB": all(
            r.after <= settle_limit for r in rows if r.burst
        ),
        "the other client answered within 10 s during the flood": flood is not None
        and flood.wait is not None
        and flood.wait <= 10,
        "the 1 GB upload refused at once (< 5 s)": upload is not None
        and upload.refused == 1
        and (upload.seconds or 1e9) < 5,
    }
    print(f"\nbaseline {baseline / MB:,.0f} MB; OOM kills in the cgroup: {cgroup.oom_kills()}")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="two rounds of five classifies instead of four")
    p.add_argument("--cap-mb", type=int, default=5120, help="the app's memory cgroup limit (default 5120)")
    p.add_argument("--public", action="store_true", help="run the app with --public")
    p.add_argument("--settle", type=float, default=30.0, help="seconds between a case and its RSS reading")
    p.add_argument("--app-args", default="", help="more options for app.py, e.g. '--concurrency 4'")
    args = p.parse_args()
    raise SystemExit(run(args))


if __name__ == "__main__":
    main()
