"""Input components whose values the server checks itself.

Gradio checks a Dropdown's or Radio's value against its choices before a handler runs and, when it is not
one, answers with the whole value in the message and prints a traceback: a 50 MB value sent to ``/classify``
came back in the response and went into the log. These components pass the value on unchecked, bounded in
length, so that ``webapp.access`` (models) and ``webapp.settings`` (everything else) answer with their own
one-line messages, which quote at most ``errors.MAX_QUOTED`` characters of it.
"""

from __future__ import annotations

import gradio as gr

from ..errors import log, quote

MAX_VALUE_CHARS = 1000  # longer than any model id, path or class name the app offers


def _bounded(component: gr.components.Component, payload: object) -> object:
    if isinstance(payload, str) and len(payload) > MAX_VALUE_CHARS:
        what = component.label or type(component).__name__
        log.warning("refused a %s value of %s characters: %s", what, f"{len(payload):,}", quote(payload))
        raise gr.Error(f"{what}: the value is too long ({len(payload):,} characters).", print_exception=False)
    return payload


class CheckedDropdown(gr.Dropdown):
    """A single-choice ``gr.Dropdown`` whose value the handler checks (see the module's docstring)."""

    is_template = True

    def preprocess(self, payload: str | None) -> str | None:
        return _bounded(self, payload)


class CheckedRadio(gr.Radio):
    """A ``gr.Radio`` whose value the handler checks (see the module's docstring)."""

    is_template = True

    def preprocess(self, payload: str | None) -> str | None:
        return _bounded(self, payload)
