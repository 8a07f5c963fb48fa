"""One memory budget for the whole server, and a fair share of the queue for each client.

Gradio limits each event listener's concurrency on its own and keeps one first-in, first-out queue for all
clients. On a public server that leaves two holes: requests to different listeners run at once, so
``--concurrency 1`` bounds nothing (five 49.9 MP requests to five listeners ran together), and one client can
fill the queue (100 requests from one client: the next person was refused, or waited 53 s). So:

- **One concurrency group.** Every compute listener, UI-only ones included, joins ``COMPUTE``: at most
  ``--concurrency`` requests compute at once across the whole server.
- **One memory budget** (``Gate``). Each request's peak memory is estimated before it runs (``Costs``, from
  the image's header and the model's config, nothing decoded) and it is admitted only when it fits:
  ``base + running + cost <= --max-memory``, where ``running`` sums the estimates of the requests computing
  and ``base`` is the RSS without them (``max(RSS when last idle, RSS now - running)``). Otherwise it waits
  up to ``--max-wait`` seconds for requests to finish, then hears "busy, try again in N s"; one that could
  never fit is refused at once. After a request estimated at ``TRIM_ABOVE`` or more, the freed memory is
  handed back to the OS (``memory.release_memory``: young cycles and ``malloc_trim``; a full collection
  once the server has been idle for ``IDLE_SECONDS``), so RSS after a burst settles where it started.
- **A fair share of the queue** (``ClientLimits``). A client (a Gradio session, and separately an IP
  address) may have at most ``per_session`` (``per_ip``) requests waiting or computing; more are refused
  when they join the queue ("you have N requests waiting"), so one client never fills it. The queue is
  served round robin by client: a request joins behind the requests that are as many places into their own
  client's line as it is into its own, so a newcomer waits for at most one request of each other client.
- **Bounded uploads** (``UploadLimits``, with Gradio's own ``max_file_size`` per file). An upload must declare
  its length, at most ``max_bytes`` in all, and leave ``MIN_FREE_DISK`` free on the disk it goes to; it is
  refused from its headers, before a byte of it is read.

**The estimate**, in bytes above the idle RSS: ``REQUEST_BYTES + max(decoding, after)``, the upload being
decoded (and its full-size pixels freed) before the model runs and the pictures are drawn. Each part was
measured on the bundled model and a ViT-B/16 on a CPU; ``tests/test_app.py`` checks that the estimate
bounds the peak of real requests.

=====================  ===========================================================================================
``REQUEST_BYTES``      Gradio's side of any request (reading the upload, the response), and a margin
decoding               ``ImageHeader.decode_bytes`` at ``MAX_SIDE``: 4 bytes a decoded pixel for colour (1 for
                       gray, 16 for WebP...); JPEG decodes at 1/2, 1/4 or 1/8 scale, other formats at full size;
                       then the reduced copies, 28 bytes a pixel of the result (Batch: one image at a time, at
                       most ``batch.MAX_DECODE_BYTES``)
after                  the reduced image (4 bytes a pixel), the endpoint's pictures (``DRAW_BYTES`` a pixel of
                       it) and the model
the model (CPU only)   ``vit_core.model.activation_bytes`` per image of a forward pass, times the images of the
                       largest batch the endpoint runs (RISE: 64 masked images; Compare: every map, then
                       ``COMPARE_STEPS + 1`` images per curve; Batch: ``batch.chunk_size``), a backward pass
                       (gradient rollout) ``BACKWARD`` times a forward pass, and RISE's masks; on a GPU the
                       model's memory is the GPU's, not counted here
=====================  ===========================================================================================
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from vit_core import ViTConfig, explain
from vit_core.data import ImageDataError, ImageHeader, ImageTransform, read_header
from vit_core.data.images import target_size
from vit_core.model import activation_bytes

from . import batch
from .analysis import (
    COMPARE_STEPS,
    GRADIENT,
    MAX_PIXELS,
    MAX_SIDE,
    RISE,
    default_method,
    needed_side,
    rise_affordable,
)
from .errors import log
from .memory import release_memory

MB = 2**20
COMPUTE = "compute"  # the concurrency group of every compute listener
DEFAULT_SHARE = 0.8  # of the container's memory limit (else the machine's): the default --max-memory
REQUEST_BYTES = 48 * MB  # Gradio's side of a request, and a margin
# Drawing, per pixel of the reduced image: the overlay at its size and its encoding (classify), the explorer's
# 720-pixel view, 320-pixel crops (a patch; compare's five maps). Measured 23, 2, 5 and 19.
DRAW_BYTES = {"classify": 36, "view": 4, "explore": 8, "compare": 24}
BACKWARD = 6  # forward and backward passes (gradient rollout) keep this many forward passes' activations
BATCH_IMAGES = 64  # RISE's and deletion/insertion's batches of masked images (``explain``'s batch_size)
TRIM_ABOVE = 64 * MB  # requests estimated at this or more hand their freed memory back when they finish
IDLE_SECONDS = 2.0  # quiet after a large request before a full garbage collection
INSPECT_BYTES = 64 * MB  # the Inspect tab's matplotlib figures
MIN_FREE_DISK = 1 << 30  # uploads that would leave less free on their disk are refused

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

    def admit(self, fn: Callable, cost: Callable[[dict[str, Any]], int]) -> Callable:
        """``fn`` (a Gradio listener) behind the gate: ``cost`` gets its arguments by name and returns its
        estimated peak memory in bytes. The signature is ``fn``'s (Gradio reads it for progress and events)."""
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def gated(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs).arguments
            with self.held(cost(bound)):
                return fn(*args, **kwargs)

        return gated

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
            if self._idle_rss + cost > self.max_memory:
                log.info(
                    "refused: %.0f MB asked, %.0f MB idle, budget %.0f MB",
                    cost / MB,
                    self._idle_rss / MB,
                    self.max_memory / MB,
                )
                raise Busy(
                    f"This request needs about {cost / MB:,.0f} MB of memory, more than this server has for "
                    f"one request ({max(0, self.max_memory - self._idle_rss) / MB:,.0f} MB); send a smaller "
                    "image or fewer at once.",
                    print_exception=False,
                )
            deadline = time.monotonic() + self.max_wait
            while self._base() + self._running + cost > self.max_memory:
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
        ``IDLE_SECONDS`` after a large request: cycles that outlived the young generations go too."""
        while True:
            self._idle.wait()
            self._idle.clear()
            time.sleep(IDLE_SECONDS)
            with self._cond:
                if self._count or self._idle.is_set():
                    continue  # busy again, or another request ended since: wait for its quiet
            release_memory()
            with self._cond:
                if self._count == 0:
                    self._idle_rss = rss()


# -------------------------------------------------------------------------------------- the estimate


def forward_bytes(cfg: ViTConfig, images: int, attention: bool = True) -> int:
    """Activation memory of a forward pass of ``images`` images: ``activation_bytes`` each, less the stored
    attention probabilities when they are not returned."""
    per_image = activation_bytes(cfg)
    if not attention:
        tokens = cfg.num_prefix_tokens + math.prod(cfg.grid_size)
        per_image -= 4 * cfg.depth * cfg.num_heads * tokens * tokens
    return images * per_image


def model_bytes(
    cfg: ViTConfig, work: str, method: str | None, device: torch.device, rise: bool = True, images: int = 1
) -> int:
    """The model's part of a request's estimate (zero on a GPU: that memory is the GPU's). ``rise``: whether
    RISE is affordable for this model (``analysis.rise_affordable``: Compare runs it then); ``images``: how
    many the Inspect tab runs."""
    if device.type != "cpu":
        return 0
    h, w = cfg.img_hw
    analysis = forward_bytes(cfg, 1) + forward_bytes(cfg, 1, attention=False)  # the image and its mirror
    rise_bytes = forward_bytes(cfg, BATCH_IMAGES, attention=False) + 4 * explain.RISE_MASKS * h * w
    gradient = BACKWARD * forward_bytes(cfg, 1)
    if work == "batch":
        factor = BACKWARD if method == GRADIENT else 2
        return factor * forward_bytes(cfg, batch.chunk_size(method or ""))
    if work == "inspect":
        return forward_bytes(cfg, images) + INSPECT_BYTES
    if work == "compare":  # every map, then the deletion and insertion curves, a batch of steps + 1 each
        curves = forward_bytes(cfg, COMPARE_STEPS + 1, attention=False)
        return analysis + (rise_bytes if rise else 0) + gradient + curves
    if work == "classify":
        return analysis + (rise_bytes if method == RISE else gradient if method == GRADIENT else 0)
    return analysis


def image_bytes(header: ImageHeader | None, transform: ImageTransform | None, work: str, model: int = 0) -> int:
    """``max(decoding, after)`` of the module's docstring: decoding the upload, or what follows it (the
    reduced image, the endpoint's pictures and ``model`` bytes); without a readable header (the request then
    fails before decoding) just ``model``."""
    if header is None:
        return model
    need = needed_side(transform) if transform is not None else 0
    w, h = target_size(header.size, MAX_SIDE, need)
    shown = min(w * h, MAX_SIDE * MAX_SIDE)
    return max(header.decode_bytes(MAX_SIDE, need), (4 + DRAW_BYTES[work]) * shown + model)


@dataclass(frozen=True)
class Costs:
    """The estimate of each kind of request, from its arguments. ``loaded(choice)`` gives the model and its
    transform if it is loaded now (``Models.loaded``); else None, and the estimate leaves the model out: the
    request then waits a second for the load and most often answers "still loading"."""

    loaded: Callable[[str], tuple[Any, ImageTransform] | None]
    device: Callable[[], torch.device]
    examples: int  # images the Inspect tab runs through the model

    def _model(self, arguments: dict[str, Any]) -> tuple[Any, ImageTransform | None]:
        choice = arguments.get("model_choice")
        got = self.loaded(choice) if isinstance(choice, str) else None
        return got if got is not None else (None, None)

    def image(self, work: str) -> Callable[[dict[str, Any]], int]:
        """Classify (and its live re-render), the explorer's view, a patch, or Compare."""

        def cost(arguments: dict[str, Any]) -> int:
            model, transform = self._model(arguments)
            try:
                header = read_header(arguments["image"], MAX_PIXELS) if arguments.get("image") else None
            except ImageDataError:
                header = None
            work_bytes = 0
            if model is not None:
                device = self.device()
                method = arguments.get("method") or default_method(model, device)
                work_bytes = model_bytes(model.config, work, method, device, rise_affordable(model, device))
            return REQUEST_BYTES + image_bytes(header, transform, work, work_bytes)

        return cost

    def batch(self, arguments: dict[str, Any]) -> int:
        """Batch: one image decoded at a time (at most ``batch.MAX_DECODE_BYTES``), the gallery's overlays,
        one chunk through the model."""
        model, _ = self._model(arguments)
        gallery = batch.MAX_IMAGES * 4 * batch.THUMB * batch.THUMB
        method = arguments.get("method")
        work = 0 if model is None else model_bytes(model.config, "batch", method, self.device())
        return REQUEST_BYTES + batch.MAX_DECODE_BYTES + gallery + work

    def inspect(self, arguments: dict[str, Any]) -> int:
        model, _ = self._model(arguments)
        work = 0 if model is None else model_bytes(model.config, "inspect", None, self.device(), images=self.examples)
        return REQUEST_BYTES + work

    @staticmethod
    def small(arguments: dict[str, Any]) -> int:
        """Listeners that compute nothing large themselves (the model picker waits for a load, which its
        own limits bound: ``--max-model-mb``, ``--max-loaded-mb``)."""
        return REQUEST_BYTES


