"""One place turns every tab's declarations (``webapp.ui.endpoints``) into handlers and events: the API's
(gated with the tab's estimate, errors raised), the page's (ticketed: the newest request's answer only, errors in
place of the results, gated once known to be the newest: ``fresh.answer``, ``Context.held``), and the clears
that a change of image or model sends. A tab's handlers are all made here, so that they are all alike."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import gradio as gr

from ..admission import COMPUTE
from ..errors import user_errors
from . import fresh
from .context import Context
from .endpoints import Answer, Api, Request, Tab, no_progress


def wire(ctx: Context, tab: Tab) -> None:
    """The events of ``tab``'s declarations, on the page being built (inside its ``gr.Blocks``)."""
    sent: dict[str, gr.events.Dependency] = {}
    for clear in tab.clears:
        sent[clear.name] = fresh.on_change(clear.triggers, clear.groups, clear.subject, clear.blank, clear.outputs)
    for event in tab.events:
        a = event.answer
        handler, inputs = page_handler(ctx, a), list(a.inputs.values())
        options = dict(a.options, concurrency_id=COMPUTE, api_name=event.name)
        if event.after is None:
            sent[event.name] = fresh.listen(event.triggers, handler, inputs, a.outputs, **options)
        else:
            sent[event.name] = fresh.then(sent[event.after], handler, inputs, a.outputs, **options)
    for endpoint in tab.apis:
        _serve(ctx, endpoint)


def _serve(ctx: Context, endpoint: Api) -> None:
    """``endpoint``'s event: its function behind the gate with its estimate (``Context.handler``), errors raised."""
    options = dict(endpoint.options)
    if endpoint.compute:
        options["concurrency_id"] = COMPUTE
    handler = ctx.handler(endpoint.fn, endpoint.estimate)
    triggers = list(endpoint.triggers)
    gr.on(triggers, handler, list(endpoint.inputs), list(endpoint.outputs), api_name=endpoint.name, **options)


def page_handler(ctx: Context, answer: Answer) -> Callable:
    """The page's handler of ``answer``: its inputs by name, then the ticket (``fresh.listen``), the request, and
    the progress and the click when the answer takes them, as Gradio reads them from its signature."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(name, kind) for name in (*answer.inputs, "ticket")]
    params.append(inspect.Parameter("request", kind, annotation=gr.Request))
    if answer.progress:
        params.append(inspect.Parameter("progress", kind, default=gr.Progress()))
    if answer.select:
        params.append(inspect.Parameter("event", kind, annotation=gr.SelectData))
    signature = inspect.Signature(params)
    n = len(answer.outputs)

    def handle(*args: object, **kwargs: object) -> tuple:
        values = signature.bind(*args, **kwargs).arguments
        ticket, page, event = values.pop("ticket"), values.pop("request"), values.pop("event", None)
        request = Request(values, values.pop("progress", no_progress), event)
        if answer.ready is not None and not answer.ready(request):
            out = (gr.skip(),) * n  # no ticket taken: the answers in flight still count
        else:
            subject = fresh.subject_of(*(values[name] for name in answer.subject))
            held = ctx.held(answer.estimate, **values)
            compute = user_errors(lambda: _outputs(answer.compute(ctx, request), n))
            out = fresh.answer(page, answer.group, ticket, subject, n, compute, answer.failed, held)
        return out[0] if n == 1 else out  # Gradio takes one output's value bare

    handle.__signature__ = signature  # type: ignore[attr-defined]
    handle.__annotations__ = {"request": gr.Request, "event": gr.SelectData}
    return ctx.gpu(handle)


def _outputs(values: object, n: int) -> Sequence:
    """A computation's values as a sequence of ``n`` outputs (one output's value comes bare)."""
    return (values,) if n == 1 else values  # type: ignore[return-value]
