"""What a tab declares of its requests, for ``webapp.ui.wiring`` to turn into handlers and events: a tab lays out
its components and returns a ``Tab``, and writes no handler plumbing of its own.

- ``Api``: a public endpoint (``/classify``...), its function ``fn(ctx, ...)`` whose signature is what
  ``gradio_client`` calls, behind the memory gate with the tab's estimate;
- ``Answer``: a page request's answer, ``compute(ctx, request)`` on a ``Request`` (the inputs by name), shown
  only while it is the page's newest (``fresh``), ``failed(message)`` in place of the results otherwise;
- ``Event``: when the page sends an ``Answer`` (its triggers, or after another event of the tab);
- ``Clear``: what a change of subject (the image, files or model) blanks at once.

A tab's ``build(ctx, page)`` gets a ``Page`` (the picker, the shared ``Controls``) and returns its ``Tab``.

``api`` builds a public function from a computation on a ``Request``: its parameters (names and defaults, the
API's contract) are listed once here (``PARAMETERS``), not spelled out again in each tab.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import gradio as gr

from ..catalog import BUNDLED_LABEL
from ..settings import MapSettings
from . import fresh
from .context import Estimate
from .controls import Controls
from .picker import Fitted, Picker

REQUIRED = inspect.Parameter.empty
# Every public parameter of the tabs' API functions, with its type and default: the API's names, one place each.
PARAMETERS: dict[str, tuple[str, object]] = {
    "image": ("Upload | str | None", REQUIRED),
    "files": ("list[str] | None", REQUIRED),
    "model_choice": ("str", BUNDLED_LABEL),
    "x": ("float", 0.0),
    "y": ("float", 0.0),
    "method": ("str | None", None),
    "target": ("str", MapSettings.target),
    "layer": ("int", MapSettings.layer),
    "head": ("str", MapSettings.head),
    "head_fusion": ("str", MapSettings.head_fusion),
    "discard_ratio": ("float", MapSettings.discard_ratio),
    "opacity": ("float", MapSettings.opacity),
    "top_k": ("int", MapSettings.top_k),
}


def no_progress(*args: object, **kwargs: object) -> None:
    """Progress reported nowhere (a request from Python, not from a page or a client)."""


@dataclass(frozen=True)
class Request:
    """What a tab's computation gets: the request's values by name (the API's parameters or the page's inputs),
    its map settings read from them once, where to report progress, and the page's event (a click's point)."""

    values: Mapping[str, Any]
    progress: Callable[..., object] = no_progress
    event: Any = None  # ``gr.SelectData`` of a click

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @cached_property
    def settings(self) -> MapSettings:
        """The request's map settings, read from its values once."""
        return MapSettings.of(self.values)

    def report(self, fraction: float, desc: str) -> None:
        """Progress in the form ``vit_core``'s functions report it."""
        self.progress(fraction, desc=desc)


Compute = Callable[[Any, Request], Sequence]  # (the ``Context``, the request) -> the outputs' values


@dataclass(frozen=True)
class Api:
    """A public endpoint: ``fn(ctx, ...)`` on ``inputs`` (the picker's choice, not the model in use: a client
    names its model), its errors raised; gated with ``estimate`` (None: ``fn`` holds the gate itself)."""

    name: str
    fn: Callable
    inputs: Sequence[gr.components.Component]
    outputs: Sequence[gr.components.Component]
    estimate: Estimate | None
    triggers: Sequence = ()  # page events that call it too (the Train tab's button)
    compute: bool = True  # in the compute group (``admission.COMPUTE``); False: concurrency as ``options`` say
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Answer:
    """A page request: ``compute`` on ``inputs`` (named as ``Request`` gives them), shown in ``outputs`` while it
    is the newest of ``group`` about ``subject`` (the names of the inputs its results are about: what, and the
    model); ``failed(message)`` in their place when it fails. ``ready``: False leaves the outputs as they are
    (no point chosen yet), without a ticket."""

    compute: Compute
    estimate: Estimate
    inputs: Mapping[str, gr.components.Component]
    outputs: Sequence[gr.components.Component]
    failed: Callable[[str], Sequence]
    group: str
    subject: tuple[str, str] = ("image", "model_choice")
    ready: Callable[[Request], bool] | None = None
    progress: bool = False  # reports progress (``Request.report``)
    select: bool = False  # gets the click (``Request.event``)
    options: Mapping[str, Any] = field(default_factory=dict)  # the event's display options (``show_progress``)


@dataclass(frozen=True)
class Event:
    """When the page sends ``answer``: on ``triggers``, or once the tab's event named ``after`` succeeded (a
    ``Clear``, or another ``Event``). ``name``: its private ``api_name``."""

    name: str
    answer: Answer
    triggers: Sequence = ()
    after: str | None = None


@dataclass(frozen=True)
class Clear:
    """``outputs`` blanked (``blank(what)``) the moment ``subject`` (the image or files, and the model) changes
    on ``triggers``, dropping the answers of ``groups`` about the previous subject (``fresh.on_change``)."""

    name: str
    triggers: Sequence
    groups: Sequence[str]
    subject: tuple[gr.components.Component, gr.components.Component]
    blank: Callable[[Any], Sequence]
    outputs: Sequence[gr.components.Component]


@dataclass(frozen=True)
class Page:
    """What a tab's ``build`` gets: the model picker, and the page's shared image and map settings (one tab
    renders them, every tab may read them)."""

    picker: Picker
    controls: Controls


@dataclass(frozen=True)
class Tab:
    """What a tab's ``build`` returns: its endpoints, and its controls that follow the loaded model."""

    apis: Sequence[Api] = ()
    clears: Sequence[Clear] = ()
    events: Sequence[Event] = ()
    fitted: Fitted | None = None


def problem_last(blank: Sequence) -> Callable[[str], tuple]:
    """An ``Answer``'s ``failed`` for outputs whose last is a text: ``blank`` (what they show when cleared), the
    problem in place of that text (``fresh.problem``)."""
    return lambda message: (*blank[:-1], fresh.problem(message))


def api(compute: Compute, names: Sequence[str], progress: bool = False, **defaults: object) -> Callable:
    """The public function ``fn(ctx, <names>)`` of ``compute``: its parameters are ``names`` with
    ``PARAMETERS``' defaults (or ``defaults``), then ``progress`` when it reports progress; its docstring (the
    API page's description) is ``compute``'s. It reads the arguments into a ``Request`` and answers
    ``compute(ctx, request)``."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("ctx", kind, annotation="Context")]
    for name in names:
        annotation, default = PARAMETERS[name]
        params.append(inspect.Parameter(name, kind, default=defaults.get(name, default), annotation=annotation))
    if progress:
        params.append(inspect.Parameter("progress", kind, default=gr.Progress(), annotation="gr.Progress"))
    signature = inspect.Signature(params, return_annotation=inspect.signature(compute).return_annotation)

    def fn(*args: object, **kwargs: object) -> Sequence:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        ctx, report = values.pop("ctx"), values.pop("progress", no_progress)
        return compute(ctx, Request(values, report))

    fn.__signature__ = signature  # type: ignore[attr-defined]
    fn.__name__ = fn.__qualname__ = compute.__name__.lstrip("_")
    fn.__doc__, fn.__module__ = compute.__doc__, compute.__module__
    return fn
