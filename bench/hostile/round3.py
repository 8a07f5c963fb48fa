"""Round three (issue 57): the Train tab's zips and jobs, a restart, new sessions from one address, one IPv6 /64
posing as 200 clients, and two streams of one session. Each case fills its ``Row`` as rounds one and two do;
the innocent client (``INNOCENT``, an address of its own) classifies a new photo alone and during the attack."""

from __future__ import annotations

import io
import json
import statistics
import threading
import time
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from gradio_client import Client, handle_file
from PIL import Image

from .attacks import INNOCENT
from .inputs import Inputs, _png_chunk
from .load import Row, settings
from .server import MB, Raw, Result

ATTACKER = "203.0.113.66"
BUNDLED = "bundled: CIFAR-10 hybrid ViT"


def _png(side: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (30, 160, 90)).save(buf, "PNG")
    return buf.getvalue()


def zip_of_pngs(inputs: Inputs, n: int, side: int = 6000, classes: int = 2) -> Path:
    """``n`` one-colour ``side``-px PNGs (36 MP by default; encoded once, a text chunk each to tell them
    apart) in ``classes`` folders, deflated: 2,000 of them make a zip of a few MB that decodes to 72,000 MP."""
    png = _png(side)
    path = inputs.folder / f"pngs{n}-{uuid.uuid4().hex[:6]}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(n):
            text = _png_chunk(b"tEXt", b"Comment\x00" + f"{i}".encode())
            z.writestr(f"photos/c{i % classes}/{i:04d}.png", png[:-12] + text + png[-12:])
    return path


def zip_of_photos(inputs: Inputs, per_class: int = 2) -> Path:
    """The smallest training set the page allows: 2 classes of ``per_class`` small photos."""
    path = inputs.folder / f"photos{per_class}-{uuid.uuid4().hex[:6]}.zip"
    with zipfile.ZipFile(path, "w") as z:
        for c, colour in enumerate(((200, 30, 20), (20, 40, 210))):
            for i in range(per_class):
                buf = io.BytesIO()
                Image.new("RGB", (64, 64), tuple(min(255, v + 9 * i) for v in colour)).save(buf, "JPEG")
                z.writestr(f"photos/class{c}/{i}.jpg", buf.getvalue())
    return path


def _client(raw: Raw, address: str) -> Client:
    return Client(raw.app.url + "/", verbose=False, headers={"X-Forwarded-For": address}, httpx_kwargs={"timeout": 600})


def _train(client: Client, archive: Path, minutes: float = 0.1):
    return client.submit(handle_file(str(archive)), BUNDLED, minutes, False, api_name="/train")


def _ending(job, timeout: float = 600) -> Result:
    """How a /train job ended: ok with its last progress line, or its error."""
    t0 = time.perf_counter()
    try:
        out = job.result(timeout=timeout)
        text = out[2] if isinstance(out[2], str) and out[2] else out[0]  # the result, else the progress line
        return Result(True, str(text)[:120], time.perf_counter() - t0, list(out))
    except Exception as e:
        return Result(False, str(e).splitlines()[-1][:160], time.perf_counter() - t0)


def _innocent(raw: Raw, inputs: Inputs, n: int = 5) -> float:
    """The innocent client's median classify time over ``n`` new photos."""
    times = []
    for _ in range(n):
        r = raw.call("classify", [raw.upload(inputs.unique_cat()), *settings(raw.app.model)], headers=INNOCENT)
        times.append(r.seconds if r.ok else float("inf"))
    return statistics.median(times)


def case_png_zip(raw: Raw, inputs: Inputs, row: Row) -> None:
    """A zip of 2,000 one-colour 36 MP PNGs (72,000 MP to decode) to /train: refused from its headers."""
    archive = zip_of_pngs(inputs, 2000)
    t0 = time.perf_counter()
    r = _ending(_train(_client(raw, ATTACKER), archive))
    row.add(Result(False, r.message, r.seconds) if r.ok and "Done" not in r.message else r)
    row.seconds = time.perf_counter() - t0
    row.note = f"{archive.stat().st_size / MB:.1f} MB zip; answered in {row.seconds:.1f} s"


def case_cancel_decoding(raw: Raw, inputs: Inputs, row: Row) -> None:
    """100 36 MP PNGs (3,600 MP: under the cap), Cancel as soon as the job reads them: how long it takes to end."""
    archive = zip_of_pngs(inputs, 100)
    client = _client(raw, ATTACKER)
    job = _train(client, archive, minutes=2.0)
    deadline = time.time() + 300
    while not any("Reading" in str(u[0]) or "Starting" in str(u[0]) for u in job.outputs()):
        if job.done() or time.time() > deadline:
            break
        time.sleep(0.2)
    time.sleep(2.0)  # decoding
    t0 = time.perf_counter()
    said = client.predict(api_name="/train_cancel")
    r = _ending(job)
    ended = time.perf_counter() - t0
    row.add(r)
    row.messages.append(f"cancel: {said}; the job: {r.message}")
    row.note = f"Cancel answered '{str(said)[:40]}'; the job ended {ended:.1f} s after it: {r.message[:60]}"


