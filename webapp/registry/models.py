"""Which models the app serves, and the loaded ones: the picker's choices, loading and the cache.

A public Space takes any text in ``/classify``'s ``model_choice`` from anyone, so this layer decides:

- **What may load** (``webapp.registry.access``): web users choose from the operator's list (``--models``; the
  bundled model and the curated Hub checkpoints by default); typing any folder or Hub id is for local use
  (``--allow-any-model``, on by default only when served on 127.0.0.1). Uploads are never models.
- **What it costs** (``webapp.registry.sizing``): a checkpoint whose declared model (or weight file) exceeds
  ``--max-model-mb`` is refused from its config and file sizes, before anything is allocated.
- **How much stays loaded**: at most ``--max-loaded`` models and ``--max-loaded-mb`` of weights, least
  recently used evicted first (never the startup model), one entry per checkpoint whatever its spelling.
- **Who waits**: loads run on worker threads, one per checkpoint at a time. A request waits for one at
  most ``request_wait`` seconds, then hears "still loading", so nobody's request queues behind someone
  else's slow download. A failed load is remembered for ``--failed-load-ttl`` seconds and answered from
  memory; the memory it took is handed back to the OS.
- **What people read** (``webapp.errors``): short messages without server paths; the log (logger
  ``webapp``) gets one line per handled error and a traceback only for unexpected ones.

The limits are ``webapp.registry.options.Options`` (the command line). Before a Hub load the Hub is asked once whether
it answers (``vit_core.io.hub.answers``): huggingface_hub would retry a dead endpoint for about 30 s per file.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
import traceback
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch

import vit_core
from vit_core.data import build_transform
from vit_core.data.transforms import ImageTransform
from vit_core.io import hub
from vit_core.io.files import CONFIG_NAME, WEIGHTS_NAME
from vit_core.io.hub import PICKLED_WEIGHTS_NAME

from ..errors import log, public, sentence
from ..resources import MB, release_memory
from . import sizing
from .access import Access, Choice, ModelError, TrainedModels, caller, default_choices, operator_choice, trained_choice
from .catalog import AUTO, BUNDLED_LABEL, imagenet_names
from .options import AUTO_MODEL, Options

LOAD_WORKERS = 2  # loads of different checkpoints in parallel, per kind (local, Hub); each is within --max-model-mb
MAX_HUB_LOADS = 4  # Hub loads running or waiting for a worker; more are refused at once
HUB_ANSWER_TIMEOUT = 5.0  # seconds the Hub has to answer the question whether it answers
HUB_RETRY = 30.0  # seconds after the Hub did not answer during which Hub loads are refused at once
HUB_OFFLINE = "needs the Hub: offline"  # a Hub checkpoint in the picker while it cannot load (``unavailable``)
HUB_DOWN = "needs the Hub: not answering"
UI_LOAD_WAIT = 300.0  # seconds the model picker waits for a load (with a progress bar)


@dataclass(frozen=True)
class Loaded:
    choice: Choice
    model: vit_core.VisionTransformer
    transform: ImageTransform
    nbytes: int


class Models:
    """The loaded models by canonical key (LRU, bounded), the loads in flight and the recent failures."""

    def __init__(self, device: torch.device, options: Options | None = None) -> None:
        self.device = device
        self.options = options or Options()
        try:
            names = self.options.models
            listed = [operator_choice(m) for m in names] if names else default_choices(self.options.public)
            self.access = Access(listed, self.options.allow_any, self.options.public)
        except ModelError as e:
            raise SystemExit(f"--models: {e}") from None
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._loading: dict[str, Future[Loaded]] = {}
        self._failed: dict[str, tuple[float, str, str]] = {}  # key -> (until, reason, detail for the log)
        self._lock = threading.Lock()
        # Local folders and the Hub load on workers of their own: a Hub that hangs never delays a local load.
        self._pools = {
            local: ThreadPoolExecutor(LOAD_WORKERS, thread_name_prefix=f"model-load-{'local' if local else 'hub'}")
            for local in (True, False)
        }
        self._hub_down_until = 0.0  # monotonic time until which Hub loads are refused at once
        self._default: Choice = self.access.listed[0]
        self._pinned: str | None = None
        self._auto_note = ""

    # ------------------------------------------------------------------------ what the UI shows

    @property
    def default(self) -> str:
        """The picker value of the startup model."""
        return self._default.value

    @property
    def allow_custom_value(self) -> bool:
        """Whether the picker takes free text (a folder or Hub id), or only its listed choices."""
        return self.access.allow_any

    def choices(self, session: str | None = None) -> list[tuple[str, str]]:
        """The picker's choices as (label, value), e.g. ("ViT-B/16 (ImageNet, 86.6M params, 346 MB,
        transformers)", "google/vit-base-patch16-224"): the startup model first, then those that can load now, the
        models trained here that the page of ``session`` may see (``TrainedModels.shown_to``) by their labels
        ("Trained here at 10:42: ants, bees"), and last those that cannot load now, their label saying why
        ("... — needs the Hub: offline")."""
        marked = [(c, self.unavailable(c)) for c in self.access.listed]
        ready = [(c.label, c.value) for c, why in marked if not why]
        trained = [(t.label, t.value) for t in self.trained.shown_to(session, self.options.public)]
        return ready + trained + [(f"{c.label} — {why}", c.value) for c, why in marked if why]

    def unavailable(self, choice: Choice) -> str:
        """Why ``choice`` cannot load now, in a few words, or "" when it may: a Hub checkpoint that is not
        loaded, while this server is offline (unless the local cache holds it) or the Hub is known not to
        answer (a load would be refused at once: ``_check_hub``)."""
        if choice.local or choice.key in self._loaded:
            return ""
        if hub.offline():
            return "" if _cached(choice) else HUB_OFFLINE
        return HUB_DOWN if time.monotonic() < self._hub_down_until else ""

    def resolve(self, text: object) -> Choice:
        """The checkpoint a model choice names (``Access.resolve``); a refusal is a ``gr.Error`` for the person who
        asked, logged. A request resolves its choice once (``webapp.ui.endpoints.Prepared.choice``)."""
        try:
            return self.access.resolve(text if isinstance(text, str) else "")
        except ModelError as e:
            log.warning("model %r: %s", str(text)[:200], e.detail)
            raise gr.Error(str(e), print_exception=False) from None

    def key_of(self, choice: str) -> str:
        """The canonical key of a servable choice: equal for every spelling of one checkpoint."""
        return self.resolve(choice).key

    def note(self, choice: str) -> str:
        """For the status line: with ``--model auto``, which model it chose and why; else empty."""
        if not self._auto_note or self.key_of(choice) != self._pinned:
            return ""
        return f" {self._auto_note}"

    def folder_of(self, choice: Choice | str) -> Path | None:
        """The local folder a servable choice (resolved, or a picker value) loads from (for its metrics and model
        card), else None."""
        try:
            c = choice if isinstance(choice, Choice) else self.access.resolve(choice)
        except ModelError:
            return None
        return Path(c.source) if c.local and Path(c.source).is_dir() else None

    @property
    def trained(self) -> TrainedModels:
        """The models trained here (the access rules' registry, which resolves their values)."""
        return self.access.trained

    def label_of(self, choice: str) -> str:
        """What the status line calls ``choice``: a model trained here by its label (its value is a token),
        any other as it was chosen."""
        trained = self.trained.get(choice)
        mine = trained is not None and (not self.options.public or trained.owned_by(caller()))
        return trained.label if mine else choice

    def forget(self, value: str) -> None:
        """Serve the trained model ``value`` no longer, and unload it."""
        trained = self.trained.remove(value)
        with self._lock:
            dropped = trained is not None and self._loaded.pop(trained_choice(trained).key, None) is not None
        if dropped:
            release_memory()

    # ------------------------------------------------------------------------ loading

    def set_default(self, model: str) -> str:
        """Load the startup model now (failing fast, before serving), keep it loaded for good and list it
        first; returns its picker value. ``auto``: the paper's ViT-B/16 from the Hub when the Hub
        answers and the load succeeds, else the bundled model; ``note`` says which and why."""
        try:
            if model == AUTO_MODEL:
                choice = self._auto()
            else:
                choice = operator_choice(model)
                self._get_choice(choice, None)
            self.access.add(choice, first=True)
        except ModelError as e:
            raise SystemExit(f"--model {model}: {e}") from None
        self._default, self._pinned = choice, choice.key
        log.info("startup model: %s%s", choice.label, f" ({self._auto_note})" if self._auto_note else "")
        return choice.value

    def _auto(self) -> Choice:
        b16 = operator_choice(AUTO.repo)
        if hub.offline():
            reason = "This server is offline (no Hugging Face Hub)."
        elif not hub.answers(AUTO.repo):
            self._hub_down_until = time.monotonic() + HUB_RETRY
            reason = "The Hugging Face Hub did not answer."
        else:
            try:
                self._get_choice(b16, None)
            except ModelError as e:
                reason = sentence(str(e))
            else:
                self._auto_note = "The server starts on the paper's ViT-B/16 (ImageNet-1k), from the Hub."
                return b16
        bundled = operator_choice(BUNDLED_LABEL)
        self._get_choice(bundled, None)
        self._auto_note = (
            f"{reason} The server started on its own small CIFAR-10 model instead of the paper's ViT-B/16."
        )
        return bundled

    def get(self, choice: Choice | str, wait: float | None = None) -> tuple[vit_core.VisionTransformer, ImageTransform]:
        """The model ``choice`` names (resolved, or a picker value to resolve) and its preprocessing. Not loaded
        yet: starts (or joins) its load and waits up to ``wait`` seconds (default: the request wait). Any refusal
        or failure is a ``gr.Error`` with a short message for the person who asked."""
        resolved = choice if isinstance(choice, Choice) else self.resolve(choice)
        try:
            loaded = self._get_choice(resolved, self.options.request_wait if wait is None else wait)
        except ModelError as e:
            log.warning("model %r: %s", resolved.label[:200], e.detail)
            raise gr.Error(str(e), print_exception=False) from None
        return loaded.model, loaded.transform

    def loaded(self, choice: Choice | str | None) -> tuple[vit_core.VisionTransformer, ImageTransform] | None:
        """The model ``choice`` names (resolved, or a picker value) and its preprocessing if it is loaded now, else
        None; starts no load and logs nothing (for a request's memory estimate, before the request itself asks)."""
        if isinstance(choice, str):
            try:
                choice = self.access.resolve(choice)
            except ModelError:
                return None
        if choice is None:
            return None
        with self._lock:
            hit = self._loaded.get(choice.key)
        return None if hit is None else (hit.model, hit.transform)

    def load(self, choice: str) -> tuple[vit_core.VisionTransformer, ImageTransform]:
        """``get`` for the model picker: waits for the load (the UI shows progress meanwhile)."""
        return self.get(choice, UI_LOAD_WAIT)

    def _get_choice(self, choice: Choice, wait: float | None) -> Loaded:
        """ModelError when refused, failed (now or recently) or still loading. Messages name the checkpoint as
        this request spelled it."""
        with self._lock:
            hit = self._loaded.get(choice.key)
            if hit is not None:
                self._loaded.move_to_end(choice.key)
                return hit
            now = time.monotonic()
            failed = self._failed.get(choice.key)
            if failed is not None and failed[0] > now:
                raise ModelError(_could_not_load(choice, failed[1]), f"{failed[2]} (remembered)")
            future = self._loading.get(choice.key)
            if future is None:
                if not choice.local:
                    self._check_hub(choice, now)
                future = self._loading[choice.key] = self._pools[choice.local].submit(self._load, choice)
        try:
            return future.result(timeout=wait)
        except FutureTimeout:
            raise ModelError(f"'{choice.label}' is still loading; try again in a moment.") from None
        except _LoadFailed as e:
            raise ModelError(_could_not_load(choice, e.reason), e.detail) from None

    def _check_hub(self, choice: Choice, now: float) -> None:
        """Refuse a new Hub load at once while the Hub is known not to answer, or while ``MAX_HUB_LOADS`` are
        under way: made-up repo names cannot pile up behind a Hub that hangs. Under the lock."""
        if hub.offline() and not _cached(choice):
            reason = "it needs the Hub, and this server is offline"
            raise ModelError(_could_not_load(choice, reason), f"{choice.source}: offline, not in the local cache")
        if now < self._hub_down_until:
            seconds = math.ceil(self._hub_down_until - now)
            reason = f"the Hub did not answer just now; try again in {seconds} s"
            raise ModelError(_could_not_load(choice, reason), f"{choice.source}: Hub down, not asked")
        if sum(key.startswith("hub:") for key in self._loading) >= MAX_HUB_LOADS:
            reason = f"{MAX_HUB_LOADS} Hub downloads are under way; try again in a minute"
            raise ModelError(_could_not_load(choice, reason), f"{choice.source}: Hub loads busy")

    def _load(self, choice: Choice) -> Loaded:
        """Runs on a worker thread. A failure is remembered (its reason, without the checkpoint's name, so that
        each request's message names it as that request did); the memory it took is returned."""
        failure = loaded = None
        try:
            loaded = self._build(choice)
        except ModelError as e:
            failure = _LoadFailed(str(e), f"{choice.source}: {e.detail}")
        except vit_core.CheckpointError as e:
            failure = _LoadFailed(str(e), str(e))
        except Exception:  # the traceback is logged as text: a log record that kept it would keep the model
            log.error("unexpected error while loading %s\n%s", choice.source, traceback.format_exc().rstrip())
            failure = _LoadFailed("unexpected error (logged on the server)", f"{choice.source}: unexpected error")
        evicted = 0
        with self._lock:
            self._loading.pop(choice.key, None)
            if loaded is not None:
                self._loaded[choice.key] = loaded
                evicted = self._evict(keep=choice.key)
            else:
                now = time.monotonic()
                self._failed = {k: v for k, v in self._failed.items() if v[0] > now}  # forget expired ones
                self._failed[choice.key] = (now + self.options.failed_ttl, failure.reason, failure.detail)
        if failure is not None or evicted:
            release_memory()
        if failure is not None:
            raise failure  # outside the except blocks: no traceback keeps the failed model's frames alive
        return loaded

    def _build(self, choice: Choice) -> Loaded:
        if not choice.local and not hub.offline() and not hub.answers(choice.source, HUB_ANSWER_TIMEOUT):
            with self._lock:
                self._hub_down_until = time.monotonic() + HUB_RETRY
            raise ModelError("the Hub did not answer; try again later")
        footprint = sizing.check(choice, self.options.max_model_mb * MB)
        with self._lock:
            evicted = self._evict(extra=footprint.bytes if footprint else 0)
        if evicted:
            release_memory()
        model = vit_core.from_pretrained(choice.source, revision=choice.revision)
        if not model.label_names and model.config.num_classes == len(imagenet_names()):
            model.config = model.config.replace(label_names=imagenet_names())  # an ImageNet-1k head, unnamed
        model = model.to(self.device).eval()
        if model.patch_embed.backbone is not None:  # a CNN stem: its convolutions run faster on NHWC tensors
            model = model.to(memory_format=torch.channels_last)  # (18% for the bundle's, 4% for R50's on a CPU)
        tensors = itertools.chain(model.parameters(), model.buffers())
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        return Loaded(choice, model, build_transform(model.pretrained_cfg), nbytes)

    def _evict(self, extra: int = 0, keep: str | None = None) -> int:
        """Drop least recently used models (never the startup one, nor ``keep``) until the count and the
        bytes, plus one more model of ``extra`` bytes when given, are within bounds. Under the lock."""
        evicted = 0
        room = 1 if extra else 0
        for key in list(self._loaded):
            total = sum(x.nbytes for x in self._loaded.values()) + extra
            if len(self._loaded) + room <= self.options.max_loaded and total <= self.options.max_loaded_mb * MB:
                break
            if key not in (self._pinned, keep):
                log.info("evicting %s", self._loaded.pop(key).choice.label)
                evicted += 1
        return evicted


class _LoadFailed(Exception):
    """A failed load as remembered: why (``reason``, which may hold the server's path of the checkpoint), and
    the log's ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def _cached(choice: Choice) -> bool:
    """Whether the local Hub cache holds a Hub checkpoint's files (what an offline load reads): its config and
    weights, or its ``.npz``."""
    files = sizing.files_of(choice)  # offline: the cached files only
    names = set(files.sizes) if files is not None else set()
    npz = any(n.endswith(".npz") for n in names)
    return npz or (CONFIG_NAME in names and bool(names & {WEIGHTS_NAME, PICKLED_WEIGHTS_NAME}))


def _could_not_load(choice: Choice, reason: str) -> str:
    return f"Could not load '{choice.label}': {sentence(public_text(reason, choice))}"


def public_text(message: str, choice: Choice) -> str:
    """A loader's message as a web user may read it: the checkpoint named by its label, without repeating
    it, and no server paths (``errors.public``)."""
    text = public(message, {choice.source: choice.label, os.path.realpath(choice.source): choice.label})
    return text.removeprefix(f"{choice.label}: ").removeprefix(f"{choice.label}/")
