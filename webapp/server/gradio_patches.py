"""Every change the app makes to Gradio's own code, in one place. The checks themselves live in the modules that
own them (``payloads``, ``sessions``, ``queueing``, ``tempfiles``, ``newcomers``); this module is the only one that
replaces a Gradio function or class, so that an upgrade of Gradio is reviewed here.

Each patch wraps one Gradio function (or, for the sessions' table, changes one object's class) and was read against
the Gradio version in ``CHECKED_WITH``. ``PATCHED`` holds a digest of each patched function's source there;
``changed`` compares it with the running Gradio's (``tests/test_architecture.py`` runs it, so the suite fails when a
Gradio upgrade changes anything patched, and ``install`` logs a warning at start-up).

=========================================================  ===================================================
Gradio's                                                   wrapped by
=========================================================  ===================================================
``Blocks.process_api`` (every request's values, run)      ``payloads.install`` (values checked first),
                                                           ``sessions.Sessions`` (who calls; sessionless state)
``route_utils.get_fn`` (an endpoint by name or index)      ``payloads.install`` (unknown endpoints: 404)
``Queue.push`` (an event joins the queue)                  ``queueing.ClientLimits`` (a fair share per client)
``routes.upload_fn``, ``GradioMultiPartParser.parse``      ``tempfiles.remove_partial_uploads``
``StateHolder`` (the sessions' table)                      ``newcomers.Newcomers`` (light, counted sessions;
``SessionState.__init__``                                  ``LightState`` copies it but for its configurations)
``http_server.Server.__init__`` (uvicorn's server, its     ``queueing.Connections`` (its HTTP protocol: header
configuration)                                             timeout, connection caps)
=========================================================  ===================================================
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import gradio as gr
from gradio import blocks, http_server, queueing, route_utils, routes, state_holder

from ..errors import log

CHECKED_WITH = "6.31.0"  # the Gradio version every patch below was read against
PATCHED = {  # name -> (the function, the first 16 hex digits of its source's SHA-256 in CHECKED_WITH)
    "Blocks.process_api": (blocks.Blocks.process_api, "cb2ef4a0ec0bf45d"),
    "route_utils.get_fn": (route_utils.get_fn, "559e3fde0e11d7d1"),
    "Queue.push": (queueing.Queue.push, "c7b4091f41b8f075"),
    "routes.upload_fn": (routes.upload_fn, "986d84f98151c724"),
    "GradioMultiPartParser.parse": (route_utils.GradioMultiPartParser.parse, "0552b4527b087403"),
    "StateHolder.__getitem__": (state_holder.StateHolder.__getitem__, "eff490951a5ffb81"),
    "SessionState.__init__": (state_holder.SessionState.__init__, "1b2ea21dc42c45da"),
    "http_server.Server.__init__": (http_server.Server.__init__, "67232d121f0432ec"),
}
MARK = "_vit_core_patch"  # set on every wrapper, so that a second install wraps nothing twice

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def digest(fn: Callable[..., Any]) -> str:
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]


def changed() -> list[str]:
    """The patched Gradio functions whose source differs from the one the patches were read against."""
    return [name for name, (fn, expected) in PATCHED.items() if digest(fn) != expected]


def warn_if_changed() -> None:
    """One warning at start-up when the running Gradio is not the one the patches were checked against."""
    if names := changed():
        log.warning(
            "gradio %s changed what the app patches (%s; read against %s): check webapp/server/gradio_patches.py",
            gr.__version__,
            ", ".join(names),
            CHECKED_WITH,
        )


def _marked(wrapper: Callable[..., Any], tag: str) -> Callable[..., Any]:
    setattr(wrapper, MARK, tag)
    return wrapper


def _patched(fn: Any, tag: str) -> bool:
    """Whether ``fn`` is already this tag's wrapper, or wraps one."""
    while fn is not None:
        if getattr(fn, MARK, None) == tag:
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def wrap_process_api(demo: gr.Blocks, wrap: Wrap, tag: str) -> None:
    """``demo.process_api`` (every request's values, preprocessed, run, postprocessed) replaced by
    ``wrap(process_api)``."""
    if not _patched(demo.process_api, tag):
        demo.process_api = _marked(wrap(demo.process_api), tag)


def wrap_get_fn(wrap: Wrap) -> None:
    """``route_utils.get_fn(blocks, api_name, body)``, the endpoint a request names, replaced process-wide."""
    if not _patched(route_utils.get_fn, "get_fn"):
        route_utils.get_fn = _marked(wrap(route_utils.get_fn), "get_fn")


def wrap_queue_push(demo: gr.Blocks, wrap: Wrap) -> None:
    """``demo._queue.push(body, request, username)``, where every queued event joins, replaced by
    ``wrap(push)``."""
    queue = demo._queue
    if not _patched(queue.push, "push"):
        queue.push = _marked(wrap(queue.push), "push")


def wrap_uploads(wrap_parse: Wrap, wrap_upload: Wrap) -> None:
    """Gradio's upload route (``routes.upload_fn``) and its multipart parser (``GradioMultiPartParser.parse``),
    replaced process-wide."""
    parser = route_utils.GradioMultiPartParser
    if not _patched(parser.parse, "parse"):
        parser.parse = _marked(wrap_parse(parser.parse), "parse")
        routes.upload_fn = _marked(wrap_upload(routes.upload_fn), "upload")


def become(obj: Any, cls: type) -> Any:
    """``obj`` (Gradio's own sessions' table, with the sessions it holds) made an instance of its subclass
    ``cls``."""
    assert isinstance(obj, cls.__mro__[1]), (obj, cls)
    obj.__class__ = cls
    return obj


def wrap_server_config(configure: Callable[[Any], None]) -> None:
    """Gradio's uvicorn server (``http_server.Server``, made by ``launch`` with a ``uvicorn.Config`` of Gradio's
    choosing) given to ``configure(config)`` before it starts, process-wide."""
    init = http_server.Server.__init__
    if _patched(init, "server"):
        return

    def configured(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        configure(config)
        init(self, config, *args, **kwargs)

    configured.__wrapped__ = init  # type: ignore[attr-defined]
    http_server.Server.__init__ = _marked(configured, "server")
