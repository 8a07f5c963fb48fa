"""One memory budget for the whole server: every compute listener in one concurrency group, behind one gate.

Gradio limits each event listener's concurrency on its own and keeps one first-in, first-out queue for all
clients. On a public server that leaves two holes: requests to different listeners run at once, so
``--concurrency 1`` bounds nothing (five 49.9 MP requests to five listeners ran together), and one client can
fill the queue (100 requests from one client: the next person was refused, or waited 53 s). So:

- **One concurrency group.** Every compute listener, UI-only ones included, joins ``COMPUTE``: at most
  ``--concurrency`` requests compute at once across the whole server.
- **One memory budget** (``Gate``). Each request's peak memory is estimated before it runs (its tab's ``estimate``, from
  the image's header and the model's config, nothing decoded) and it is admitted only when it fits:
  ``base + reserved + running + cost <= --max-memory`` (``reserved``: the room Gradio's sessions may still
  take, ``webapp.server.sessions``), where ``running`` sums the estimates of the requests computing
  and ``base`` is the RSS without them (``max(RSS when last idle, RSS now - running)``). Otherwise it waits
  up to ``--max-wait`` seconds for requests to finish, then hears "busy, try again in N s"; one that could
  never fit is refused at once. After a request estimated at ``TRIM_ABOVE`` or more, the freed memory is
  handed back to the OS (``webapp.resources.release_memory``: young cycles and ``malloc_trim``; a full collection
  once the server has been idle for ``QUIET_SECONDS``), so RSS after a burst settles where it started.

The estimate of each request is ``webapp.inference.estimates``; fair queueing and upload limits are
``webapp.server.queueing``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import gradio as gr

from ..errors import log
from ..resources import MB, release_memory

COMPUTE = "compute"  # the concurrency group of every compute listener
DEFAULT_SHARE = 0.8  # of the container's memory limit (else the machine's): the default --max-memory
TRIM_ABOVE = 64 * MB  # requests estimated at this or more hand their freed memory back when they finish
QUIET_SECONDS = 2.0  # quiet after a large request before a full garbage collection

# ------------------------------------------------------------------------------------------ the budget


def container_memory_limit(
    cgroups: Path = Path("/proc/self/cgroup"), mount: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The memory limit of this process's cgroup: the smallest of cgroup v2's ``memory.max`` or v1's
    ``memory.limit_in_bytes`` (under ``mount``/memory) along its path; None when unlimited (v1 says so with a
    huge number), or unknown."""
    try:
        lines = cgroups.read_text().splitlines()
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None
    limits = []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":
            root, name = mount, "memory.max"
        elif "memory" in controllers.split(","):
            root, name = mount / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = root / path.lstrip("/")
        for parent in [folder, *folder.parents]:  # a limit on any ancestor applies too
            try:
                text = (parent / name).read_text().strip()
            except OSError:
                text = ""
            if text.isdigit() and int(text) < physical:
                limits.append(int(text))
            if parent == root:
                break
    return min(limits, default=None)


def default_max_memory() -> int:
    """``DEFAULT_SHARE`` of the container's memory limit, else of the machine's physical memory."""
    limit = container_memory_limit() or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(DEFAULT_SHARE * limit)


def rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Busy(gr.Error):
    """Refused for now: the server's memory budget is taken."""


class Gate:
    """Admits requests while their estimated memory fits ``max_memory`` (see the module's docstring)."""

    def __init__(self, max_memory: int | None = None, max_wait: float = 10.0) -> None:
        self.max_memory = default_max_memory() if max_memory is None else max_memory
        self.max_wait = max_wait
        self._cond = threading.Condition()
        self._running, self._count = 0, 0  # estimated bytes and number of the requests computing
        self._idle_rss = rss()
        self._seconds = 1.0  # moving average of how long a request computes
        self._idle = threading.Event()  # set when the server goes idle after a large request
        self._collector: threading.Thread | None = None  # started at the first large request
        self.reserved: Callable[[], int] = lambda: 0  # memory kept for what is not a request (sessions to come)

    @contextmanager
    def held(self, cost: int) -> Iterator[None]:
        """Hold ``cost`` bytes of the budget while the block runs (waiting, or refused with ``Busy``)."""
        self._acquire(cost)
        t0 = time.monotonic()
        try:
            yield
        finally:
            self._release(cost, time.monotonic() - t0)

    def _base(self) -> int:
        return max(self._idle_rss, rss() - self._running)

    def _acquire(self, cost: int) -> None:
        with self._cond:
            if self._idle_rss + self.reserved() + cost > self.max_memory:
                log.info(
                    "refused: %.0f MB asked, %.0f MB idle, budget %.0f MB",
                    cost / MB,
                    self._idle_rss / MB,
                    self.max_memory / MB,
                )
                room = max(0, self.max_memory - self._idle_rss - self.reserved())
                raise Busy(
                    f"This request needs about {cost / MB:,.0f} MB of memory, more than this server has for "
                    f"one request ({room / MB:,.0f} MB); send a smaller image or fewer at once.",
                    print_exception=False,
                )
            deadline = time.monotonic() + self.max_wait
            while self._base() + self.reserved() + self._running + cost > self.max_memory:
                left = deadline - time.monotonic()
                if left <= 0:
                    retry = max(1, math.ceil(self._seconds * self._count))
                    log.info("busy: %.0f MB asked, %.0f MB running", cost / MB, self._running / MB)
                    raise Busy(f"The server is busy; try again in {retry} s.", print_exception=False)
                self._cond.wait(left)
            self._running += cost
            self._count += 1

    def _release(self, cost: int, seconds: float) -> None:
        if cost >= TRIM_ABOVE:
            release_memory(generation=1)  # the request's young cycles and the allocator's free pages: ~ms
        with self._cond:
            self._running -= cost
            self._count -= 1
            self._seconds = 0.8 * self._seconds + 0.2 * seconds
            if self._count == 0:
                self._idle_rss = rss()
                if cost >= TRIM_ABOVE:
                    if self._collector is None:
                        self._collector = threading.Thread(target=self._collect_when_idle, daemon=True)
                        self._collector.start()
                    self._idle.set()
            self._cond.notify_all()

    def _collect_when_idle(self) -> None:
        """A full collection (half a second of the interpreter's time) once the server has been idle for
        ``QUIET_SECONDS`` after a large request: cycles that outlived the young generations go too."""
        while True:
            self._idle.wait()
            self._idle.clear()
            time.sleep(QUIET_SECONDS)
            with self._cond:
                if self._count or self._idle.is_set():
                    continue  # busy again, or another request ended since: wait for its quiet
            release_memory()
            with self._cond:
                if self._count == 0:
                    self._idle_rss = rss()