# ------------------------------------------------------------------------------------- fair queueing


def client_ip(request: Any) -> str:
    """The address a request came from. On a Space the app sits behind Hugging Face's proxy, whose own address
    every request shares: there the client's is the first of ``X-Forwarded-For``."""
    forwarded = request.headers.get("x-forwarded-for") if os.environ.get("SPACE_ID") else None
    if forwarded:
        return forwarded.split(",")[0].strip()
    return request.client.host if request.client is not None else "unknown"


class ClientLimits:
    """At most ``per_session`` requests of one Gradio session, and ``per_ip`` of one address, waiting or
    computing; the queue served round robin by client (see the module's docstring).

    Gradio's queue has no hook for this, so ``install`` wraps its ``push`` (every queued event passes
    there) and reads its lists of waiting and running events. ``push`` runs on the server's event loop,
    so the count, the check and the insertion are not interleaved with other clients' joins."""

    def __init__(self, per_session: int = 4, per_ip: int = 16) -> None:
        self.per_session, self.per_ip = per_session, per_ip
        self._joining: Counter[str] = Counter()  # joins past the check, not yet in the queue

    def install(self, demo: gr.Blocks) -> None:
        queue = demo._queue
        push = queue.push

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

        queue.push = fair_push

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
        """Whose line an event stands in: its session, or for sessionless API calls its address."""
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
