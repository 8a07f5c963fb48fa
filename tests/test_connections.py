"""Connections that hold nothing for long (issue 66): the app's uvicorn protocol (``queueing.Connections``) closes a
connection that sends no request within its header timeout, caps the connections of one address and of all, a
newcomer taking the place of the longest idle one, and logs a failed accept once per interval."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
import uvicorn

from webapp.server import queueing
from webapp.server.queueing import AcceptErrors, Connections

from .net import free_port


async def _hello(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def serve():
    """Serve ``_hello`` with a ``Connections`` guard in a thread; yields a function of the guard giving the port."""
    servers = []

    def start(guard: Connections) -> int:
        port = free_port()
        config = uvicorn.Config(_hello, host="127.0.0.1", port=port, http=guard.protocol(), log_level="warning")
        server = uvicorn.Server(config)
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.01)
        servers.append(server)
        return port

    yield start
    for server in servers:
        server.should_exit = True


def _closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closed ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def _get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return s.recv(1024)


def test_a_connection_that_sends_no_request_is_closed(serve, monkeypatch):
    """A connection that never sent a byte stayed open for good (500 after 2 minutes); one that sends half a request
    line, or nothing after its answer, the same. Now each is closed after the header timeout."""
    monkeypatch.setattr(queueing, "proxy_hops", lambda: 0)
    guard = Connections()
    guard.header_timeout = 1.0
    port = serve(guard)
    silent = socket.create_connection(("127.0.0.1", port))
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET / HT")
    assert _get(port).startswith(b"HTTP/1.1 200")  # a request sent at once is answered
    assert _closed(silent, 5) and _closed(slow, 5)
    assert guard.count == 0


def test_one_address_holds_at_most_its_share_and_a_newcomer_gets_in(serve, monkeypatch):
    """One address opening connections without end: beyond ``per_address`` each is closed at once; with the
    address cap off (behind a proxy) and every place taken, a newcomer takes the longest idle one's place."""
    monkeypatch.setattr(queueing, "proxy_hops", lambda: 0)
    capped = serve(Connections(per_address=20))
    held = [socket.create_connection(("127.0.0.1", capped)) for _ in range(20)]
    extra = socket.create_connection(("127.0.0.1", capped))
    assert _closed(extra, 5) and not _closed(held[0], 0.2)
    monkeypatch.setattr(queueing, "proxy_hops", lambda: 1)  # behind a proxy: every connection is its address
    guard = Connections(total=50)
    assert guard.per_address is None
    port = serve(guard)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    assert _get(port).startswith(b"HTTP/1.1 200")
    assert guard.count <= 50 and guard.evicted >= 150
    assert _closed(idle[0], 5) and not _closed(idle[-1], 0.2)  # the longest idle went first
    for s in [*held, extra, *idle]:
        s.close()


def test_a_failed_accept_is_logged_once_per_interval(caplog):
    """asyncio logs "socket.accept() out of system resource" with a traceback per attempt (382,975 lines in a
    minute): let through once per interval, with the count."""
    log = logging.getLogger("test-asyncio")
    log.addFilter(AcceptErrors())
    error = OSError(24, "Too many open files")
    with caplog.at_level(logging.ERROR, "test-asyncio"):
        for _ in range(1000):
            log.error("socket.accept() out of system resource\nsocket: x", exc_info=(OSError, error, None))
        log.error("something else")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["socket.accept() failed 1 times: [Errno 24] Too many open files", "something else"]
