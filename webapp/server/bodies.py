"""Request bodies bounded while they stream, before anything parses them (ASGI middleware, every route).

A framework reads a request's body whole and then parses it: five 300 MB JSON bodies sent to the queue took
the server past 5 GB before any check ran. ``BodyLimits`` wraps the whole app, so every route is covered:

- **JSON and form bodies** (every route but uploads): at most ``MAX_JSON_BYTES``, refused from Content-Length
  at once (413), and, for a chunked body, counted as it arrives and refused at the first chunk over the limit
  (nothing past it is read, nothing is parsed). The largest request the app's page or API sends is a /batch
  of ``batch.MAX_FILES`` files: about 300 bytes each, 77 KB in all (``tests/test_app_limits.py`` builds it),
  so 1 MB leaves room and still refuses a long string before it is allocated.
- **All bodies in flight together** at most ``MAX_IN_FLIGHT_BYTES``: a thousand slow clients each sending
  most of a megabyte are answered "busy" (503) instead of being held in memory.
- **Uploads** (``*/upload``) are bounded by ``queueing.UploadLimits`` (declared length, per file and in all).
- **A client that hangs up** mid-request ends in one log line, not a traceback.
- **Two streams of one session** (a page's ``/queue/data`` and a REST ``/call/<api>/<event>`` whose body named
  the same ``session_hash``): when one ends the session's queue of messages, Gradio's other stream raises a 404
  inside a response already started, or, when its client has hung up meanwhile, a ``KeyError`` deleting the
  messages the first already deleted; Starlette turned either into a traceback in the log. Those cases only (a
  stream route, after the response started) end the stream quietly, in one log line (``_orphaned``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..errors import log

MAX_JSON_BYTES = 1 << 20  # one request's body, uploads apart
MAX_IN_FLIGHT_BYTES = 64 << 20  # the bodies of every request being read at once


def is_upload(scope: dict) -> bool:
    """Whether ``scope`` is Gradio's upload route (``/upload``, ``/gradio_api/upload``)."""
    return scope["method"] == "POST" and scope["path"].endswith("/upload")


class TooLarge(Exception):
    """A body past its limit: ``status`` and the sentence the client reads."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def refuse(send: Callable, status: int, text: str) -> None:
    """A plain-text answer that closes the connection (the rest of the body is not read)."""
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimits:
    """ASGI middleware: every body but an upload's read here first, at most ``max_bytes``, before the app sees
    it (then handed on unchanged); all bodies being read at most ``max_in_flight`` bytes together; a client
    that disconnects mid-request logged in one line (see the module's docstring)."""

    def __init__(
        self, app: Callable, max_bytes: int = MAX_JSON_BYTES, max_in_flight: int = MAX_IN_FLIGHT_BYTES
    ) -> None:
        self.app, self.max_bytes, self.max_in_flight = app, max_bytes, max_in_flight
        self.in_flight = 0  # bytes held by bodies being read (one event loop: no lock needed)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            if not is_upload(scope):
                receive = await self._read(scope, receive)
            await self.app(scope, receive, sending)
        except TooLarge as e:
            log.info("refused a request to %s: %s", scope["path"][:100], e)
            await refuse(send, e.status, str(e))
        except ClientDisconnect:
            log.info("a client disconnected during its request to %s", scope["path"][:100])
        except (RuntimeError, KeyError) as e:
            if not (started and _orphaned(scope, e)):
                raise
            log.info(
                "a stream of a session ended: another stream of the same session closed it (%s)", scope["path"][:100]
            )
            with contextlib.suppress(Exception):  # the client may be gone too
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _read(self, scope: dict, receive: Callable) -> Callable:
        """The body read whole within the limits, and a ``receive`` that replays it."""
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            raise TooLarge(413, self._too_large(int(length)))
        chunks, size = [], 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_bytes:
                    raise TooLarge(413, self._too_large(size, so_far=True))
                if self.in_flight + len(chunk) > self.max_in_flight:
                    raise TooLarge(503, "The server is receiving too much at once; try again in a few seconds.")
                self.in_flight += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        finally:
            self.in_flight -= sum(len(c) for c in chunks)
        body = b"".join(chunks)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        return replay

    def _too_large(self, size: int, so_far: bool = False) -> str:
        what = f"{size:,} bytes so far" if so_far else f"{size:,} bytes"
        return (
            f"Request bodies are at most {self.max_bytes:,} bytes here (this one: {what}); "
            "images and archives go through the upload route."
        )


def _orphaned(scope: dict, e: RuntimeError | KeyError) -> bool:
    """Whether ``e`` is Gradio's stream of a session finding the session's messages gone, inside the started
    response of ``/queue/data`` or ``/call/<api>/<event>``: a 404 raised there, or a ``KeyError`` deleting them
    again as the stream is cancelled (its client gone, the other stream having deleted them)."""
    path = scope["path"]
    stream = scope["method"] == "GET" and (path.endswith("/queue/data") or "/call/" in path)
    if isinstance(e, KeyError):
        return stream
    cause = e.__cause__
    return stream and isinstance(cause, HTTPException) and cause.status_code == 404
