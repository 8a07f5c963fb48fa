"""Errors as people read them: one short line without server paths, and no traceback, in the UI; in the
server log one line per handled error, and a traceback only for unexpected ones (those are not caught here,
so Gradio logs them with theirs)."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

import gradio as gr

from vit_core.data import ImageDataError

log = logging.getLogger("webapp")
MAX_CHARS = 300
MAX_QUOTED = 200  # characters of a user's value repeated in a message or a log line
_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/[^\s'\"(),;]*[^\s'\"(),;.:]")  # not inside URLs or relative paths


def public(message: str, names: dict[str, str] | None = None) -> str:
    """The first line of ``message``, each server path in ``names`` replaced by the name people know it by,
    any other absolute path shortened to its last part ("…/photo.jpg"), at most MAX_CHARS characters."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    for path, name in sorted((names or {}).items(), key=lambda item: -len(item[0])):
        first = first.replace(path, name)
    first = _ABSOLUTE_PATH.sub(lambda m: "…/" + m[0].rstrip("/").rsplit("/", 1)[-1], first)
    return first if len(first) <= MAX_CHARS else first[: MAX_CHARS - 1] + "…"


def quote(value: object) -> str:
    """``repr(value)`` for a message or a log line, at most ``MAX_QUOTED`` characters of it: a request's
    value can be megabytes long."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED else f"{text[: MAX_QUOTED - 1]}… ({len(text):,} characters)"


def sentence(text: str) -> str:
    """``text`` ending in a full stop (or its own ?, ! or …), to be followed by another sentence."""
    text = text.rstrip()
    return text if text.endswith((".", "?", "!", "…")) else text + "."


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
