"""The models trained on this server (the Train tab), recorded once: ``TrainedModels``, owned by the access rules
(``access.Access.trained``). The trainer adds to it and sweeps it (``webapp.training``), the access rules
resolve a trained model's value through it, and the picker lists from it: on a local server every trained model,
for every page that loads after training; on a public one only the session's own, whose values no one else is
told.

**Whose they are.** A trained model and the job that makes it belong to the caller that started the job: its
Gradio session hash *and* its address (``queueing.client_ip``). A session hash is chosen by the client and sent in
every request body (a REST ``/call`` may name any), so it alone would let whoever learns it use or cancel another
visitor's; the address is the proxy's, which a client cannot choose. ``Caller`` is who asks now: set for each
request by ``webapp.sessions`` around Gradio's ``process_api`` (the handlers run in threads that copy it), and
None for calls from Python (tests, the trainer itself), which are the server's own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

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

    def owned_by(self, who: Caller | None) -> bool:
        """Whether ``who`` may use this model: its session from its address; anyone outside a request."""
        return who is None or (who.session == self.session and who.address == self.address)


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

    def created_before(self, when: float) -> list[Trained]:
        """The models trained before ``when`` (a sweep's cut-off)."""
        with self._lock:
            return [t for t in self._by_value.values() if t.created < when]

    def shown_to(self, session: str | None, public: bool) -> list[Trained]:
        """The models a page lists: every one on a local server; on a public server the page's session's only."""
        who = caller()
        with self._lock:
            return [t for t in self._by_value.values() if not public or (t.session == session and t.owned_by(who))]
