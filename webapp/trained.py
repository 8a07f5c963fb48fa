"""The models trained on this server (the Train tab), recorded once: ``TrainedModels``, owned by the access rules
(``access.Access.trained``). The trainer adds to it and sweeps it (``webapp.training``), the access rules
resolve a trained model's value through it, and the picker lists from it: on a local server every trained model,
for every page that loads after training; on a public one only the session's own, whose values no one else is
told."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

PRIVATE_PREFIX = "trained:"  # the picker value of a model trained here: the prefix, then a random token


@dataclass(frozen=True)
class Trained:
    """A model trained here: its picker value and readable label, its run folder, who trained it and when."""

    value: str
    label: str
    out: Path
    session: str
    created: float


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
        with self._lock:
            return [t for t in self._by_value.values() if not public or t.session == session]
