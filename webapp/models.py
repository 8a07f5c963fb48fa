"""Which models the app serves, and the loaded ones: the picker's choices, loading and the cache.

A public Space takes any text in ``/classify``'s ``model_choice`` from anyone, so this layer decides:

- **What may load** (``webapp.access``): web users choose from the operator's list (``--models``; the
  bundled model and the curated Hub checkpoints by default); typing any folder or Hub id is for local use
  (``--allow-any-model``, on by default only when served on 127.0.0.1). Uploads are never models.
- **What it costs** (``webapp.sizing``): a checkpoint whose declared model (or weight file) exceeds
  ``--max-model-mb`` is refused from its config and file sizes, before anything is allocated.
- **How much stays loaded**: at most ``--max-loaded`` models and ``--max-loaded-mb`` of weights, least
  recently used evicted first (never the startup model), one entry per checkpoint whatever its spelling.
- **Who waits**: loads run on worker threads, one per checkpoint at a time. A request waits for one at
  most ``request_wait`` seconds, then hears "still loading", so nobody's request queues behind someone
  else's slow download. A failed load is remembered for ``--failed-load-ttl`` seconds and answered from
  memory; the memory it took is handed back to the OS.
- **What people read** (``webapp.errors``): short messages without server paths; the log (logger
  ``webapp``) gets one line per handled error and a traceback only for unexpected ones.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch
import yaml
from huggingface_hub import constants

import vit_core
from vit_core.data import build_transform
from vit_core.data.transforms import ImageTransform

from . import sizing
from .access import Access, Choice, ModelError, default_choices, operator_choice
from .catalog import AUTO, BUNDLED_LABEL, ROOT, imagenet_names, run_folders
from .errors import log, public
from .memory import release_memory

__all__ = ["AUTO_MODEL", "BUNDLED_LABEL", "ROOT", "Models", "Settings", "add_arguments", "configure", "run_folders"]

AUTO_MODEL = "auto"
LOAD_WORKERS = 2  # loads of different checkpoints in parallel; each is within --max-model-mb
UI_LOAD_WAIT = 300.0  # seconds the model picker waits for a load (with a progress bar)
MB = 2**20


@dataclass(frozen=True)
class Settings:
    """What the operator allows. The defaults are local use: any model by name, generous limits."""

    public: bool = False  # only listed models; local folders only under models/ and runs/
    allow_any: bool = True  # web users may type any folder or Hub repo id
    models: tuple[str, ...] | None = None  # the picker's list; None: bundled + curated (+ runs/ if not public)
    max_loaded: int = 4
    max_loaded_mb: int = 3000
    max_model_mb: int = 2000  # ViT-L/16 needs ~1650 (weights + one explanation's activations)
    failed_ttl: float = 600.0
    request_wait: float = 1.0  # seconds a request waits for a load before answering "still loading"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The app's model options: the startup model, what web users may choose, and the memory limits."""
    d = Settings()
    g = parser.add_argument_group("models")
    g.add_argument(
        "--model",
        default=AUTO_MODEL,
        help="startup model: 'auto' (default: the paper's ViT-B/16 from the Hub when it answers, else the bundled "
        "CIFAR-10 model), 'bundled', a run or checkpoint folder, or a Hub repo id",
    )
    g.add_argument(
        "--public",
        action="store_true",
        help="serve only the listed models, local ones only from models/ and runs/ (always on a Space)",
    )
    listed = g.add_mutually_exclusive_group()
    listed.add_argument(
        "--models",
        help="comma-separated models web users may choose (default: the bundled model and the curated ImageNet "
        "checkpoints, plus the run folders when not public)",
    )
    listed.add_argument("--models-file", type=Path, help="the same as a JSON or YAML list in a file")
    g.add_argument(
        "--allow-any-model",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let web users type any folder or Hub repo id (default: only when served on 127.0.0.1/localhost, "
        "without --share, not public)",
    )
    g.add_argument("--max-loaded", type=int, default=d.max_loaded, help="models kept loaded at once")
    g.add_argument("--max-loaded-mb", type=int, default=d.max_loaded_mb, help="MB of weights kept loaded")
    g.add_argument(
        "--max-model-mb",
        type=int,
        default=d.max_model_mb,
        help="largest model attempted: MB of weights plus one explanation's activations",
    )
    g.add_argument("--failed-load-ttl", type=float, default=d.failed_ttl, help="seconds a failed load is remembered")


def configure(args: argparse.Namespace) -> Settings:
    """Settings from the parsed options (and ``SPACE_ID``: a Space is public); sets up the log."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    public = bool(args.public or os.environ.get("SPACE_ID"))
    host = getattr(args, "host", None) or os.environ.get("GRADIO_SERVER_NAME") or "127.0.0.1"
    local = host in ("127.0.0.1", "localhost", "::1") and not getattr(args, "share", False)
    if public and args.allow_any_model:
        raise SystemExit("--allow-any-model: public mode serves only the listed models")
    allow_any = (local and not public) if args.allow_any_model is None else args.allow_any_model
    models = None
    if args.models is not None:
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    elif args.models_file is not None:
        try:
            models = yaml.safe_load(args.models_file.read_text())  # YAML reads JSON lists too
        except (OSError, yaml.YAMLError) as e:
            raise SystemExit(f"--models-file {args.models_file}: {e}") from None
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise SystemExit(f"--models-file {args.models_file}: expected a list of model names")
        models = tuple(models)
    if models == ():
        raise SystemExit("--models: the list is empty")
    limits = {"max_loaded": args.max_loaded, "max_loaded_mb": args.max_loaded_mb, "max_model_mb": args.max_model_mb}
    if min(limits.values()) < 1:
        raise SystemExit(f"--max-loaded, --max-loaded-mb and --max-model-mb must be >= 1, got {limits}")
    return Settings(public, allow_any, models, failed_ttl=args.failed_load_ttl, **limits)


@dataclass(frozen=True)
class Loaded:
    choice: Choice
    model: vit_core.VisionTransformer
    transform: ImageTransform
    nbytes: int


class Models:
    """The loaded models by canonical key (LRU, bounded), the loads in flight and the recent failures."""

    def __init__(self, device: torch.device, settings: Settings | None = None) -> None:
        self.device = device
        self.settings = settings or Settings()
        try:
            names = self.settings.models
            listed = [operator_choice(m) for m in names] if names else default_choices(self.settings.public)
            self.access = Access(listed, self.settings.allow_any, self.settings.public)
        except ModelError as e:
            raise SystemExit(f"--models: {e}") from None
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()  # least recently used first
        self._loading: dict[str, Future[Loaded]] = {}
        self._failed: dict[str, tuple[float, str, str]] = {}  # key -> (until, message, detail for the log)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(LOAD_WORKERS, thread_name_prefix="model-load")
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

    def choices(self) -> list[tuple[str, str]]:
        """The picker's choices as (label, value), e.g. ("ViT-B/16 (ImageNet, 86.6M params, 346 MB,
        transformers)", "google/vit-base-patch16-224"); the startup model first."""
        return [(c.label, c.value) for c in self.access.listed]

    def key_of(self, choice: str) -> str:
        """The canonical key of a servable choice: equal for every spelling of one checkpoint."""
        try:
            return self.access.resolve(choice).key
        except ModelError as e:
            raise gr.Error(str(e), print_exception=False) from None

    def note(self, choice: str) -> str:
        """For the status line: with ``--model auto``, which model it chose and why; else empty."""
        if not self._auto_note or self.key_of(choice) != self._pinned:
            return ""
        return f" Default model (`--model auto`): {self._auto_note}."

    def folder_of(self, choice: str) -> Path | None:
        """The local folder a servable choice loads from (for its metrics and model card), else None."""
        try:
            c = self.access.resolve(choice)
        except ModelError:
            return None
        return Path(c.source) if c.local and Path(c.source).is_dir() else None

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
        hub = operator_choice(AUTO.repo)
        if constants.HF_HUB_OFFLINE:
            reason = "the app is offline (HF_HUB_OFFLINE is set)"
        elif not hub_answers(AUTO.repo):
            reason = "the Hub did not answer"
        else:
            try:
                self._get_choice(hub, None)
            except ModelError as e:
                reason = str(e)
            else:
                self._auto_note = "the paper's ViT-B/16 (ImageNet-1k) from the Hub"
                return hub
        bundled = operator_choice(BUNDLED_LABEL)
        self._get_choice(bundled, None)
        self._auto_note = f"the bundled CIFAR-10 model, since the Hub's ViT-B/16 is unavailable: {reason}"
        return bundled

    def get(self, choice: str, wait: float | None = None) -> tuple[vit_core.VisionTransformer, ImageTransform]:
        """The model ``choice`` names and its preprocessing. Not loaded yet: starts (or joins) its load and
        waits up to ``wait`` seconds (default: the request wait). Any refusal or failure is a ``gr.Error``
        with a short message for the person who asked."""
        loaded = self._get(choice, self.settings.request_wait if wait is None else wait)
        return loaded.model, loaded.transform

    def loaded(self, choice: str) -> tuple[vit_core.VisionTransformer, ImageTransform] | None:
        """The model ``choice`` names and its preprocessing if it is loaded now, else None; starts no load and
        logs nothing (for a request's memory estimate, before the request itself asks)."""
        try:
            key = self.access.resolve(choice).key
        except ModelError:
            return None
        with self._lock:
            hit = self._loaded.get(key)
        return None if hit is None else (hit.model, hit.transform)

    def load(self, choice: str) -> tuple[vit_core.VisionTransformer, ImageTransform]:
        """``get`` for the model picker: waits for the load (the UI shows progress meanwhile)."""
        return self.get(choice, UI_LOAD_WAIT)

    def _get(self, text: str, wait: float | None) -> Loaded:
        try:
            return self._get_choice(self.access.resolve(text), wait)
        except ModelError as e:
            log.warning("model %r: %s", str(text)[:200], e.detail)
            raise gr.Error(str(e), print_exception=False) from None

    def _get_choice(self, choice: Choice, wait: float | None) -> Loaded:
        """ModelError when refused, failed (now or recently) or still loading."""
        with self._lock:
            hit = self._loaded.get(choice.key)
            if hit is not None:
                self._loaded.move_to_end(choice.key)
                return hit
            failed = self._failed.get(choice.key)
            if failed is not None and failed[0] > time.monotonic():
                raise ModelError(failed[1], f"{failed[2]} (remembered)")
            future = self._loading.get(choice.key)
            if future is None:
                future = self._loading[choice.key] = self._pool.submit(self._load, choice)
        try:
            return future.result(timeout=wait)
        except FutureTimeout:
            raise ModelError(f"'{choice.label}' is still loading; try again in a moment.") from None

    def _load(self, choice: Choice) -> Loaded:
        """Runs on a worker thread. A failure is remembered; the memory it took is returned."""
        error = loaded = None
        try:
            loaded = self._build(choice)
        except ModelError as e:
            error = ModelError(f"Could not load '{choice.label}': {e}", f"{choice.source}: {e}")
        except vit_core.CheckpointError as e:
            error = ModelError(f"Could not load '{choice.label}': {public_text(str(e), choice)}", str(e))
        except Exception:  # the traceback is logged as text: a log record that kept it would keep the model
            log.error("unexpected error while loading %s\n%s", choice.source, traceback.format_exc().rstrip())
            message = f"Could not load '{choice.label}': unexpected error (logged on the server)."
            error = ModelError(message, f"{choice.source}: unexpected error, traceback logged")
        evicted = 0
        with self._lock:
            self._loading.pop(choice.key, None)
            if loaded is not None:
                self._loaded[choice.key] = loaded
                evicted = self._evict(keep=choice.key)
            else:
                now = time.monotonic()
                self._failed = {k: v for k, v in self._failed.items() if v[0] > now}  # forget expired ones
                self._failed[choice.key] = (now + self.settings.failed_ttl, str(error), error.detail)
        if error is not None or evicted:
            release_memory()
        if error is not None:
            raise error  # outside the except blocks: no traceback keeps the failed model's frames alive
        return loaded

    def _build(self, choice: Choice) -> Loaded:
        if not choice.local and not constants.HF_HUB_OFFLINE and not hub_answers(choice.source):
            raise ModelError("the Hub did not answer; try again later")
        footprint = sizing.check(choice, self.settings.max_model_mb * MB)
        with self._lock:
            evicted = self._evict(extra=footprint.bytes if footprint else 0)
        if evicted:
            release_memory()
        model = vit_core.from_pretrained(choice.source, revision=choice.revision)
        if not model.label_names and model.config.num_classes == len(imagenet_names()):
            model.config = model.config.replace(label_names=imagenet_names())  # an ImageNet-1k head, unnamed
        model = model.to(self.device).eval()
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
            if len(self._loaded) + room <= self.settings.max_loaded and total <= self.settings.max_loaded_mb * MB:
                break
            if key not in (self._pinned, keep):
                log.info("evicting %s", self._loaded.pop(key).choice.label)
                evicted += 1
        return evicted


def hub_answers(source: str, timeout: float = 5.0) -> bool:
    """Whether the Hub (``HF_ENDPOINT``) answers one request about the repo, within ``timeout`` seconds.
    huggingface_hub retries an unreachable endpoint for about 30 s per file; this asks once."""
    repo = "/".join(source.split("/")[:2])
    try:
        urllib.request.urlopen(f"{constants.ENDPOINT}/api/models/{repo}", timeout=timeout).close()
    except urllib.error.HTTPError:
        return True  # an answer, if not a yes: the load says what is wrong
    except (OSError, ValueError):
        return False
    return True


def public_text(message: str, choice: Choice) -> str:
    """A loader's message as a web user may read it: the checkpoint named by its label, without repeating
    it, and no server paths (``errors.public``)."""
    text = public(message, {choice.source: choice.label, os.path.realpath(choice.source): choice.label})
    return text.removeprefix(f"{choice.label}: ").removeprefix(f"{choice.label}/")
