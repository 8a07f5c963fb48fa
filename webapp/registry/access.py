"""Which checkpoint a picker value names, under one canonical key, and whether web users may load it.

Every spelling of one checkpoint gets one key, so the cache holds one copy: local paths by their real
path (``d``, ``d/``, ``d/.``, ``./d``, symlinks), Hub repos by repo and revision (``org/m``, ``hf-hub:org/m``,
``org/m@main``). Web users pick from the operator's list; free text (any folder or Hub id) only when the
operator allows it. Files under Gradio's upload folders are never models: an upload's server path is
known to whoever uploaded it. Refusals never say whether a path exists, and where web users choose only from
the list, a value not in it is refused from its text alone: nothing is looked up on the disk.

**The models trained here** (the Train tab), recorded once: ``TrainedModels``, owned by the access rules
(``Access.trained``). The trainer adds to it and sweeps it (``webapp.jobs.trainer``), the access rules resolve a
trained model's value through it, and the picker lists from it: on a local server every trained model, for every
page that loads after training; on a public one only the browser's own, whose values no one else is told.

**Whose they are.** A trained model and the job that makes it belong to the caller that started the job: its
Gradio session hash *and* its address (``queueing.client_ip``). A session hash is chosen by the client and sent in
every request body (a REST ``/call`` may name any), so it alone would let whoever learns it use or cancel another
visitor's; the address is the proxy's, which a client cannot choose. ``Caller`` is who asks now: set for each
request by ``webapp.server.sessions`` around Gradio's ``process_api`` (the handlers run in threads that copy it), and
None for calls from Python (tests, the trainer itself), which are the server's own.

**A reload keeps them.** The page keeps the values of the models its browser trained, and the model chosen last,
in the browser's storage (``webapp.ui.picker``: Gradio's ``BrowserState``, encrypted with the server's secret); a
page loaded later in that browser presents them, and from the trainer's address its session is added to the
model's (``TrainedModels.adopt``): the model is the browser's for its hour, as the Train tab says.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from gradio.utils import get_cache_folder, get_upload_folder

from vit_core.io.hub import HUB_ID

from ..errors import quote
from .catalog import BUNDLED, BUNDLED_LABEL, CURATED, ROOT, run_folders

PRIVATE_PREFIX = "trained:"  # the picker value of a model trained here: the prefix, then a random token
NOT_YOURS = "This model was trained in another session: only that session can use it. Train your own on the Train tab."


@dataclass(frozen=True)
class Caller:
    """Who sends the request being handled: its Gradio session hash and its address group."""

    session: str
    address: str


_CALLER: ContextVar[Caller | None] = ContextVar("trained_caller", default=None)


def caller() -> Caller | None:
    """The request being handled's caller; None outside a request (a call from Python: the server's own)."""
    return _CALLER.get()


@contextmanager
def calling(who: Caller | None) -> Iterator[None]:
    """Handle what runs inside as ``who``'s request."""
    token = _CALLER.set(who)
    try:
        yield
    finally:
        _CALLER.reset(token)


@dataclass(frozen=True)
class Trained:
    """A model trained here: its picker value and readable label, its run folder, who trained it and when."""

    value: str
    label: str
    out: Path
    session: str
    created: float
    address: str | None = None  # the trainer's address (None: trained from Python, no request)
    reloads: frozenset[str] = frozenset()  # the sessions of its browser's later pages (``TrainedModels.adopt``)

    def owned_by(self, who: Caller | None) -> bool:
        """Whether ``who`` may use this model: its browser's sessions from its address; anyone outside a
        request."""
        return who is None or (who.session in self.reloads | {self.session} and who.address == self.address)


