"""The model picker above the tabs: the choice, a status line, the model's facts, and fitting every tab's
controls (classes, layers, heads, the default method) to the model that loads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import gradio as gr
import torch

from vit_core import VisionTransformer

from ..errors import sentence
from ..inference import model_info
from ..inference.estimates import request_only
from ..registry.access import PRIVATE_PREFIX, caller
from .endpoints import Context
from .inputs import CheckedDropdown


@runtime_checkable
class Fitted(Protocol):
    """A tab whose controls follow the loaded model: ``fit`` gives their updates, in ``fitted``'s order."""

    fitted: list[gr.components.Component]

    def fit(self, model: VisionTransformer, device: torch.device) -> list: ...


@dataclass
class Picker:
    """The picker's components, which every tab reads, and the model the page starts on."""

    choice: gr.Dropdown  # the bundled model, a run folder, or a Hub repo id
    status: gr.Markdown  # which model is loaded, or why the chosen one did not load
    active: gr.State  # the model in use: a failed load goes back to it
    kept: gr.BrowserState  # in the browser's storage: the model chosen last and the models it trained here
    facts: gr.Markdown  # its classes and input
    model: VisionTransformer  # the startup model, which the tabs' controls start from


def label(allow_any: bool) -> str:
    """The picker's label: what this server lets a visitor choose. Typing a folder or Hub id is for local use
    (``--allow-any-model``); a public server offers its list only, and refuses other names."""
    if allow_any:
        return "Model: choose one, or type a run folder or a Hub repo id (ours, timm or transformers)"
    return "Model: choose one of the models this server offers (it loads no other)"


def build(ctx: Context) -> Picker:
    """The picker's row, starting on the startup model."""
    default = ctx.models.default
    model, _ = ctx.models.get(default)
    with gr.Row():
        choice = CheckedDropdown(
            ctx.models.choices(),
            value=default,
            allow_custom_value=ctx.models.allow_custom_value,
            scale=3,
            min_width=320,
            label=label(ctx.models.allow_custom_value),
        )
        status = gr.Markdown(elem_id="status", min_width=300)  # min widths: a row of its own on phones
    active = gr.State(default)
    kept = gr.BrowserState({"choice": None, "trained": []}, storage_key="vit-core-picker")
    facts = gr.Markdown(model_info.facts(model), elem_id="facts")
    return Picker(choice, status, active, kept, facts, model)


def connect(ctx: Context, picker: Picker, demo: gr.Blocks, tabs: Sequence[Fitted]) -> None:
    """Load the chosen model (with a progress indicator) and fit the tabs' controls to it, on a change of the
    picker and when the page opens. A model that fails to load leaves the previous one active: the status line
    says why, and the picker goes back to it."""
    fitted = [c for tab in tabs for c in tab.fitted]

    def updates(choice: str) -> tuple:
        model, _ = ctx.models.load(choice)
        cfg = model.config
        size = f"{model_info.format_count(model.num_params())} parameters, {cfg.num_classes} classes"
        name = ctx.models.label_of(choice)  # a model trained here: its label, not its token
        status = f"Loaded **{name}** ({cfg.name + ', ' if cfg.name else ''}{size}).{ctx.models.note(choice)}"
        return (status, model_info.facts(model), *(u for tab in tabs for u in tab.fit(model, ctx.device)), choice)

    def on_change(
        choice: str,
        active: str,
        kept: dict | None,
        request: gr.Request,
        progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's idiom)
    ):
        if choice == active:
            return gr.skip()  # the picker was set back after a failed load, or nothing changed
        progress(0.1, desc=f"Loading {choice}")
        try:
            return (*updates(choice), gr.skip(), _kept(kept, choice))
        except gr.Error as e:
            status = f"⚠️ {sentence(e.message)} Still using **{active}**."
            # back to the model in use, the choices marked anew: a Hub that stopped answering marks its models
            back = gr.Dropdown(value=active, choices=ctx.models.choices(_session(request)))
            return (status, *[gr.skip()] * (len(fitted) + 2), back, gr.skip())

    def on_load(choice: str, kept: dict | None, request: gr.Request) -> tuple:
        # a reload: the models this browser trained are this page's too, and the model chosen last is chosen again
        trained, last = _read(kept)
        who = caller()
        for value in trained:
            if who is not None:
                ctx.models.trained.adopt(value, who)
        # the choices as they are now: those that cannot load marked, the models trained since start-up listed
        choices = ctx.models.choices(_session(request))
        if last is not None and any(last == value for _, value in choices) and last != choice:
            try:
                return (*updates(last), gr.Dropdown(choices=choices, value=last))
            except gr.Error:
                pass  # the startup model, as a new page has it; the picker says why when it is chosen again
        return (*updates(choice), gr.Dropdown(choices=choices))

    outputs = [picker.status, picker.facts, *fitted, picker.active]
    # Gated, but outside the compute group: a slow download holds no compute slot (``Context.admitted``).
    change = ctx.admitted(on_change, request_only, gpu=False)
    picker.choice.change(
        change,
        [picker.choice, picker.active, picker.kept],
        [*outputs, picker.choice, picker.kept],
        api_visibility="private",
    )
    load = ctx.admitted(on_load, request_only, gpu=False)
    demo.load(load, [picker.choice, picker.kept], [*outputs, picker.choice], api_visibility="private")


MAX_KEPT = 8  # trained models' values a browser keeps (a public server deletes them after an hour anyway)


def _read(kept: object) -> tuple[list[str], str | None]:
    """The trained models' values and the last choice in the browser's storage, checked (the browser is the
    client's: anything may come back)."""
    kept = kept if isinstance(kept, dict) else {}
    trained = kept.get("trained") if isinstance(kept.get("trained"), list) else []
    last = kept.get("choice")
    values = [v for v in trained[:MAX_KEPT] if isinstance(v, str) and v.startswith(PRIVATE_PREFIX) and len(v) < 64]
    return values, last if isinstance(last, str) and len(last) < 512 else None


def _kept(kept: object, choice: str) -> dict:
    """The browser's storage after ``choice`` loaded: it, and the models trained here among the choices so far."""
    trained, _ = _read(kept)
    if choice.startswith(PRIVATE_PREFIX) and choice not in trained:
        trained = [*trained, choice][-MAX_KEPT:]
    return {"choice": choice, "trained": trained}


def _session(request: gr.Request | None) -> str | None:
    """The page's session (whose trained models a public server lists for it alone)."""
    return getattr(request, "session_hash", None)
