"""Round two (issue 44): huge request bodies, a batch that lists one lying zip 200 times, a flood of sessions,
requests made to fill the log, cut-off uploads, forged ``X-Forwarded-For`` addresses and URLs as files. Most
cases run while another client classifies a photo (``probe``), timed against the same request alone."""

from __future__ import annotations

import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from .inputs import Inputs
from .load import Row, settings
from .server import MB, App, Raw, Result

INNOCENT = {"X-Forwarded-For": "198.51.100.200"}  # the other client's address: its own, as the proxy appended it


def probe(raw: Raw, inputs: Inputs, attack: Callable[[], None], row: Row, delay: float = 0.5) -> None:
    """``attack`` in a thread; ``delay`` seconds in, another client's classify of a new photo, timed."""
    thread = threading.Thread(target=attack)
    thread.start()
    time.sleep(delay)
    r = raw.call("classify", [raw.upload(inputs.unique_cat()), *settings(raw.app.model)], headers=INNOCENT)
    row.wait = r.seconds if r.ok else None
    thread.join()


def _stream(app: App, path: str, total: int, chunked: bool, prefix: bytes = b"", suffix: bytes = b"") -> str:
    """POST ``prefix``, ``total`` bytes of "x" and ``suffix`` to ``path`` over a raw socket, 1 MB at a time,
    stopping when the server answers: its status line, and how much was sent."""
    size = len(prefix) + total + len(suffix)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", app.port), timeout=120) as s:
        s.sendall(head.encode())
        pieces = [prefix, *(b"x" * MB for _ in range(total // MB)), suffix]
        try:
            for piece in pieces:
                if select.select([s], [], [], 0)[0]:
                    break  # the server answered before the end of the body
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            else:
                s.sendall(b"0\r\n\r\n" if chunked else b"")
            status = s.recv(200).split(b"\r\n")[0].decode(errors="replace")
        except OSError as e:
            status = f"connection closed ({type(e).__name__})"
    return f"{status or 'no answer'} after {sent / MB:,.0f} MB sent"


def case_bodies(raw: Raw, inputs: Inputs, row: Row) -> None:
    """Five 300 MB bodies to the queue at once (Content-Length) and five chunked, then three 300 MB model
    choices to /call/classify (chunked)."""
    app = raw.app
    join = b'{"data":[],"fn_index":5,"session_hash":"abcdefghijk","pad":"'
    choice = b'{"data":[null,"'

    def attack() -> None:
        calls = [
            lambda c=c: _stream(app, "/gradio_api/queue/join", 300 * MB, c, join, b'"}') for c in [0] * 5 + [1] * 5
        ]
        calls += [lambda: _stream(app, "/gradio_api/call/classify", 300 * MB, True, choice, b'"]}')] * 3
        with ThreadPoolExecutor(len(calls)) as pool:
            for answer in pool.map(lambda c: c(), calls):
                row.add(Result(answer.startswith("HTTP/1.1 200"), answer, 0))

    probe(raw, inputs, attack, row)
    row.note = sorted(set(row.messages))[0] if row.messages else ""


def case_batch_parse(raw: Raw, inputs: Inputs, row: Row) -> None:
    """One /batch listing 200 times a zip whose end record declares 1 entry over a 150,000-entry directory."""
    lying = raw.upload(inputs.zip_of_entries(150_000, declared=1))
    result: list[Result] = []

    def attack() -> None:
        result.append(raw.call("batch", [[lying] * 200, raw.app.model, "Attention rollout", 5, 0.5]))

    probe(raw, inputs, attack, row, delay=0.2)
    row.add(result[0])
    row.hostile = 1
    summary = str(result[0].output[2]) if result[0].ok and result[0].output else result[0].message
    row.note = f"answered in {result[0].seconds:.1f} s: {summary[:90]}"


def case_sessions(raw: Raw, n: int, row: Row) -> None:
    """``n`` calls of a page event (no compute) each with a fresh session hash: Gradio keeps a session's state."""
    body = {"data": [None, None, None], "fn_index": raw.app.fn["cleared"]}

    def calls(count: int) -> None:
        with httpx.Client(timeout=60) as client:
            for _ in range(count):
                r = client.post(f"{raw.base}/run/cleared", json=body | {"session_hash": uuid.uuid4().hex})
                row.add(Result(r.status_code == 200, f"HTTP {r.status_code}", 0))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(calls, [n // 8] * 8))
    row.note = f"{n:,} sessions in {time.perf_counter() - t0:.0f} s"


def case_log(raw: Raw, inputs: Inputs, n: int, row: Row) -> None:
    """``n`` of each request that used to log a traceback: an upload cut off after its part header, a layer of
    "abc", an opacity of null, a model choice of 123, /etc/passwd as the image, too few values (with a 1 MB
    string), an unknown fn_index."""
    app, m = raw.app, raw.app.model
    cat = raw.upload(inputs.unique_cat())
    base = [cat, *settings(m)]
    wrong = [
        [*base[:4], "abc", *base[5:]],
        [*base[:8], None, base[9]],
        [base[0], 123, *base[2:]],
        [{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}, *base[1:]],
    ]
    part = b'--B\r\nContent-Disposition: form-data; name="files"; filename="x.png"\r\nContent-Type: image/png\r\n\r\n'
    upload = (
        f"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=B\r\n"
        f"Content-Length: {len(part) + 1000}\r\n\r\n"
    ).encode() + part

    def cut() -> None:
        with socket.create_connection(("127.0.0.1", app.port)) as s:
            s.sendall(upload)
            time.sleep(0.05)

    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            cut()
            for values in wrong:
                row.add(raw.call("classify", values))
            r = client.post(f"{raw.base}/call/classify", json={"data": ["x" * 1_000_000]})
            row.add(Result(r.status_code == 200, f"HTTP {r.status_code}", 0))
            r = client.post(f"{raw.base}/queue/join", json={"data": [], "fn_index": 99999, "session_hash": "x" * 11})
            row.add(Result(r.status_code == 200, f"HTTP {r.status_code}: {r.text[:80]}", 0))
    row.hostile = n * (len(wrong) + 3)
    row.note = f"{row.hostile:,} requests"


def case_cut_uploads(raw: Raw, n: int, row: Row) -> None:
    """``n`` 20 MB uploads cut off after 10 MB."""
    head = b'--B\r\nContent-Disposition: form-data; name="files"; filename="x.png"\r\nContent-Type: image/png\r\n\r\n'

    def one(_: int) -> None:
        with socket.create_connection(("127.0.0.1", raw.app.port)) as s:
            s.sendall(
                b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=B\r\n"
                + f"Content-Length: {len(head) + 20 * MB}\r\n\r\n".encode()
                + head
                + b"x" * (10 * MB)
            )
            time.sleep(0.5)

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(one, range(n)))
    time.sleep(1)
    row.hostile = n
    row.note = f"{n} cut off at 10 of 20 MB"


def case_spoofed(raw: Raw, inputs: Inputs, row: Row) -> None:
    """While a 49.9 MP classify computes, 100 compare requests from one address, each with another forged
    address at the left of X-Forwarded-For; then a newcomer's classify (its wait is the probe)."""
    m = raw.app.model
    image = raw.upload(inputs.unique_cat())
    values = [image, m, "(predicted class)", -1, "mean", "mean", 0.0, 0.5]
    blocker = threading.Thread(
        target=raw.call,
        args=("classify", [raw.upload(inputs.unique_big()), *settings(m)]),
        kwargs={"headers": {"X-Forwarded-For": "192.0.2.1"}},
    )
    blocker.start()
    time.sleep(1)

    def join(i: int) -> int:
        body = {"data": values, "fn_index": raw.app.fn["compare"], "session_hash": uuid.uuid4().hex}
        headers = {"X-Forwarded-For": f"10.{i // 250}.{i % 250}.1, 203.0.113.7"}
        return httpx.post(f"{raw.base}/queue/join", json=body, headers=headers, timeout=60).status_code

    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(join, range(100)))
    for code in codes:
        row.add(Result(code == 200, f"HTTP {code}", 0))
    newcomer = raw.call(
        "classify", [raw.upload(inputs.unique_cat()), *settings(m)], headers={"X-Forwarded-For": "198.51.100.9"}
    )
    row.wait = newcomer.seconds if newcomer.ok else None
    row.note = f"newcomer: {'answered' if newcomer.ok else newcomer.message[:60]}"
    blocker.join()


def case_url(raw: Raw, inputs: Inputs, row: Row) -> None:
    """An image given as an http URL (a public address), ten times."""
    url = "http://93.184.215.14/cat.png"
    for _ in range(10):
        r = raw.call(
            "classify", [{"path": url, "url": url, "meta": {"_type": "gradio.FileData"}}, *settings(raw.app.model)]
        )
        row.add(r)
    row.note = row.messages[0][:90] if row.messages else "fetched"
