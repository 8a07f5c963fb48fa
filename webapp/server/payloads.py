"""A request's values checked before Gradio preprocesses them: each refusal one log line and one clear sentence.

Gradio answers a value it cannot preprocess with ``{"error": null}`` and logs a traceback of 1.7 to 1.9 KB
(a layer of ``"abc"``, an opacity of ``null``, a model choice of ``123``, ``{"path": "/etc/passwd"}`` as an
image, a slider out of its range); it takes ``true`` as layer 1; a call with too few values logs every value it
received, whole; an unknown ``fn_index`` or endpoint name is an HTTP 500 with a traceback; and a file input given
as an ``http(s)`` URL is downloaded by the server, with no size cap. ``install`` puts two checks in front:

- **Endpoints** (``route_utils.get_fn``): an unknown ``fn_index`` or endpoint name is a 404, before anything
  else (a session's state included) is made for it.
- **Values** (``Blocks.process_api``): as many as the handler takes; numbers are numbers (``true`` is not a
  layer), finite, integers where the input is, within the slider's range; choices are text; files are files this
  server received (a list at most ``batch.MAX_FILES``), and in public mode never a URL: the server fetches
  nothing a request names ("send the file itself"). What Gradio still refuses (a path it did not receive) is
  answered the same way, in one line.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import gradio as gr
from fastapi import HTTPException
from gradio.exceptions import ComponentProcessingError, InvalidPathError

from ..errors import log, quote
from ..inference.archives import MAX_FILES
from .gradio_patches import wrap_get_fn, wrap_process_api

URLS_REFUSED = "this server does not fetch URLs: send the file itself"


class Refused(gr.Error):
    """A request whose values the handler cannot take, said in one sentence."""

    def __init__(self, message: str) -> None:
        super().__init__(message, print_exception=False)


def install(demo: gr.Blocks, public: bool) -> None:
    """Check every request's endpoint and values (see the module's docstring); ``public``: refuse URLs."""
    wrap_get_fn(_known_fn)
    wrap_process_api(demo, lambda process_api: _with_checks(demo, process_api, public), "payloads")


def _with_checks(demo: gr.Blocks, process_api: Callable[..., Any], public: bool) -> Callable[..., Any]:
    signature = inspect.signature(process_api)

    @functools.wraps(process_api)
    async def checked(*args: Any, **kwargs: Any) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs).arguments
        fn = bound["block_fn"]
        fn = demo.fns[fn] if isinstance(fn, int) else fn
        state = bound.get("state")
        blocks = state.blocks_config.blocks if state is not None else demo.blocks
        name = fn.api_name or fn.name
        try:
            problem = problems(fn.inputs, bound["inputs"], blocks, public)
            if problem is not None:
                raise Refused(problem)
            return await process_api(*args, **kwargs)
        except Refused as e:
            log.info("refused a request to %s: %s", name, e.message)
            raise
        except InvalidPathError:
            log.info("refused a request to %s: a file path this server did not receive", name)
            raise Refused("A file in this request was not uploaded to this server; upload it first.") from None
        except ComponentProcessingError as e:  # what the checks above did not foresee: said, not traced
            cause = e.__cause__ or e
            log.info("refused a request to %s: %s: %s", name, type(cause).__name__, quote(str(cause)))
            raise Refused(f"A value of this request could not be read ({type(cause).__name__}).") from None

    return checked


def _known_fn(get_fn: Callable[..., Any]) -> Callable[..., Any]:
    def known_fn(blocks: gr.Blocks, api_name: str | None, body: Any) -> Any:
        if body.fn_index is not None and body.fn_index not in blocks.fns:
            log.info("refused a request: no endpoint has fn_index %s", quote(body.fn_index))
            raise HTTPException(404, f"No endpoint has fn_index {quote(body.fn_index)}.")
        if body.fn_index is None and not any(fn.api_name == api_name for fn in blocks.fns.values()):
            log.info("refused a request: no endpoint is named %s", quote(api_name))
            raise HTTPException(404, f"No endpoint is named {quote(api_name)}.")
        return get_fn(blocks, api_name, body)

    return known_fn


def problems(inputs: list[Any], values: list[Any], blocks: dict[int, Any], public: bool) -> str | None:
    """What is wrong with ``values`` for the input components ``inputs`` (the session's copy of each in
    ``blocks``, whose range a page may have changed), in a sentence; None when the handler can take them."""
    if len(values) < len(inputs):
        return f"This endpoint takes {len(inputs)} values; the request sent {len(values)}."
    for block, value in zip(inputs, values, strict=False):
        problem = _problem(blocks.get(block._id, block), value, public)
        if problem is not None:
            return f"{block.label or type(block).__name__}: {problem}."
    return None


def _problem(block: Any, value: Any, public: bool) -> str | None:
    if isinstance(block, gr.State):
        return None  # the server's own, not the request's
    if isinstance(block, (gr.Number, gr.Slider)):
        return _number(block, value)
    if isinstance(block, (gr.Dropdown, gr.Radio)):
        multiple = getattr(block, "multiselect", False)
        ok = isinstance(value, str) or (value is None) or (multiple and isinstance(value, list))
        return None if ok else f"expected a choice (text), got {quote(value)}"
    if isinstance(block, (gr.Image, gr.File)):
        files = value if isinstance(value, list) and getattr(block, "file_count", "single") != "single" else [value]
        if len(files) > MAX_FILES:
            return f"at most {MAX_FILES} files in one request, this one has {len(files)}"
        return next((p for p in (_file(f, public) for f in files) if p is not None), None)
    return None


def _number(block: Any, value: Any) -> str | None:
    if value is None and isinstance(block, gr.Number) and block.value is None:
        return None  # an optional number (a page's request counter)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"expected a number, got {quote(value)}"
    if getattr(block, "precision", None) == 0 and value != int(value):
        return f"expected a whole number, got {quote(value)}"
    low, high = getattr(block, "minimum", None), getattr(block, "maximum", None)
    if low is not None and value < low:  # Gradio's own words
        return f"{quote(value)} is less than minimum value {low:g}"
    if high is not None and value > high:
        return f"{quote(value)} is greater than maximum value {high:g}"
    return None


def _file(value: Any, public: bool) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("path"), str):
        return f"expected a file (as gradio_client's handle_file sends it), got {quote(value)}"
    if public and value["path"].lower().startswith(("http://", "https://", "//")):
        return f"{quote(value['path'])}: {URLS_REFUSED}"
    return None