def case_smallest(raw: Raw, inputs: Inputs, row: Row) -> None:
    """2 classes of 2 photos, 0.1 min: trains, calibrates and answers with a model; no traceback."""
    r = _ending(_train(_client(raw, ATTACKER), zip_of_photos(inputs, 2)))
    row.add(r if r.ok and "Done" in r.message else Result(False, r.message, r.seconds))
    row.note = f"{r.seconds:.0f} s: {r.message[:80]}"


def case_jobs_restart(raw: Raw, inputs: Inputs, row: Row) -> None:
    """Ten jobs of mixed kinds (done, cancelled, refused zips, refused while busy), then the server restarted:
    what training holds on the disk, and the ``vit-train-*`` folders left."""
    smallest, bomb, bad = zip_of_photos(inputs, 2), zip_of_pngs(inputs, 2000), inputs.folder / "notazip.zip"
    bad.write_bytes(b"not a zip" * 100)
    endings: list[Result] = []
    for i in range(3):  # done, and a refusal while it runs
        client = _client(raw, f"198.51.100.{100 + i}")
        job = _train(client, smallest)
        time.sleep(1.0)
        if i < 2:
            endings.append(_ending(_train(_client(raw, ATTACKER), smallest)))  # busy
        endings.append(_ending(job))
    for archive in (bomb, bad):  # refused zips
        endings.append(_ending(_train(_client(raw, ATTACKER), archive)))
    for i in range(3):  # cancelled once started
        client = _client(raw, f"198.51.100.{110 + i}")
        job = _train(client, smallest, minutes=1.0)
        time.sleep(3.0 + i)
        client.predict(api_name="/train_cancel")
        endings.append(_ending(job))
    for r in endings:  # served: trained; refused: busy, a refused zip, cancelled
        row.add(r if r.ok and "Done" in r.message else Result(False, r.message, r.seconds))
    held = _bytes(raw.app.tmpdir)
    raw.app.restart()
    left = list(raw.app.tmpdir.glob("vit-train-*"))
    row.note = (
        f"{len(endings)} jobs; training held {held / MB:,.0f} MB before the restart; {len(left)} vit-train-* "
        f"folders after it ({_bytes(raw.app.tmpdir) / MB:,.0f} MB)"
    )
    row.orphans = len(left)


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def case_new_sessions(raw: Raw, inputs: Inputs, row: Row, rate: float = 20.0) -> None:
    """New sessions at ``rate`` a second from one address (8 connections; the page's cheap event) while the
    innocent client classifies 5 new photos; its median against alone."""
    alone = _innocent(raw, inputs)
    body = {"data": [None, None, None], "fn_index": raw.app.fn["cleared"]}
    stop = threading.Event()
    codes: list[tuple[int, str]] = []

    def flood(k: int) -> None:
        with httpx.Client(timeout=60) as client:
            next_at = time.perf_counter() + k / rate
            while not stop.is_set():
                time.sleep(max(0.0, next_at - time.perf_counter()))
                next_at += 8 / rate
                headers = {"X-Forwarded-For": f"10.9.{k}.1, {ATTACKER}"}
                r = client.post(
                    f"{raw.base}/run/cleared", json=body | {"session_hash": uuid.uuid4().hex}, headers=headers
                )
                codes.append((r.status_code, r.text[:200]))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(flood, k) for k in range(8)]
        time.sleep(3.0)  # past the bucket's burst
        row.wait = _innocent(raw, inputs)
        stop.set()
        for f in futures:
            f.result()
    seconds = time.perf_counter() - t0
    for code, text in codes:
        row.add(Result(code == 200, f"HTTP {code}: {_detail(text)}", 0))
    row.reference = alone
    row.note = f"{len(codes) / seconds:.1f} new sessions/s for {seconds:.0f} s; innocent median {row.wait:.2f} s"


def _detail(text: str) -> str:
    try:
        return str(json.loads(text).get("detail", text))
    except (ValueError, AttributeError):
        return text


