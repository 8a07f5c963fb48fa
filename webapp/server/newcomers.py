"""New sessions: cheap to make, and on a public server at most ``NEW_SESSIONS_PER_MINUTE`` per address.

A session is whatever hash a request names: anyone can make one for free, and Gradio builds its state on the
first request that names it, on the server's event loop. For this page that was a copy of every block's
configuration (132 blocks, 35 ms of CPU and ~190 KB), which Gradio keeps only to answer deep links: 19 new
sessions a second from one address (8 connections) took another visitor's Classify from 0.3 s to 6.5-15 s.
So (``Newcomers``, installed by ``sessions.Sessions``):

- **a new session's state is light** (``LightState``): the blocks' configurations are computed when one is
  first read (a deep link reads them all; an event only those of its inputs and outputs), not when the session
  is made; what is read is what Gradio's own state computes (``tests/test_app_limits.py`` compares them);
- **new sessions are rate-limited per address group** (``SessionRate``, ``queueing.address_group``: an IPv4
  address, an IPv6 /64): a token bucket of ``NEW_SESSIONS_BURST`` that refills at ``NEW_SESSIONS_PER_MINUTE``.
  A request that would make one more is answered 429 with a sentence and ``Retry-After`` before anything is
  built for it; sessions already made go on as before, and so do REST calls without a session (they keep none:
  ``sessions.Sessions``). Public mode only: locally the one visitor is the operator.

The address of the request making the session is read from its ASGI scope (``RequestScope``, a middleware that
only remembers the scope), because Gradio makes sessions deep inside its routes, where no request is at hand.
A session made outside any request (the queue's own workers, REST calls' event ids) is never counted.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from copy import copy
from typing import Any

from fastapi import HTTPException
from gradio.state_holder import SessionState, StateHolder
from starlette.requests import Request

from ..errors import log
from .gradio_patches import become
from .queueing import client_ip

# A person opens a page, maybe a few tabs, a minute; a school behind one IPv4 address opens more at 9:00, so the
# bucket holds a minute's worth at once. 20 new sessions a second from one address get 60, then one a second.
NEW_SESSIONS_PER_MINUTE = 60
NEW_SESSIONS_BURST = 60

_SCOPE: ContextVar[dict | None] = ContextVar("request_scope", default=None)


class SessionRate:
    """A token bucket of ``burst`` new sessions per address group, refilled at ``per_minute``; ``clock`` in
    seconds (``time.monotonic``; a test passes its own). Groups whose bucket is full again are forgotten, so
    the table holds only the groups seen in the last ``burst / per_minute`` minutes."""

    def __init__(
        self,
        per_minute: float = NEW_SESSIONS_PER_MINUTE,
        burst: int = NEW_SESSIONS_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.clock = per_minute / 60.0, burst, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # group -> (tokens, when), oldest first
        self._lock = threading.Lock()

    def take(self, group: str) -> float:
        """One new session for ``group``: 0.0 when it may make it (a token taken), else the seconds until it may."""
        now = self.clock()
        with self._lock:
            self._forget_full(now)
            tokens, when = self._buckets.pop(group, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate)
            if tokens >= 1.0:
                self._buckets[group] = (tokens - 1.0, now)
                return 0.0
            self._buckets[group] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def __len__(self) -> int:
        return len(self._buckets)

    def _forget_full(self, now: float) -> None:
        refill = self.burst / self.rate  # an untouched bucket is full again after this long
        while self._buckets:
            group, (_, when) = next(iter(self._buckets.items()))
            if now - when < refill:
                return
            del self._buckets[group]


def refusal(wait: float) -> str:
    """What a client over the limit reads."""
    return (
        f"Too many new sessions from your address: this server opens at most {NEW_SESSIONS_PER_MINUTE} a minute "
        f"for one address. Keep using a page you have open, or try again in {math.ceil(wait)} s."
    )


class RequestScope:
    """ASGI middleware: remembers the request's scope for the code below it (``_SCOPE``), nothing else."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        token = _SCOPE.set(scope if scope["type"] == "http" else None)
        try:
            await self.app(scope, receive, send)
        finally:
            _SCOPE.reset(token)


class _Configs(dict):
    """``SessionState.config_values``, each block's configuration computed when first read: ``pending`` are
    the blocks not read yet, whose block in ``blocks_config`` is still the one the session started with (a
    block the session replaces gets its configuration set at once, by Gradio)."""

    def __init__(self, blocks_config: Any, pending: list[int]) -> None:
        super().__init__()
        self._config, self._order, self._pending = blocks_config, pending, set(pending)

    def _fill(self, key: int) -> None:
        if key in self._pending:
            self._pending.discard(key)
            block = self._config.blocks[key]
            dict.__setitem__(self, key, self._config.config_for_block(key, [], block))

    def _fill_all(self) -> None:
        if self._pending:
            for key in list(self._pending):
                self._fill(key)
            rank = {k: i for i, k in enumerate(self._order)}  # Gradio's order: the blocks', then the rest
            ordered = sorted(dict.items(self), key=lambda kv: rank.get(kv[0], len(rank)))
            dict.clear(self)
            dict.update(self, ordered)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._pending

    def __getitem__(self, key: int) -> Any:
        self._fill(key)
        return dict.__getitem__(self, key)

    def get(self, key: int, default: Any = None) -> Any:
        self._fill(key)
        return dict.get(self, key, default)

    def __setitem__(self, key: int, value: Any) -> None:
        self._pending.discard(key)
        dict.__setitem__(self, key, value)

    def __iter__(self) -> Iterator[int]:
        self._fill_all()
        return dict.__iter__(self)

    def __len__(self) -> int:
        return dict.__len__(self) + len(self._pending)

    def keys(self) -> Any:
        self._fill_all()
        return dict.keys(self)

    def values(self) -> Any:
        self._fill_all()
        return dict.values(self)

    def items(self) -> Any:
        self._fill_all()
        return dict.items(self)


class LightState(SessionState):
    """Gradio's ``SessionState`` with its blocks' configurations computed when read (``_Configs``)."""

    def __init__(self, blocks: Any) -> None:  # SessionState.__init__ but for config_values
        self.blocks_config = copy(blocks.default_config)
        self.config_values = _Configs(self.blocks_config, [k for k in self.blocks_config.blocks if k in blocks.blocks])
        self.state_data: dict[int, Any] = {}
        self._state_ttl: dict[int, Any] = {}
        self.is_closed = False
        self.STATE_TTL_WHEN_CLOSED = 1 if os.getenv("GRADIO_IS_E2E_TEST", None) else 3600


class Newcomers(StateHolder):
    """Gradio's table of sessions, making new ones light and, with a ``rate``, counted per address group.
    ``install`` turns Gradio's own table into one (its sessions kept)."""

    rate: SessionRate | None = None

    @classmethod
    def install(cls, holder: StateHolder, rate: SessionRate | None) -> Newcomers:
        holder = become(holder, cls)
        holder.rate = rate
        return holder

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self._admit()
            self.session_data.setdefault(session_id, LightState(self.blocks))
        return super().__getitem__(session_id)

    def _admit(self) -> None:
        """Refuse (429) a request over its address's rate; a session made outside a request is not counted."""
        scope = _SCOPE.get()
        if self.rate is None or scope is None:
            return
        group = client_ip(Request(scope))
        wait = self.rate.take(group)
        if wait > 0:
            log.info("refused a new session: its address is over %d new sessions a minute", NEW_SESSIONS_PER_MINUTE)
            raise HTTPException(429, refusal(wait), headers={"Retry-After": str(math.ceil(wait))})
