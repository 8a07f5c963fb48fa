"""Gradio's per-session state, bounded in number and idle time, and kept in the memory budget.

Gradio keeps a copy of the page's configuration for every session hash it is sent (about 190 KB for this
page), up to 10,000 of them: 30,000 calls with fresh session hashes took the server from 817 to 2,726 MB, and
each REST ``/call`` (which has no session) left one behind under its event id. ``Sessions``:

- keeps at most ``MAX_SESSIONS`` (the least recently used goes first, as Gradio's own capacity does) and drops a
  session unused for ``IDLE_SECONDS`` (a page left open that long starts again from the defaults);
- drops the state of a sessionless call (REST ``/call``, ``gradio_client`` without a session) when its request
  ends, so no request leaves state behind that nobody can come back for;
- tells the handlers who calls (``trained.Caller``: the session hash and the address), which owns the
  models trained here and their jobs;
- reserves the room the sessions may still take (``SESSION_BYTES`` each) in the memory gate
  (``Gate.reserved``), so that requests admitted now still fit when the table fills;
- makes a new session's state light and, given a ``newcomers.SessionRate`` (public mode), refuses an address
  more new sessions than it allows (``newcomers.Newcomers``; its ``RequestScope`` middleware must be installed).
"""

from __future__ import annotations

import datetime
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import gradio as gr

from ..errors import log
from ..registry.access import Caller, calling
from .admission import Gate
from .gradio_patches import wrap_process_api
from .newcomers import Newcomers, SessionRate
from .queueing import client_ip

MAX_SESSIONS = 1000
IDLE_SECONDS = 1800.0
SESSION_BYTES = 256 << 10  # measured ~190 KB a session for this page (``bench.hostile``'s session flood)
SWEEP_SECONDS = 60.0


class Sessions:
    """Bounds ``demo``'s session table (see the module's docstring); ``install`` after ``demo.launch``."""

    def __init__(
        self, max_sessions: int = MAX_SESSIONS, idle_seconds: float = IDLE_SECONDS, rate: SessionRate | None = None
    ) -> None:
        self.max_sessions, self.idle_seconds, self.rate = max_sessions, idle_seconds, rate
        self.holder: Any = None

    def install(self, demo: gr.Blocks, gate: Gate | None = None) -> None:
        self.holder = Newcomers.install(demo.server_app.state_holder, self.rate)
        self.holder.capacity = self.max_sessions
        self._drop_sessionless(demo)
        if gate is not None:
            gate.reserved = self.room
        threading.Thread(target=self._sweep_forever, daemon=True, name="sessions").start()

    def live(self, session: str) -> bool:
        """Whether ``session``'s state is kept (its page may still ask; dropped when idle, or at once for a
        sessionless call): what a visitor can still reach (``webapp.jobs.trainer``'s caps follow it)."""
        return self.holder is None or session in self.holder.session_data

    def room(self) -> int:
        """Bytes the sessions not yet made may take."""
        return max(0, self.max_sessions - len(self.holder.session_data)) * SESSION_BYTES

    def _drop_sessionless(self, demo: gr.Blocks) -> None:
        """A call without a session runs under its event id as session hash: its state goes when it ends
        (unless it is a generator that will be called again). Every call runs as its ``Caller``."""
        wrap_process_api(demo, self._dropping, "sessions")

    def _dropping(self, process_api: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(process_api)
        async def dropping(*args: Any, **kwargs: Any) -> dict[str, Any]:
            session, event = kwargs.get("session_hash"), kwargs.get("event_id")
            generating = False
            try:
                with calling(_caller(session, kwargs.get("request"))):
                    output = await process_api(*args, **kwargs)
                generating = bool(output.get("is_generating"))
                return output
            finally:
                if session is not None and session == event and not generating:
                    with self.holder.lock:
                        self.holder.session_data.pop(session, None)
                        self.holder.time_last_used.pop(session, None)

        return dropping

    def sweep(self, now: datetime.datetime | None = None) -> int:
        """Drop the sessions unused for ``idle_seconds``; returns how many."""
        cutoff = (now or datetime.datetime.now()) - datetime.timedelta(seconds=self.idle_seconds)
        with self.holder.lock:
            idle = [s for s, t in list(self.holder.time_last_used.items()) if t < cutoff]
            for session in idle:
                self.holder.session_data.pop(session, None)
                self.holder.time_last_used.pop(session, None)
        if idle:
            log.info("dropped %d sessions idle for %.0f s", len(idle), self.idle_seconds)
        return len(idle)

    def _sweep_forever(self) -> None:
        while True:
            time.sleep(SWEEP_SECONDS)
            self.sweep()


def _caller(session: str | None, request: Any) -> Caller:
    """Who sends a request Gradio is processing (a batch's: its first request's address); never None, which
    would stand for the server itself."""
    if isinstance(request, list):
        request = request[0] if request else None
    return Caller(session or "", client_ip(request) if request is not None else "unknown")