def case_ipv6(raw: Raw, inputs: Inputs, row: Row) -> None:
    """While a 49.9 MP classify computes, 200 compares from 200 addresses of one IPv6 /64, the right-most
    X-Forwarded-For entry (the proxy's) rotated among them and forged entries at the left; then a newcomer."""
    m = raw.app.model
    image = raw.upload(inputs.unique_cat())
    values = [image, m, "(predicted class)", -1, "mean", "mean", 0.0, 0.5]
    big = [raw.upload(inputs.unique_big()), *settings(m)]
    blocker = threading.Thread(
        target=raw.call, args=("classify", big), kwargs={"headers": {"X-Forwarded-For": "192.0.2.9"}}
    )
    blocker.start()
    time.sleep(1)

    def join(i: int) -> tuple[int, str]:
        body = {"data": values, "fn_index": raw.app.fn["compare"], "session_hash": uuid.uuid4().hex}
        headers = {"X-Forwarded-For": f"10.{i // 250}.{i % 250}.1, 2001:db8:77:1:{i:x}:{i * 7:x}::{i + 1:x}"}
        r = httpx.post(f"{raw.base}/queue/join", json=body, headers=headers, timeout=60)
        return r.status_code, r.text[:200]

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(join, range(200)))
    for code, text in answers:
        row.add(Result(code == 200, f"HTTP {code}: {_detail(text)}", 0))
    newcomer = raw.call("classify", [raw.upload(inputs.unique_cat()), *settings(m)], headers=INNOCENT)
    row.wait = newcomer.seconds if newcomer.ok else None
    row.note = f"newcomer {'served' if newcomer.ok else newcomer.message[:60]} in {newcomer.seconds:.1f} s"
    blocker.join()


def case_two_streams(raw: Raw, inputs: Inputs, row: Row, n: int = 10) -> None:
    """``n`` times: a page's classify (``/queue/join`` and its ``/queue/data`` stream) and a REST ``/call`` naming
    the same session hash at once; the log's tracebacks are counted by the run."""
    m = raw.app.model
    image = raw.upload(inputs.unique_cat())

    def read(url: str, params: dict, answered: threading.Event) -> str:
        """A stream read until its own answer, or until the other stream has one (either may take both
        answers: the other then has only heartbeats, every 15 s, and would never end)."""
        lines: list[str] = []
        try:
            with httpx.stream("GET", url, params=params, timeout=httpx.Timeout(60, read=20)) as s:
                for line in s.iter_lines():
                    lines.append(line)
                    if "process_completed" in line or line.startswith("event: complete") or answered.is_set():
                        break
        except httpx.HTTPError as e:
            lines.append(f"{type(e).__name__}")
        answered.set()
        return "\n".join(lines)

    def page(session: str, answered: threading.Event) -> None:
        body = {"data": [image, *settings(m)], "fn_index": raw.app.fn["classify"], "session_hash": session}
        httpx.post(f"{raw.base}/queue/join", json=body, timeout=60)
        read(f"{raw.base}/queue/data", {"session_hash": session}, answered)

    def rest(session: str, answered: threading.Event) -> Result:
        r = httpx.post(f"{raw.base}/call/classify", json={"data": [image, *settings(m)], "session_hash": session})
        if r.status_code != 200:
            return Result(False, f"HTTP {r.status_code}", 0)
        text = read(f"{raw.base}/call/classify/{r.json()['event_id']}", {}, answered)
        return Result(True, text[-120:], 0)  # served: either stream carried the answer; the log is what is checked

    for _ in range(n):
        session = uuid.uuid4().hex
        answered = threading.Event()
        with ThreadPoolExecutor(2) as pool:
            streamed = pool.submit(page, session, answered)
            row.add(pool.submit(rest, session, answered).result())
            streamed.result()
    row.note = f"{n} sessions read by two streams"


def case_gradio_cancel(raw: Raw, inputs: Inputs, row: Row) -> None:
    """Gradio's own cancel route (``/gradio_api/cancel``) naming a training visitor's session hash and the /train
    listener, from another address, while the job trains: refused (403) by ``queueing.OwnCancels``, and the
    visitor's job ends done (before, Gradio cancelled it and the visitor never had an answer)."""
    owner = _client(raw, "198.51.100.120")
    job = _train(owner, zip_of_photos(inputs, 4), minutes=0.2)
    deadline = time.time() + 300
    while not any(str(u[0]).startswith(("Training", "Reading", "Plan")) for u in job.outputs()):
        if job.done() or time.time() > deadline:
            break
        time.sleep(0.2)
    body = {"session_hash": owner.session_hash, "fn_index": raw.app.fn["train"], "event_id": "0" * 32}
    r = httpx.post(f"{raw.base}/cancel", json=body, headers={"X-Forwarded-For": ATTACKER}, timeout=60)
    row.add(Result(r.status_code == 200, f"HTTP {r.status_code}: {r.text[:100]}", 0))
    ending = _ending(job)
    row.note = f"the visitor's job: {ending.message[:70]}"
