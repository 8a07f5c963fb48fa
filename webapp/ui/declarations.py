"""What a tab declares of its requests, for ``webapp.ui.events`` to turn into handlers and events; a tab lays out its
components and returns a ``Tab``.

- ``Api``: a public endpoint (``/classify``...), its function ``fn(ctx, ...)`` whose signature is what
  ``gradio_client`` calls, behind the memory gate with the tab's estimate;
- ``Shown``: a page request, ``compute(ctx, request)`` on a ``Prepared`` (the inputs by name), shown
  only while it is the page's newest (``webapp.ui.events``), ``failed(message)`` in place of the results otherwise;
- ``Event``: when the page sends a ``Shown`` (its triggers, or after another event of the tab);
- ``Clear``: what a change of subject (the image, files or model) blanks at once.

A tab's ``build(ctx, page)`` gets a ``Page`` (the picker, the shared ``Controls``) and returns its ``Tab``. All of
it is read while the page is built; at request time the handlers are ``webapp.ui.endpoints``'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import gradio as gr

from .endpoints import Compute, Estimate, Prepared, problem

if TYPE_CHECKING:  # the page's parts, which a tab's build gets; the picker takes a Context
    from .controls import Controls
    from .picker import Fitted, Picker


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
class Shown:
    """A page request: ``compute`` on ``inputs`` (named as ``Prepared`` gives them), shown in ``outputs`` while it
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
    ready: Callable[[Prepared], bool] | None = None
    progress: bool = False  # reports progress (``Prepared.report``)
    stream: bool = False  # ``compute`` yields its outputs in parts (a first answer, then the full one)
    select: bool = False  # gets the click (``Prepared.event``)
    options: Mapping[str, Any] = field(default_factory=dict)  # the event's display options (``show_progress``)


@dataclass(frozen=True)
class Event:
    """When the page sends ``shown``: on ``triggers``, or once the tab's event named ``after`` succeeded (a
    ``Clear``, or another ``Event``). ``name``: its private ``api_name``."""

    name: str
    shown: Shown
    triggers: Sequence = ()
    after: str | None = None


@dataclass(frozen=True)
class Clear:
    """``outputs`` blanked (``blank(what)``) the moment ``subject`` (the image or files, and the model) changes
    on ``triggers``, dropping the answers of ``groups`` about the previous subject (``events.on_change``)."""

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
    """An ``Shown``'s ``failed`` for outputs whose last is a text: ``blank`` (what they show when cleared), the
    problem in place of that text (``problem``)."""
    return lambda message: (*blank[:-1], problem(message))