class TrainedModels:
    """The trained models by value, oldest first; thread-safe."""

    def __init__(self) -> None:
        self._by_value: dict[str, Trained] = {}
        self._lock = threading.Lock()

    def add(self, trained: Trained) -> None:
        with self._lock:
            self._by_value[trained.value] = trained

    def get(self, value: str) -> Trained | None:
        with self._lock:
            return self._by_value.get(value)

    def remove(self, value: str) -> Trained | None:
        with self._lock:
            return self._by_value.pop(value, None)

    def adopt(self, value: str, who: Caller) -> bool:
        """A page of the browser that trained ``value`` (a reload, which presents the value its browser kept) is
        ``who``: from the trainer's address, it may use the model too. Whether it may."""
        with self._lock:
            trained = self._by_value.get(value)
            if trained is None or trained.address != who.address:
                return False
            self._by_value[value] = dataclasses.replace(trained, reloads=trained.reloads | {who.session})
            return True

    def created_before(self, when: float) -> list[Trained]:
        """The models trained before ``when`` (a sweep's cut-off)."""
        with self._lock:
            return [t for t in self._by_value.values() if t.created < when]

    def shown_to(self, session: str | None, public: bool) -> list[Trained]:
        """The models a page lists: every one on a local server; on a public server the page's session's only."""
        who = caller()
        with self._lock:
            return [
                t
                for t in self._by_value.values()
                if not public or (session in t.reloads | {t.session} and t.owned_by(who))
            ]


PUBLIC_ROOTS = (ROOT / "models", ROOT / "runs")  # the only local folders public mode serves
NOT_SERVED = "This app serves only the models in its list: choose one of them."
UPLOADED = "Uploaded files cannot be used as models."


class ModelError(Exception):
    """A model that cannot be served. ``str(e)`` is for the person who asked (short, no server paths);
    ``detail`` is for the server log."""

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = detail or message


@dataclass(frozen=True)
class Choice:
    """A checkpoint as the picker offers it and as ``vit_core.from_pretrained`` loads it."""

    value: str  # what the picker sends
    label: str  # what the picker shows, and what messages call it
    source: str  # for from_pretrained: an absolute real path, or a Hub repo id (+ "/file.npz")
    revision: str | None  # Hub revision, None for local checkpoints
    key: str  # canonical: one per checkpoint, whatever the spelling

    @property
    def local(self) -> bool:
        return self.revision is None

    def relabel(self, value: str, label: str) -> Choice:
        return Choice(value, label, self.source, self.revision, self.key)


def trained_choice(trained: Trained) -> Choice:
    """A model trained here as the picker and the loader know it: its run folder, by its real path."""
    real = os.path.realpath(trained.out)
    return Choice(trained.value, trained.label, real, None, f"local:{real}")


def parse(text: str) -> Choice | None:
    """The checkpoint ``text`` names, with its canonical key, or None when it names none. An existing
    local path wins over a Hub id, as in ``vit_core.from_pretrained``."""
    text = text.strip()
    try:
        path = Path(text).expanduser()
        exists = bool(text) and path.exists()
    except (OSError, ValueError, RuntimeError):  # NUL bytes, names too long, "~nosuchuser"...
        return None
    if exists:
        real = os.path.realpath(path)
        return Choice(text, text, real, None, f"local:{real}")
    return _hub(text)


def _hub(text: str) -> Choice | None:
    """The Hub checkpoint ``text`` names, read from the text alone, or None."""
    m = HUB_ID.fullmatch(text)
    if m is None:
        return None
    revision = m["rev"] or "main"
    source = m["repo"] + (m["file"] or "").rstrip("/")
    return Choice(text, text, source, revision, f"hub:{source}@{revision}")


def _within(path: str, roots: list[Path]) -> bool:
    return any(Path(path).is_relative_to(root) for root in roots)


def upload_roots() -> list[Path]:
    """Where Gradio keeps uploads and cached files, lexically and resolved (the temp dir may be a symlink)."""
    folders = [Path(get_upload_folder()), Path(tempfile.gettempdir()) / "gradio", ROOT / get_cache_folder()]
    return list({p for f in folders for p in (Path(os.path.abspath(f)), Path(os.path.realpath(f)))})


def is_upload(text: str) -> bool:
    """Whether ``text`` points into Gradio's upload or cache folders, checked before and after resolving
    links, so the answer is the same whether or not the file exists."""
    try:
        path = Path(text.strip()).expanduser()
        roots = upload_roots()
        return _within(os.path.abspath(path), roots) or _within(os.path.realpath(path), roots)
    except (OSError, ValueError, RuntimeError):
        return False


def _looks_local(text: str) -> bool:
    """Whether ``text``, which names no existing path, was meant as one: it starts like a path, or its first
    part is the project's ``models`` or ``runs`` or a folder here (``runs/nope``), so it is not read as the Hub
    id ``owner/name``."""
    if text.startswith(("/", "./", "../", "~")):
        return True
    first = text.split("/", 1)[0]
    try:
        return first in {r.name for r in PUBLIC_ROOTS} or Path(first).is_dir() or (ROOT / first).is_dir()
    except (OSError, ValueError):
        return False


