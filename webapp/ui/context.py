"""What every tab's handlers share: the app's models, and how a handler is attached to the page."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import gradio as gr
import torch

from ..admission import Gate
from ..analysis import Analysis, analyse
from ..catalog import ROOT
from ..estimates import Costs
from ..models import Models

EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.jpg"))  # shown on Classify, measured on Inspect


def _unchanged(fn: Callable) -> Callable:
    return fn


@dataclass
class Context:
    """The tabs' handlers take this first: the model registry (the picker's choices, the loaded models, the
    device) and ``gpu``, which runs a compute handler where a GPU is (``spaces.GPU`` on a ZeroGPU Space)."""

    models: Models
    gpu: Callable[[Callable], Callable] = _unchanged
    gate: Gate | None = None  # the server's memory budget (``webapp.admission``); None: requests are not gated

    @property
    def device(self) -> torch.device:
        return self.models.device

    def analysis(self, image: str | None, model_choice: str) -> Analysis:
        """The (cached) forward pass of ``image`` through the chosen model."""
        if image is None:
            raise gr.Error("Upload, paste or capture an image first (Classify tab).")
        model, transform = self.models.get(model_choice)
        return analyse(model, transform, self.models.key_of(model_choice), image, self.device)

    @property
    def costs(self) -> Costs:
        return Costs(self.models.loaded, lambda: self.device, len(EXAMPLES))

    def handler(self, fn: Callable, work: str | None) -> Callable:
        """``fn(ctx, ...)`` as an event handler: bound to this context, so that Gradio reads the rest of its
        signature (the API's parameter names and defaults, ``gr.Progress``, ``gr.SelectData``); see ``admitted``
        for ``work``. Register compute handlers with ``concurrency_id=admission.COMPUTE``. ``work=None``: a page
        handler, which holds the gate itself (``held``, inside ``fresh.answer``)."""
        bound = types.MethodType(fn, self)
        return self.gpu(bound) if work is None else self.admitted(bound, work)

    @contextmanager
    def held(self, work: str, **arguments: object) -> Iterator[None]:
        """The memory gate's hold for a page request (``work`` and the arguments ``Costs.of`` reads), for
        ``fresh.answer`` to enter once the request is known to be the page's newest: a refusal ("busy") then
        replaces that request's results in place, and the older answers it overtook are dropped, instead of a
        toast over an older answer that no longer matches the settings. The estimate is made on entering (a stale
        request reads no header); nothing to hold without a gate."""
        if self.gate is None:
            yield
            return
        with self.gate.held(self.costs.of(work)(arguments)):
            yield

    def admitted(self, fn: Callable, work: str) -> Callable:
        """``fn`` behind the server's memory gate, with the estimate of ``work`` (``Costs.of``: "classify",
        "view", "explore", "compare", "batch", "inspect", or "load" for the model picker, which waits for a load
        that its own limits bound), run under ``gpu`` unless it is a "load"."""
        run = fn if work == "load" else self.gpu(fn)
        return run if self.gate is None else self.gate.admit(run, self.costs.of(work))
