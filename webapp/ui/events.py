"""The page's events: every tab's declarations (``webapp.ui.endpoints``) turned into handlers and events in one
place (``wire``): the API's (gated with the tab's estimate, errors raised), the page's (ticketed: the newest
request's answer only, errors in place of the results, gated once known to be the newest: ``if_newest``,
``Context.held``), and the clears that a change of image or model sends. A tab's handlers are all made here, so
that they are all alike.

Results that belong to what is on screen: each browser page numbers its requests in the order it sends them,
and a tab shows only answers that are still true of the page.

Gradio runs a tab's events independently: a Classify run takes a second or more (RISE) while a settings change
or a new upload starts another run, and the answers can arrive in any order, so the screen could end on an
older request's map beside newer settings, or on the previous photo's answer beside the new photo. Here every
event of the page carries a **ticket**, a count the page increments as it sends a request (``TICKET_JS``, run
by the browser just before each request), and every output belongs to a **group** (a tab's results).
``Tickets`` remembers, per page and group, the newest request that asked for an answer, and the newest change
of **subject** (the image, files or model the results are about). An answer is dropped (``gr.skip``: the
outputs are left alone), when its request starts and again when it ends, if

- a newer request asked for an answer: the newest settings win, whatever order the server runs them in; or
- the subject changed after it was sent, to something else: it is about the previous image or model.

A change of subject clears the tab's results at once (``on_change``: outside the queue, a few milliseconds),
then recomputes them where that is cheap (Classify, the Explore picture) in an event chained after the clear
(``then``), once per subject: the browser can report one choice twice (a file input set while it holds a file
fires two ``change`` events with the new file), and the repeat (``Tickets.change`` says so) neither clears the
results nor recomputes them: the clear leaves them as they are, and of the recomputations chained after the two
clears only the first to arrive computes (``Tickets.claim``: one per change of subject, whichever order they
reach the server in; one sent about a subject the page has changed since claims nothing), without an error in the
browser's console. A request sent for
the new subject just before the page saw the change (a click right after an upload) still
counts. Errors replace the results they concern, in place (``if_newest``, ``while_newest``), instead of a toast over
the old ones.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import gradio as gr

from vit_core.data import ImageDataError

from ..server.admission import COMPUTE
from .declarations import Api, Shown, Tab
from .endpoints import Context, Prepared, no_progress, user_error, user_errors

# The page's request counter, written into the last input (the ticket's hidden number) of every ticketed event.
TICKET_JS = """(...args) => {
  window.vitTickets = (window.vitTickets || 0) + 1;
  args[args.length - 1] = window.vitTickets;
  return args;
}"""
MAX_PAGES = 4096  # (page, group) pairs remembered; the least recently used are forgotten first
NEVER = float("-inf")


@dataclass
class _Newest:
    answer: float = NEVER  # the newest ticket that asked for an answer
    change: float = NEVER  # the newest change of subject
    subject: Hashable = None  # what that change chose
    pending: bool = False  # a change of subject whose recomputation has not run yet (``claim``)


class Tickets:
    """Per browser page (Gradio's session hash) and group of outputs, the newest request for an answer and the
    newest change of subject; thread-safe. Requests without a ticket (not from the page: the API) always run."""

    def __init__(self, max_entries: int = MAX_PAGES) -> None:
        self.max_entries = max_entries
        self._newest: OrderedDict[tuple[str, str], _Newest] = OrderedDict()
        self._lock = threading.Lock()

    def _entry(self, page: str, group: str) -> _Newest:
        key = (page, group)
        entry = self._newest.setdefault(key, _Newest())
        self._newest.move_to_end(key)
        while len(self._newest) > self.max_entries:
            self._newest.popitem(last=False)
        return entry

    @staticmethod
    def _stale(n: _Newest, ticket: float, subject: Hashable) -> bool:
        return ticket < n.answer or (ticket < n.change and subject != n.subject)

    def start(self, page: str | None, group: str, ticket: float | None, subject: Hashable = None) -> bool:
        """Record that request ``ticket`` of ``page``, about ``subject``, starts on ``group``; False when its
        answer is already stale (a newer request started, or the subject changed to another since it was sent)."""
        if page is None or ticket is None:
            return True
        with self._lock:
            n = self._entry(page, group)
            if self._stale(n, ticket, subject):
                return False
            n.answer = ticket
            return True

    def current(self, page: str | None, group: str, ticket: float | None, subject: Hashable = None) -> bool:
        """Whether the answer to ``ticket`` may still be shown (``start``'s test, when it is ready)."""
        if page is None or ticket is None:
            return True
        with self._lock:
            n = self._newest.get((page, group))
            return n is None or not self._stale(n, ticket, subject)

    def change(self, page: str | None, group: str, ticket: float | None, subject: Hashable) -> bool:
        """Record that ``page`` chose ``subject`` (an image, files, a model) for ``group`` with ``ticket``; False
        when the page's newest choice was that subject already (a repeated event: nothing changed), or when a newer
        change arrived first (requests outside the queue can overtake each other on a busy server): that one
        cleared and recomputed, and a recomputation chained after this one would carry a newer ticket than it."""
        if page is None or ticket is None:
            return True
        with self._lock:
            n = self._entry(page, group)
            if ticket <= n.change:
                return False
            new = n.change == NEVER or subject != n.subject
            n.change, n.subject = ticket, subject
            n.pending = n.pending or new
            return new

    def claim(self, page: str | None, group: str, ticket: float | None, subject: Hashable = None) -> bool:
        """Whether a recomputation chained after a clear of ``group`` (``ticket``, about ``subject``) is the one its
        change of subject asked for: the first to arrive after a change (then no other), so that a repeated change
        event, whose clear changed nothing, recomputes nothing. One already stale (sent about a subject the page has
        changed since) claims nothing: it computes nothing, and the newer change's recomputation must still run
        (a photo's recomputation, queued behind a slow map while an example was clicked, took the example's turn,
        and Explore never showed the example)."""
        if page is None:
            return True
        with self._lock:
            n = self._entry(page, group)
            if ticket is not None and ticket < n.change and subject != n.subject:
                return False  # about a subject changed since: the turn is the newer change's recomputation's
            claimed, n.pending = n.pending, False
            return claimed


TICKETS = Tickets()


def subject_of(*values: object) -> Hashable:
    """What results are about, comparable between requests: the image or files (paths) and the model."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in values)


def ticket_input() -> gr.Number:
    """The hidden input that carries an event's ticket (``TICKET_JS`` fills it in as the request is sent)."""
    return gr.Number(visible=False, precision=0)


@dataclass(frozen=True)
class Ticket:
    """A page request's place among its page's: the page (Gradio's session hash; None: not a page's), the group
    of outputs it answers, its number (``TICKET_JS``; None: not ticketed) and what it is about (``subject_of``)."""

    page: str | None
    group: str
    number: float | None
    subject: Hashable


def if_newest(
    ticket: Ticket,
    n: int,
    compute: Callable[[], Sequence],
    failed: Callable[[str], Sequence],
    held: AbstractContextManager,
) -> tuple:
    """``compute()``'s ``n`` outputs for a ticketed request, or ``failed(message)`` in their place when it raises a
    ``gr.Error`` (a bad upload, a refused setting: ``endpoints.user_errors`` turns those into ``gr.Error``); ``n``
    skips when the answer is stale (``Tickets``), before or after it is computed. ``held`` (``Context.held``: the
    server's memory gate; every page request passes it) is entered after the ticket is recorded, so that a request
    refused for memory still overtakes the older ones and says so in place of its results."""
    page, group, number, subject = ticket.page, ticket.group, ticket.number, ticket.subject
    if not TICKETS.start(page, group, number, subject):
        return (gr.skip(),) * n
    try:
        with held:
            out = tuple(compute())
    except gr.Error as e:
        out = tuple(failed(str(e.message)))
    return out if TICKETS.current(page, group, number, subject) else (gr.skip(),) * n


def while_newest(
    ticket: Ticket,
    n: int,
    compute: Callable[[], Iterator[Sequence]],
    failed: Callable[[str], Sequence],
    held: AbstractContextManager,
) -> Iterator[tuple]:
    """``if_newest`` for an answer in several parts (a first answer, then the full one): each part shown while
    the request is still the page's newest; once it is not, skips, and nothing more is computed (the newer
    request's answer wins). A bad request, at any part, is ``failed(message)`` in place of the outputs."""
    page, group, number, subject = ticket.page, ticket.group, ticket.number, ticket.subject
    if not TICKETS.start(page, group, number, subject):
        yield (gr.skip(),) * n
        return
    try:
        with held:
            parts = compute()
            for part in iter(lambda: next(parts, None), None):  # asked for only while this request is the newest
                if not TICKETS.current(page, group, number, subject):
                    yield (gr.skip(),) * n
                    return
                yield tuple(part)
                if not TICKETS.current(page, group, number, subject):
                    parts.close()
                    yield (gr.skip(),) * n
                    return
    except (ValueError, ImageDataError) as e:  # gr.Error too: it is a ValueError
        out = tuple(failed(str(user_error(e).message)))
        yield out if TICKETS.current(page, group, number, subject) else (gr.skip(),) * n


def listen(triggers: Sequence, fn: Callable, inputs: Sequence, outputs: Sequence, **kwargs) -> gr.events.Dependency:
    """``fn`` on ``triggers``, its last input the request's ticket; page-only (each tab's API endpoint is its
    own event, which raises its errors instead of showing them). Every trigger runs (``multiple``): which
    answer is shown is decided by the tickets, not by dropping requests in the browser."""
    return gr.on(
        list(triggers),
        fn,
        [*inputs, ticket_input()],
        list(outputs),
        js=TICKET_JS,
        trigger_mode="multiple",
        api_visibility="private",
        **kwargs,
    )


@dataclass(frozen=True)
class Cleared:
    """A clear's event: a recomputation chained after it runs once per change of subject (``Tickets.claim``)."""

    event: gr.events.Dependency


def on_change(
    triggers: Sequence,
    groups: Sequence[str],
    subject: Sequence[gr.components.Component],
    blank: Callable[..., Sequence],
    outputs: Sequence,
) -> Cleared:
    """Clear ``outputs`` the moment the subject (``subject``'s components: the image or files, and the model)
    changes, outside the queue (``blank(*values)``: what they show meanwhile), and drop the answers about the
    previous subject still running in ``groups``; chain the recomputation after the returned event (``then``),
    which runs only when the clear succeeded: a repeated event for the same subject leaves them alone, and its
    recomputation computes nothing (``Tickets.claim``)."""

    def cleared(what: object, model: str, ticket: float | None, request: gr.Request) -> tuple:
        page = getattr(request, "session_hash", None)
        if not any([TICKETS.change(page, group, ticket, subject_of(what, model)) for group in groups]):
            return (gr.skip(),) * len(outputs)  # the results stay, and no error: the chained event claims nothing
        return tuple(blank(what))

    what, model = subject
    event = gr.on(
        list(triggers),
        cleared,
        [what, model, ticket_input()],
        list(outputs),
        js=TICKET_JS,
        queue=False,
        trigger_mode="multiple",
        api_visibility="private",
        show_progress="hidden",
    )
    return Cleared(event)


def then(
    previous: Cleared | gr.events.Dependency, fn: Callable, inputs: Sequence, outputs: Sequence, **kwargs
) -> gr.events.Dependency:
    """``fn`` once ``previous`` succeeded, with a newer ticket than its (after a clear, ``fn`` computes once per
    change of subject: ``page_handler(chained=True)``). Every time (Gradio's default for a chained event, "once",
    would skip it while the previous input's answer is still computing)."""
    event = previous.event if isinstance(previous, Cleared) else previous
    return event.success(
        fn,
        [*inputs, ticket_input()],
        list(outputs),
        js=TICKET_JS,
        trigger_mode="multiple",
        api_visibility="private",
        **kwargs,
    )


def wire(ctx: Context, tab: Tab) -> None:
    """The events of ``tab``'s declarations, on the page being built (inside its ``gr.Blocks``)."""
    sent: dict[str, Cleared | gr.events.Dependency] = {}
    for c in tab.clears:
        sent[c.name] = on_change(c.triggers, c.groups, c.subject, c.blank, c.outputs)
    for event in tab.events:
        a = event.shown
        after = sent.get(event.after) if event.after is not None else None
        handler, inputs = page_handler(ctx, a, chained=isinstance(after, Cleared)), list(a.inputs.values())
        options = dict(a.options, concurrency_id=COMPUTE, api_name=event.name)
        if after is None:
            sent[event.name] = listen(event.triggers, handler, inputs, a.outputs, **options)
        else:
            sent[event.name] = then(after, handler, inputs, a.outputs, **options)
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


def page_handler(ctx: Context, shown: Shown, chained: bool = False) -> Callable:
    """The page's handler of ``shown``: its inputs by name, then the ticket (``listen``), the request, and the
    progress and the click when it takes them, as Gradio reads them from its signature. ``chained``: after
    a clear (``then``), it computes once per change of subject (``Tickets.claim``)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    names = (*shown.inputs, "ticket")
    params = [inspect.Parameter(name, kind) for name in names]
    params.append(inspect.Parameter("request", kind, annotation=gr.Request))
    if shown.progress:
        params.append(inspect.Parameter("progress", kind, default=gr.Progress()))
    if shown.select:
        params.append(inspect.Parameter("event", kind, annotation=gr.SelectData))
    signature = inspect.Signature(params)
    n = len(shown.outputs)

    def prepared(args: tuple, kwargs: dict) -> tuple[Prepared, Ticket | None, AbstractContextManager]:
        """The request by name, its place among the page's (None: nothing to answer) and its hold on the gate."""
        values = signature.bind(*args, **kwargs).arguments
        ticket, page, event = values.pop("ticket"), values.pop("request"), values.pop("event", None)
        request = Prepared(values, values.pop("progress", no_progress), event)
        session = getattr(page, "session_hash", None)
        subject = subject_of(*(values[name] for name in shown.subject))
        if (shown.ready is not None and not shown.ready(request)) or (
            chained and not TICKETS.claim(session, shown.group, ticket, subject)
        ):
            return request, None, nullcontext()  # no ticket taken: the answers in flight still count
        place = Ticket(session, shown.group, ticket, subject)
        return request, place, ctx.held(lambda: shown.estimate(ctx, request))

    def handle(*args: object, **kwargs: object) -> tuple:
        request, place, held = prepared(args, kwargs)
        if place is None:
            out = (gr.skip(),) * n
        else:
            compute = user_errors(lambda: _outputs(shown.compute(ctx, request), n))
            out = if_newest(place, n, compute, shown.failed, held)
        return out[0] if n == 1 else out  # Gradio takes one output's value bare

    def stream(*args: object, **kwargs: object) -> Iterator[tuple]:
        request, place, held = prepared(args, kwargs)
        if place is None:
            yield (gr.skip(),) * n
            return
        yield from while_newest(place, n, lambda: shown.compute(ctx, request), shown.failed, held)

    handle = stream if shown.stream else handle
    handle.__signature__ = signature  # type: ignore[attr-defined]
    handle.__annotations__ = {"request": gr.Request, "event": gr.SelectData}
    return ctx.gpu(handle)


def _outputs(values: object, n: int) -> Sequence:
    """A computation's values as a sequence of ``n`` outputs (one output's value comes bare)."""
    return (values,) if n == 1 else values  # type: ignore[return-value]
