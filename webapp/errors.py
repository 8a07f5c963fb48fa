"""Errors as people read them: one short line without server paths (``public``), a request's value quoted in a
bounded length (``quote``), and the server's log (``log``). The handlers' errors are turned into these lines in
``webapp.ui.endpoints`` (``user_errors``)."""

from __future__ import annotations

import logging
import re

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
