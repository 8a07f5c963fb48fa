"""What every tab's handlers share: the app's models, and how a handler is attached to the page."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gradio as gr
import torch

from vit_core import methods

from ..admission import Gate
from ..analysis import Analysis, Step, Upload, analyse, untimed
from ..catalog import ROOT
from ..models import Models
from ..training import Trainer

EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.jpg"))  # shown on Classify, measured on Inspect
# A tab's estimate of a request's memory (``webapp.estimates``): the context, then the handler's arguments by name.
Estimate = Callable[["Context", dict[str, Any]], int]


def _unchanged(fn: Callable) -> Callable:
    return fn


@dataclass
class Context:
    """The tabs' handlers take this first: the model registry (the picker's choices, the loaded models, the
    device, the models trained here), ``gpu``, which runs a compute handler where a GPU is (``spaces.GPU`` on a
    ZeroGPU Space), the memory gate and the server's trainer."""

    models: Models
    gpu: Callable[[Callable], Callable] = _unchanged
    gate: Gate | None = None  # the server's memory budget (``webapp.admission``); None: requests are not gated
    trainer: Trainer | None = None  # the Train tab's job slot (None: the server's own, ``Trainer.for_server``)

    def __post_init__(self) -> None:
        if self.trainer is None:
            self.trainer = Trainer.for_server(self.models)

    @property
    def device(self) -> torch.device:
        return self.models.device

    @property
    def default_method(self) -> methods.Method:
        """The map shown before a visitor picks one (``--default-method``)."""
        return self.models.options.default_method

    def analysis(self, image: Upload | str | None, model_choice: str, step: Step = untimed) -> Analysis:
        """The (cached) forward pass of ``image`` through the chosen model (its steps through ``step``)."""
        if image is None:
            raise gr.Error("Upload, paste or capture an image first (Classify tab).")
        model, transform = self.models.get(model_choice)
        return analyse(model, transform, self.models.key_of(model_choice), image, self.device, step)

    def handler(self, fn: Callable, estimate: Estimate | None) -> Callable:
        """``fn(ctx, ...)`` as an event handler: bound to this context, so that Gradio reads the rest of its
        signature (the API's parameter names and defaults, ``gr.Progress``, ``gr.SelectData``); behind the
        memory gate with the tab's ``estimate`` (``admitted``). ``estimate=None``: a handler that holds the gate
        itself (``held``: the Train tab's, for as long as its process trains). ``webapp.ui.wiring`` attaches the
        API's handlers with this; the page's make their own hold inside ``fresh.answer``."""
        bound = types.MethodType(fn, self)
        return self.gpu(bound) if estimate is None else self.admitted(bound, estimate)

    @contextmanager
    def held(self, estimate: Estimate, **arguments: object) -> Iterator[None]:
        """The memory gate's hold for a page request (its tab's ``estimate`` of ``arguments``), for
        ``fresh.answer`` to enter once the request is known to be the page's newest: a refusal ("busy") then
        replaces that request's results in place, and the older answers it overtook are dropped, instead of a
        toast over an older answer that no longer matches the settings. The estimate is made on entering (a stale
        request reads no upload); nothing to hold without a gate."""
        if self.gate is None:
            yield
            return
        with self.gate.held(estimate(self, arguments)):
            yield

    def admitted(self, fn: Callable, estimate: Estimate, gpu: bool = True) -> Callable:
        """``fn`` behind the server's memory gate with ``estimate``, run under ``gpu`` unless ``gpu`` is False
        (the model picker, which waits for a load that its own limits bound)."""
        run = self.gpu(fn) if gpu else fn
        return run if self.gate is None else self.gate.admit(run, lambda arguments: estimate(self, arguments))
