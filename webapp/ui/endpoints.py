"""What every tab's handlers share at request time, for ``webapp.ui.events`` to make handlers of: the ``Context``
every handler takes first (the app's models, the memory gate, the trainer; a request's model and analysis), and
the request it gets.

A request is prepared once (``Prepared``): its memory estimate and its computation read the same model choice,
resolved once, the same method, parsed once, and the same upload, opened once.

``api`` builds a public function (``Public``) from a computation on a ``Prepared``: its parameters (names and
defaults, the API's contract) are listed once here (``PARAMETERS``), not spelled out again in each tab. Its bad
requests are said in a line (``user_errors``), and a page's in place of its results (``problem``). What a tab
declares of its endpoints and events is ``webapp.ui.declarations``.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import gradio as gr
import torch

from vit_core import VisionTransformer, methods
from vit_core.data import ImageDataError, ImageTransform

from ..errors import MAX_CHARS, log, public
from ..inference.analysis import Analysis, FirstLook, Step, Upload, analyse, analyse_first, untimed
from ..inference.settings import MapSettings, Settings
from ..jobs.trainer import Trainer
from ..registry.access import Choice
from ..registry.catalog import BUNDLED_LABEL
from ..registry.models import Models
from ..server.admission import Gate

# A tab's estimate of a request's memory (``webapp.inference.estimates``): the context, then the request, prepared
# once for the estimate and the computation.
Estimate = Callable[["Context", "Prepared"], int]


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

    def loaded(self, request: Prepared) -> tuple[VisionTransformer, ImageTransform] | tuple[None, None]:
        """The model ``request`` chose and its transform if it is loaded now, else (None, None): a memory estimate
        then leaves the model out (the request waits a moment for the load and most often answers "still
        loading")."""
        got = self.models.loaded(request.choice(self.models, strict=False))
        return got if got is not None else (None, None)

    def model(self, request: Prepared) -> tuple[VisionTransformer, ImageTransform, str]:
        """The model ``request`` chose (loaded, or waited for), its transform and its key (the analyses' cache)."""
        choice = request.choice(self.models)
        model, transform = self.models.get(choice)
        return model, transform, choice.key

    def analysis(self, request: Prepared, step: Step = untimed) -> Analysis:
        """The (cached) forward pass of the request's image through its model (its steps through ``step``)."""
        image = _image(request)
        model, transform, key = self.model(request)
        return analyse(model, transform, key, image, self.device, step)

    def analysis_steps(self, request: Prepared) -> Iterator[FirstLook | Analysis]:
        """``analysis`` in two answers for an image not analysed yet (``analysis.analyse_first``): the first
        answer of one forward pass, then the analysis; the request's settings, checked against the model, say
        which map that pass may serve (AttnLRP's)."""
        image = _image(request)
        model, transform, key = self.model(request)
        s = request.checked(model, self.default_method)
        return analyse_first(model, transform, key, image, self.device, s)

    def handler(self, fn: Callable, estimate: Estimate | None) -> Callable:
        """``fn(ctx, ...)`` as an event handler: bound to this context, so that Gradio reads the rest of its
        signature (the API's parameter names and defaults, ``gr.Progress``, ``gr.SelectData``); behind the
        memory gate with the tab's ``estimate`` (``admitted``). ``estimate=None``: a handler that holds the gate
        itself (``held``: the Train tab's, for as long as its process trains). ``webapp.ui.events`` attaches the
        API's handlers with this; the page's make their own hold inside ``events.if_newest``."""
        if estimate is None:
            return self.gpu(types.MethodType(fn, self))
        return self.admitted(fn if isinstance(fn, Public) else types.MethodType(fn, self), estimate)

    @contextmanager
    def held(self, estimate: Callable[[], int]) -> Iterator[None]:
        """The memory gate's hold of ``estimate()`` bytes (a request's, its tab's estimate of it), made on entering:
        ``events.if_newest`` enters it once the request is known to be the page's newest, so that a refusal
        ("busy") replaces that request's results in place, and the older answers it overtook are dropped,
        instead of a toast over an older answer that no longer matches the settings; a stale request reads no
        upload. Nothing to hold without a gate."""
        if self.gate is None:
            yield
            return
        with self.gate.held(estimate()):
            yield

    def admitted(self, fn: Public | Callable, estimate: Estimate, gpu: bool = True) -> Callable:
        """``fn`` (a ``Public`` function, or a listener that takes no ``ctx``) behind the server's memory gate with
        ``estimate``, run under ``gpu`` unless ``gpu`` is False (the model picker, which waits for a load that its
        own limits bound). The request is prepared once (``Public.prepare``) and both the estimate and the call
        use it: its model choice resolved, its method parsed and its upload opened once."""
        public = fn if isinstance(fn, Public) else Public.listener(fn)
        call = types.MethodType(public.compute, self)
        run = self.gpu(call) if gpu else call

        @functools.wraps(fn)
        def gated(*args: object, **kwargs: object) -> object:
            request = public.prepare(args, kwargs)
            with self.held(lambda: estimate(self, request)):
                return run(request)

        gated.__signature__ = public.signature  # what Gradio reads: the parameters after ``ctx``
        return gated


def _image(request: Prepared) -> Upload | str:
    image = request["image"]
    if image is None:
        raise gr.Error("Upload, paste or capture an image first (Classify tab).")
    return image


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
class Prepared:
    """A request prepared once and used by both its memory estimate and its computation: its values by name (the
    API's parameters or the page's inputs; an image is an ``Upload``, opened once), its map settings read once,
    its method parsed once (``method``) and its model choice resolved once (``choice``); where to report
    progress, and the page's event (a click's point)."""

    values: Mapping[str, Any]
    progress: Callable[..., object] = no_progress
    event: Any = None  # ``gr.SelectData`` of a click

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @cached_property
    def settings(self) -> MapSettings:
        """The request's map settings, read from its values once."""
        return MapSettings.of(self.values)

    @cached_property
    def _method(self) -> methods.Method | ValueError | None:
        """The method the settings name, parsed once (None: none named; a ``ValueError``: not in the table)."""
        title = self.settings.method
        try:
            return methods.by_title(title) if title else None
        except ValueError as e:
            return e

    def method(self, default: methods.Method, strict: bool = True) -> methods.Method:
        """The method the request names, else ``default``. A title not in the table: ``ValueError``, or with
        ``strict=False`` (an estimate: the computation refuses the request) ``default``."""
        named = self._method
        if isinstance(named, ValueError):
            if strict:
                raise named
            return default
        return named or default

    def choice(self, models: Models, strict: bool = True) -> Choice | None:
        """The checkpoint the request's ``model_choice`` names, resolved once (``Models.resolve``). A refusal:
        the ``gr.Error``, raised each time it is asked, or with ``strict=False`` (an estimate) None."""
        if "_choice" not in self.__dict__:
            try:
                self.__dict__["_choice"] = models.resolve(self.values.get("model_choice"))
            except gr.Error as e:
                self.__dict__["_choice"] = e
        got = self.__dict__["_choice"]
        if isinstance(got, gr.Error):
            if strict:
                raise got
            return None
        return got

    def checked(self, model: VisionTransformer, default: methods.Method) -> Settings:
        """The map settings checked against ``model`` (``MapSettings.checked``), the method the one named or
        ``default``; once for a request (Classify's first answer and its full answer both ask)."""
        memo = self.__dict__.setdefault("_checked", {})
        key = (id(model), default.key)
        if key not in memo:
            memo[key] = self.settings.checked(model, self.method(default))
        return memo[key]

    def report(self, fraction: float, desc: str) -> None:
        """Progress in the form ``vit_core``'s functions report it."""
        self.progress(fraction, desc=desc)


Compute = Callable[[Any, Prepared], Sequence]  # (the ``Context``, the request) -> the outputs' values


class Public:
    """A public function ``fn(ctx, ...)`` in two steps: ``prepare`` reads its arguments (those after ``ctx``, by
    ``signature``) into a ``Prepared``, ``compute(ctx, request)`` answers it. Called, it does both;
    ``Context.admitted`` makes the memory estimate between them, on the same request."""

    def __init__(self, signature: inspect.Signature, compute: Callable[[Any, Prepared], object], like: Callable):
        self.signature = signature  # its parameters after ``ctx``: what Gradio and the API page read
        self.compute = compute
        self.__name__ = self.__qualname__ = like.__name__.lstrip("_")
        self.__doc__, self.__module__ = like.__doc__, like.__module__

    @property
    def __signature__(self) -> inspect.Signature:
        """``inspect.signature`` of the function: ``ctx``, then ``signature``'s parameters."""
        ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="Context")
        return self.signature.replace(parameters=[ctx, *self.signature.parameters.values()])

    def prepare(self, args: tuple, kwargs: dict) -> Prepared:
        """The request of these arguments (those after ``ctx``), by name."""
        values = dict(self.signature.bind(*args, **kwargs).arguments)
        return Prepared(values, values.pop("progress", no_progress))

    def __call__(self, ctx: Any, *args: object, **kwargs: object) -> object:
        return self.compute(ctx, self.prepare(args, kwargs))

    @classmethod
    def listener(cls, fn: Callable) -> Public:
        """A listener that takes no ``ctx`` (the model picker's), as a ``Public``: its request is its arguments
        by name, its computation ``fn`` called with them."""
        signature = inspect.signature(fn)

        def compute(ctx: Any, request: Prepared) -> object:
            progress = {"progress": request.progress} if "progress" in signature.parameters else {}
            return fn(**request.values, **progress)

        return cls(signature, compute, fn)


def api(compute: Compute, names: Sequence[str], progress: bool = False, **defaults: object) -> Public:
    """The public function ``fn(ctx, <names>)`` of ``compute``: its parameters are ``names`` with
    ``PARAMETERS``' defaults (or ``defaults``), then ``progress`` when it reports progress; its docstring (the
    API page's description) is ``compute``'s. It reads the arguments into a ``Prepared`` and answers
    ``compute(ctx, request)``, its bad requests said in a line (``user_errors``)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = []
    for name in names:
        annotation, default = PARAMETERS[name]
        params.append(inspect.Parameter(name, kind, default=defaults.get(name, default), annotation=annotation))
    if progress:
        params.append(inspect.Parameter("progress", kind, default=gr.Progress(), annotation="gr.Progress"))
    signature = inspect.Signature(params, return_annotation=inspect.signature(compute).return_annotation)
    return Public(signature, user_errors(compute), compute)


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
