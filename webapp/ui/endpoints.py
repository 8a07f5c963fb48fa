"""What every tab's handlers share and what a tab declares of its requests, for ``webapp.ui.events`` to turn into
handlers and events: the ``Context`` every handler takes first (the app's models, the memory gate, the trainer);
a tab lays out its components and returns a ``Tab``.

- ``Api``: a public endpoint (``/classify``...), its function ``fn(ctx, ...)`` whose signature is what
  ``gradio_client`` calls, behind the memory gate with the tab's estimate;
- ``Answer``: a page request's answer, ``compute(ctx, request)`` on a ``Request`` (the inputs by name), shown
  only while it is the page's newest (``webapp.ui.events``), ``failed(message)`` in place of the results otherwise;
- ``Event``: when the page sends an ``Answer`` (its triggers, or after another event of the tab);
- ``Clear``: what a change of subject (the image, files or model) blanks at once.

A tab's ``build(ctx, page)`` gets a ``Page`` (the picker, the shared ``Controls``) and returns its ``Tab``.

``api`` builds a public function from a computation on a ``Request``: its parameters (names and defaults, the
API's contract) are listed once here (``PARAMETERS``), not spelled out again in each tab.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import gradio as gr
import torch

from vit_core import methods
from vit_core.data import ImageDataError

from ..errors import MAX_CHARS, log, public
from ..inference.analysis import Analysis, FirstLook, Step, Upload, analyse, analyse_first, untimed
from ..inference.settings import MapSettings
from ..jobs.trainer import Trainer
from ..registry.catalog import BUNDLED_LABEL
from ..registry.models import Models
from ..server.admission import Gate

if TYPE_CHECKING:  # the page's parts, which a tab's build gets; the picker takes a Context
    from .controls import Controls
    from .picker import Fitted, Picker

# A tab's estimate of a request's memory (``webapp.inference.estimates``): the context, then the handler's arguments
# by name.
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
    gate: Gate | None = None  # the server's memory budget (``webapp.server.admission``); None: requests are not gated
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

    def analysis_steps(
        self, image: Upload | str | None, model_choice: str, settings: MapSettings
    ) -> Iterator[FirstLook | Analysis]:
        """``analysis`` in two answers for an image not analysed yet (``analysis.analyse_first``): the first
        answer of one forward pass, then the analysis; ``settings``, checked against the model, say which map
        that pass may serve (AttnLRP's)."""
        if image is None:
            raise gr.Error("Upload, paste or capture an image first (Classify tab).")
        model, transform, key = self.models.get_keyed(model_choice)
        s = settings.checked(model, self.default_method)
        return analyse_first(model, transform, key, image, self.device, s)

    def handler(self, fn: Callable, estimate: Estimate | None) -> Callable:
        """``fn(ctx, ...)`` as an event handler: bound to this context, so that Gradio reads the rest of its
        signature (the API's parameter names and defaults, ``gr.Progress``, ``gr.SelectData``); behind the
        memory gate with the tab's ``estimate`` (``admitted``). ``estimate=None``: a handler that holds the gate
        itself (``held``: the Train tab's, for as long as its process trains). ``webapp.ui.events`` attaches the
        API's handlers with this; the page's make their own hold inside ``events.if_newest``."""
        bound = types.MethodType(fn, self)
        return self.gpu(bound) if estimate is None else self.admitted(bound, estimate)

    @contextmanager
    def held(self, estimate: Estimate, **arguments: object) -> Iterator[None]:
        """The memory gate's hold for a page request (its tab's ``estimate`` of ``arguments``), for
        ``events.if_newest`` to enter once the request is known to be the page's newest: a refusal ("busy") then
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
        gated = run if self.gate is None else self.gate.admit(run, lambda arguments: estimate(self, arguments))

        @functools.wraps(gated)
        def resolving(*args: object, **kwargs: object) -> object:
            with self.models.one_request():  # the estimate and the call resolve the model choice once
                return gated(*args, **kwargs)

        resolving.__signature__ = inspect.signature(gated)  # a bound handler's: not its function's, with ``ctx``
        return resolving


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
    stream: bool = False  # ``compute`` yields its outputs in parts (a first answer, then the full one)
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
    """An ``Answer``'s ``failed`` for outputs whose last is a text: ``blank`` (what they show when cleared), the
    problem in place of that text (``problem``)."""
    return lambda message: (*blank[:-1], problem(message))


def api(compute: Compute, names: Sequence[str], progress: bool = False, **defaults: object) -> Callable:
    """The public function ``fn(ctx, <names>)`` of ``compute``: its parameters are ``names`` with
    ``PARAMETERS``' defaults (or ``defaults``), then ``progress`` when it reports progress; its docstring (the
    API page's description) is ``compute``'s. It reads the arguments into a ``Request`` and answers
    ``compute(ctx, request)``, its bad requests said in a line (``user_errors``)."""
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
    return user_errors(fn)


def problem(message: str) -> str:
    """An error as it replaces a result: one line, marked."""
    return f"⚠️ {message}"


def user_error(error: Exception) -> gr.Error:
    """A handled error (bad input, a refused model...) as the UI shows it, logged as one line. A ``gr.Error``
    is already for people (and was logged where it was raised)."""
    if isinstance(error, gr.Error):
        return error
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    log.warning("%s: %s", type(error).__name__, first if len(first) <= MAX_CHARS else first[: MAX_CHARS - 1] + "…")
    return gr.Error(public(str(error)), print_exception=False)


def user_errors(fn: Callable) -> Callable:
    """A handler whose bad requests (an unreadable image, a layer the model lacks...) become messages for the
    user (``user_error``); other errors pass, for Gradio to log with their traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, ImageDataError) as e:  # gr.Error too: it is a ValueError
            raise user_error(e) from None

    return wrapper
