"""A fair share of the queue for each client, and bounded uploads (see ``webapp.server.admission`` for why).

**A fair share of the queue** (``ClientLimits``). A client (a Gradio session, and separately an IP
address) may have at most ``per_session`` (``per_ip``) requests waiting or computing; more are refused
when they join the queue ("you have N requests waiting"), so one client never fills it. The queue is
served round robin by client (behind a proxy, by address; else by session): a request joins behind the requests
that are as many places into their own client's line as it is into its own, so a newcomer waits for at most one
request of each other client.

**Cancels of one's own events only** (``OwnCancels``). Gradio's own cancel route (``POST /gradio_api/cancel``: a
session hash, a listener's index and an event id) cancels the running event of that session and listener, and
removes the event named from the queue, whoever asks; a session hash is the client's to send, so any REST caller
naming another visitor's could stop its training or classify. A cancel that would reach an event queued from
another address (``client_ip``: the Train tab's Cancel button has the same rule) is refused (403) before Gradio
reads it.

**Connections that hold nothing for long** (``Connections``, uvicorn's HTTP protocol made to count and time them,
as nginx's ``client_header_timeout`` and ``limit_conn`` do): a connection must send a request's headers within
``HEADER_TIMEOUT_S`` of opening or of its last answer, else it is closed; one address group holds at most
``per_address`` open at once (direct clients only: behind a proxy every connection is the proxy's); all together at
most ``total``, below the process's file limit (raised to its hard limit first), and when they are all open a
newcomer takes the place of the connection that has waited longest without a request (so that idle connections can
never shut a visitor out); a failed ``accept`` is logged once a minute with its count (155 MB of log a minute once).

**Bounded uploads** (``UploadLimits``, with Gradio's own ``max_file_size`` per file). An upload must declare
its length, at most ``max_bytes`` in all, and leave ``MIN_FREE_DISK`` free on the disk it goes to; it is
refused from its headers, before a byte of it is read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import resource
import shutil
import tempfile
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr
from starlette.requests import Request
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ..errors import log
from ..resources import MB, MIN_FREE_DISK
from .bodies import refuse
from .gradio_patches import wrap_queue_push, wrap_server_config

# ------------------------------------------------------------------------------------- fair queueing


def proxy_hops() -> int:
    """How many proxies in front of the app append to ``X-Forwarded-For``: ``FORWARDED_HOPS``, else 1 on a
    Space (Hugging Face's proxy) and 0 elsewhere (the header is then ignored: anyone can send it)."""
    hops = os.environ.get("FORWARDED_HOPS", "")
    return int(hops) if hops.isdigit() else (1 if os.environ.get("SPACE_ID") else 0)


def client_ip(request: Any) -> str:
    """The client a request came from, as an address group (``address_group``). Behind proxies (a Space: Hugging
    Face's, whose own address every request shares) it is the address the outermost trusted proxy appended to
    ``X-Forwarded-For``: the ``proxy_hops()``-th from the right. Entries left of it are whatever the client sent,
    so the left-most is never trusted."""
    hops = proxy_hops()
    forwarded = request.headers.get("x-forwarded-for", "") if hops else ""
    hops_seen = [h.strip() for h in forwarded.split(",") if h.strip()]
    if hops and len(hops_seen) >= hops:
        return address_group(hops_seen[-hops])
    return address_group(request.client.host) if request.client is not None else "unknown"


IPV6_PREFIX = 64  # one IPv6 client: a /64 is what one home or one server is given, so it costs nothing to rotate


def address_group(address: str) -> str:
    """The client an address stands for: an IPv4 address itself (a /32), an IPv6 address's /64 network (one
    machine can use any of its 2^64 addresses), anything else as sent, cut to 64 characters (a host name)."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address[:64]
    if ip.version == 4:
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/{IPV6_PREFIX}", strict=False))


class ClientLimits:
    """At most ``per_session`` requests of one Gradio session, and ``per_ip`` of one address, waiting or
    computing; the queue served round robin by client (see the module's docstring).

    Gradio's queue has no hook for this, so ``install`` wraps its ``push`` (every queued event passes
    there) and reads its lists of waiting and running events. ``push`` runs on the server's event loop,
    so the count, the check and the insertion are not interleaved with other clients' joins."""

    def __init__(self, per_session: int = 16, per_ip: int = 32) -> None:
        self.per_session, self.per_ip = per_session, per_ip
        self._joining: Counter[str] = Counter()  # joins past the check, not yet in the queue

    def install(self, demo: gr.Blocks) -> None:
        wrap_queue_push(demo, lambda push: self._fair(demo._queue, push))

    def _fair(self, queue: Any, push: Callable[..., Any]) -> Callable[..., Any]:
        async def fair_push(body, request, username):
            session, ip = body.session_hash, client_ip(request)
            keys = [f"ip:{ip}"] + ([f"session:{session}"] if session else [])
            counts = self._counts(queue)
            for key, limit in zip(keys, (self.per_ip, self.per_session), strict=False):
                n = counts[key] + self._joining[key]
                if n >= limit:
                    who = "this address has" if key.startswith("ip:") else "you have"
                    message = f"{who.capitalize()} {n} requests waiting or running; wait for them to finish."
                    log.info("refused a request: its %s has %d waiting or running", key.split(":")[0], n)
                    refusal = {"__type__": "validate", "is_valid": False, "message": message, "parameter_name": "queue"}
                    return False, [refusal], "validator_error"  # 422: clients show the message
            self._joining.update(keys)
            try:
                ok, event_id, state = await push(body=body, request=request, username=username)
            finally:
                self._joining.subtract(keys)
                self._joining += Counter()  # drop the zeros
            if ok:
                self._place(queue, event_id)
            return ok, event_id, state

        return fair_push

    @staticmethod
    def _events(queue) -> Iterator[tuple[Any, bool]]:
        """(event, running) for every event waiting or computing."""
        for events in queue.event_queue_per_concurrency_id.values():
            for event in events.queue:
                yield event, False
        for job in queue.active_jobs:
            for event in job or ():
                yield event, True

    def _counts(self, queue) -> Counter[str]:
        counts: Counter[str] = Counter()
        for event, _ in self._events(queue):
            counts[f"ip:{client_ip(event.request)}"] += 1
            if event.data is not None and event.data.session_hash:
                counts[f"session:{event.data.session_hash}"] += 1
        return counts

    @staticmethod
    def _client(event) -> str:
        """Whose line an event stands in. Behind a proxy (a Space) the address it appended: a client makes new
        sessions for free, not new addresses (100 requests with 100 sessions from one address would each start
        a line of their own, and a newcomer would wait behind all of them). Elsewhere (the header ignored; local
        clients may share an address) its session, or for sessionless API calls its address."""
        if proxy_hops():
            return f"ip:{client_ip(event.request)}"
        session = event.data.session_hash if event.data is not None else None
        return session if session and session != event._id else f"ip:{client_ip(event.request)}"

    def _place(self, queue, event_id: str) -> None:
        """Move the event just queued (last in its line) behind the events that are as deep into their own
        client's line as it is into its client's (running events count as the first places)."""
        event = queue.event_ids_to_events.get(event_id)
        line = queue.event_queue_per_concurrency_id.get(getattr(event, "concurrency_id", None))
        if event is None or line is None or not line.queue or line.queue[-1] is not event:
            return
        line.queue.pop()
        depth = Counter(self._client(e) for e, running in self._events(queue) if running)
        mine = self._client(event)
        rank = depth[mine] + sum(self._client(e) == mine for e in line.queue)
        for i, other in enumerate(line.queue):
            key = self._client(other)
            if depth[key] > rank:
                line.queue.insert(i, event)
                return
            depth[key] += 1
        line.queue.append(event)


class OwnCancels:
    """ASGI middleware for Gradio's cancel route (see the module's docstring): a cancel that would reach an event of
    another address is refused (403); any other goes on to Gradio (``blocks``: the app, whose queue is read)."""

    def __init__(self, app: Callable, blocks: gr.Blocks) -> None:
        self.app, self.blocks = app, blocks

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/cancel"):
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:  # at most ``bodies.MAX_JSON_BYTES``: ``BodyLimits`` read it first
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        queue = getattr(self.blocks, "_queue", None)
        if queue is not None and _reaches_another(queue, body, client_ip(Request(scope))):
            log.info("refused a cancel of an event another address queued")
            await refuse(send, 403, "Only the client that started an event can cancel it.")
            return
        await self.app(scope, replay, send)


def _reaches_another(queue: Any, body: bytes, address: str) -> bool:
    """Whether the cancel ``body`` names an event, or the running listener of a session, that a client other
    than ``address`` queued."""
    try:
        asked = json.loads(body)
    except ValueError:
        return False  # Gradio refuses it (422)
    if not isinstance(asked, dict):
        return False
    session, fn, event = asked.get("session_hash"), asked.get("fn_index"), asked.get("event_id")
    for queued, _ in ClientLimits._events(queue):
        reached = queued._id == event or (queued.session_hash == session and getattr(queued.fn, "_id", None) == fn)
        if reached and (queued.request is None or client_ip(queued.request) != address):
            return True
    return False


# ---------------------------------------------------------------------------------------------- uploads


class UploadLimits:
    """ASGI middleware for Gradio's upload route: an upload must declare its length (411), at most
    ``max_bytes`` in all (413), and leave ``MIN_FREE_DISK`` free where Gradio stores it (507); refused from
    its headers at once. Gradio's ``max_file_size`` bounds each file of it as the bytes arrive."""

    def __init__(self, app: Callable, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes
        folder = Path(os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio")
        self.folder = next(p for p in (folder, *folder.parents) if p.exists())

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].endswith("/upload"):
            refusal = self._refusal(dict(scope["headers"]).get(b"content-length", b""))
            if refusal is not None:
                status, text = refusal
                log.info("refused an upload: %s", text)
                body = text.encode()
                headers = [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ]
                await send(
                    {"type": "http.response.start", "status": status, "headers": [*headers, (b"connection", b"close")]}
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def _refusal(self, length: bytes) -> tuple[int, str] | None:
        if not length.isdigit():
            return 411, "An upload must declare its length (Content-Length)."
        if int(length) > self.max_bytes + MB:  # the files and the form around them
            return (
                413,
                f"Uploads are at most {self.max_bytes / MB:,.0f} MB at once; this one is {int(length) / MB:,.0f} MB.",
            )
        if shutil.disk_usage(self.folder).free - int(length) < MIN_FREE_DISK:
            return 507, "The server's disk is nearly full; try again later."
        return None


# ------------------------------------------------------------------------------------- connections

HEADER_TIMEOUT_S = 10.0  # a request's headers must arrive within this of the connection's start or its last answer
MAX_PER_ADDRESS = 128  # open connections per address group (a page uses a few; a busy office's NAT, dozens)
FD_RESERVE = 512  # file descriptors kept out of ``total`` for the process's own files, pipes and its training job
ACCEPT_LOG_EVERY_S = 60.0


class Connections:
    """Uvicorn's HTTP connections timed and counted (see the module's docstring); ``install`` before launch."""

    def __init__(self, per_address: int | None = MAX_PER_ADDRESS, total: int | None = None) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:  # every descriptor the system allows this process (the default soft limit is often 1,024)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.total = min(total or limit, max(16, limit - FD_RESERVE))
        self.per_address = per_address if proxy_hops() == 0 else None
        self.header_timeout = HEADER_TIMEOUT_S
        self.by_group: dict[str, set[Any]] = {}
        self.idle: OrderedDict[Any, None] = OrderedDict()  # waiting for a request, longest first
        self.evicted = self.refused = self.count = 0  # ``count``: the connections open

    def install(self) -> None:
        logging.getLogger("asyncio").addFilter(AcceptErrors())
        wrap_server_config(lambda config: setattr(config, "http", self.protocol()))  # Gradio's uvicorn.Config

    def admit(self, conn: Any, group: str) -> bool:
        """Count ``conn``, making room for it; False when its group is at its cap or every connection is busy."""
        for gone in [c for c in self.by_group.get(group, ()) if c.transport.is_closing()]:  # a WebSocket's, closed
            self.release(gone)
        mine = self.by_group.setdefault(group, set())
        if self.per_address is not None and len(mine) >= self.per_address:
            self.refused += 1
            return False
        if self.count >= self.total:
            oldest = next(iter(self.idle), None)
            if oldest is None:
                self.refused += 1
                return False
            self.evicted += 1
            oldest.transport.abort()  # its connection_lost releases it
            self.release(oldest)
        self.by_group.setdefault(group, set()).add(conn)  # anew: the eviction may have emptied it
        conn.group, self.count = group, self.count + 1
        return True

    def release(self, conn: Any) -> None:
        self.idle.pop(conn, None)
        group = self.by_group.get(getattr(conn, "group", ""), set())
        if conn in group:
            group.discard(conn)
            self.count -= 1
            if not group:
                del self.by_group[conn.group]

    def protocol(self) -> type[asyncio.Protocol]:
        """Uvicorn's HTTP protocol (h11's, or httptools' when installed) with this guard's hooks."""
        guard = self

        class Guarded(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                self.timer: asyncio.TimerHandle | None = None
                if not guard.admit(self, address_group(self.client[0]) if self.client else "unknown"):
                    transport.abort()
                    return
                self.wait_for_request()

            def wait_for_request(self) -> None:
                """From now (the connection's start, or its last answer) its next request has its timeout."""
                self.waiting = self.cycle
                guard.idle[self] = None
                guard.idle.move_to_end(self)
                if self.timer is not None:
                    self.timer.cancel()
                self.timer = self.loop.call_later(guard.header_timeout, self.no_request)

            def no_request(self) -> None:
                if self.cycle is self.waiting and not self.transport.is_closing():
                    self.transport.close()  # no request's headers within the timeout

            def data_received(self, data: bytes) -> None:
                super().data_received(data)
                if self.cycle is not self.waiting:  # a request's headers arrived
                    guard.idle.pop(self, None)

            def on_response_complete(self) -> None:
                super().on_response_complete()
                if not self.transport.is_closing():
                    self.wait_for_request()

            def connection_lost(self, exc: Exception | None) -> None:
                if getattr(self, "timer", None) is not None:
                    self.timer.cancel()
                guard.release(self)
                super().connection_lost(exc)

        return Guarded


class AcceptErrors(logging.Filter):
    """asyncio's "socket.accept() out of system resource" (a traceback per attempt: 382,975 lines in a minute once)
    let through once per ``ACCEPT_LOG_EVERY_S``, with the count since, without its traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.last, self.count = -ACCEPT_LOG_EVERY_S, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("socket.accept() out of system resource"):
            return True
        self.count += 1
        now = time.monotonic()
        if now - self.last < ACCEPT_LOG_EVERY_S:
            return False
        error = record.exc_info[1] if record.exc_info else None
        record.msg, record.args, record.exc_info = f"socket.accept() failed {self.count} times: %s", (error,), None
        self.last, self.count = now, 0
        return True