class Access:
    """The operator's list of models and the rule for everything else.

    ``listed``: the picker's choices, in order. ``allow_any``: web users may also type any folder or Hub
    id. ``public``: local folders are served only from the project's ``models/`` and ``runs/``.
    """

    def __init__(self, listed: list[Choice], allow_any: bool, public: bool) -> None:
        self.allow_any, self.public = allow_any, public
        self.listed: list[Choice] = []
        # models trained here (``webapp.jobs.trainer``), by a value only their trainer's session knows on a public
        # server, where they are served to that session from that address only (``Trained.owned_by``)
        self.trained = TrainedModels()
        for choice in listed:
            self.add(choice)

    def add(self, choice: Choice, first: bool = False) -> None:
        """List ``choice`` once per key (``first``: moved to the top); in public mode local folders only
        under models/ or runs/."""
        if self.public and choice.local and not _within(choice.source, [r.resolve() for r in PUBLIC_ROOTS]):
            raise ModelError(f"{choice.value}: public mode serves local folders only from models/ and runs/")
        listed = next((c for c in self.listed if c.key == choice.key), None)
        if listed is not None:
            if not first:
                return
            self.listed.remove(listed)
            choice = listed
        self.listed.insert(0 if first else len(self.listed), choice)

    def resolve(self, text: str) -> Choice:
        """The listed choice ``text`` names (by value, label or any spelling), or in allow-any mode the
        checkpoint it names; otherwise ModelError, with one message whatever the text points at."""
        text = (text or "").strip()
        if not text:
            raise ModelError("Choose a model first.")
        trained = self.trained.get(text)
        if trained is not None:
            if self.public and not trained.owned_by(caller()):  # a private value, sent by someone else
                raise ModelError(NOT_YOURS)
            return trained_choice(trained)
        for choice in self.listed:
            if text in (choice.value, choice.label):
                return choice
        if not self.allow_any:
            # Only the list: a listed Hub checkpoint spelled otherwise ("hf-hub:org/m@main") is known from the
            # text; nothing else is looked up, on the disk or elsewhere (no stat of "~root/.ssh").
            hub = _hub(text)
            listed = next((c for c in self.listed if hub is not None and c.key == hub.key), None)
            if listed is None:
                raise ModelError(NOT_SERVED)
            return listed
        if is_upload(text):
            raise ModelError(UPLOADED)
        parsed = parse(text)
        listed = next((c for c in self.listed if parsed is not None and c.key == parsed.key), None)
        if listed is not None:
            return listed
        if (parsed is None or not parsed.local) and _looks_local(text):
            raise ModelError(f"No such folder: {quote(text)}.")
        if parsed is None:
            raise ModelError("Give a model folder or a Hub repo id ('owner/name'), or choose one from the list.")
        return parsed


def default_choices(public: bool) -> list[Choice]:
    """The operator's list when none is given: the bundled model, the curated Hub checkpoints and (not in
    public mode) the run folders."""
    names = [BUNDLED_LABEL, *(c.repo for c in CURATED), *([] if public else run_folders())]
    return [operator_choice(name) for name in names]


def operator_choice(text: str) -> Choice:
    """A model the operator named (``--model``, ``--models``): "bundled", a curated repo (shown with its
    size), a folder (relative to the project when it is there, as run folders are listed) or a Hub id."""
    text = text.strip()
    if text in ("bundled", BUNDLED_LABEL):
        real = os.path.realpath(BUNDLED)
        return Choice(BUNDLED_LABEL, BUNDLED_LABEL, real, None, f"local:{real}")
    in_project = parse(str(ROOT / text)) if not Path(text).is_absolute() else None
    parsed = in_project.relabel(text, text) if in_project is not None and in_project.local else parse(text)
    if parsed is None:
        raise ModelError(f"{quote(text)} is neither a folder nor a Hub repo id ('owner/name')")
    curated = next((c for c in CURATED if parsed.key == f"hub:{c.repo}@main"), None)
    return parsed.relabel(curated.repo, curated.label) if curated is not None else parsed
