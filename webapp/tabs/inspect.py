"""The Inspect tab: the paper's figure 7 for the loaded model (filters, position-embedding similarity, mean
attention distance over the example photos) and a summary of what it is (``webapp.model_info``); ``/inspect``.
Another model clears them (``fresh``)."""

from __future__ import annotations

import gradio as gr
import torch
from PIL import Image

from vit_core.data import load_image

from .. import estimates, model_info
from ..admission import COMPUTE, MB
from ..catalog import BUNDLED_LABEL
from ..errors import user_errors
from ..ui import fresh
from ..ui.context import EXAMPLES, Context
from ..ui.picker import Page

TITLE = "Inspect"
FIGURE_BYTES = 64 * MB  # the tab's matplotlib figures
FIGURE_7 = """What this model learned, drawn as in the ViT paper's figure 7, and below, what the model is:
- **Embedding filters**: what the first layer looks for in each patch (the main patterns of its filters).
- **Position embedding similarity**: which positions the model learned as near each other (each small square is one
  patch position, bright where another position's embedding resembles its own).
- **Mean attention distance**: how far each head looks, by depth (the average distance in pixels between a patch
  and the patches it attends to; one dot per head)."""


def estimate(ctx: Context, arguments: dict) -> int:
    """The figures, and on a CPU a forward pass of the example photos."""
    model, _ = estimates.model_of(ctx.models.loaded, arguments.get("model_choice"))
    cpu = model is not None and ctx.device.type == "cpu"
    work = estimates.forward_bytes(model.config, len(EXAMPLES)) + FIGURE_BYTES if cpu else 0
    return estimates.REQUEST_BYTES + work


@user_errors
def inspect(ctx: Context, model_choice: str = BUNDLED_LABEL) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The paper's figure 7 for the loaded model (filters, position-embedding similarity, mean attention
    distance over the example images) and a summary of what it is."""
    model, transform = ctx.models.get(model_choice)
    images = torch.stack([transform(load_image(p)) for p in EXAMPLES])
    figs = model_info.inspect_figures(model, images, ctx.device)
    return *figs, model_info.summary(model, ctx.models.folder_of(model_choice))


GROUP = "inspect"
BLANK = (None, None, None, "")


def show(ctx: Context, model_choice: str, ticket: float | None, request: gr.Request) -> tuple:
    """``inspect`` for the model in use; an error in place of the summary."""
    subject = fresh.subject_of(model_choice, model_choice)

    def failed(message: str) -> tuple:
        return *BLANK[:3], fresh.problem(message)

    held = ctx.held(estimate, model_choice=model_choice)
    return fresh.answer(request, GROUP, ticket, subject, len(BLANK), lambda: inspect(ctx, model_choice), failed, held)


def build(ctx: Context, page: Page) -> None:
    """The button, the three figures and the summary."""
    picker = page.picker
    gr.Markdown(FIGURE_7, elem_classes="legend")
    button = gr.Button("Analyse model")
    with gr.Row():
        # labels name the API outputs; each figure has its own title
        filters = gr.Image(label="Embedding filters", show_label=False, elem_id="fig-filters", elem_classes="figure")
        similarity = gr.Image(
            label="Position embedding similarity", show_label=False, elem_id="fig-similarity", elem_classes="figure"
        )
        distance = gr.Image(
            label="Mean attention distance", show_label=False, elem_id="fig-distance", elem_classes="figure"
        )
    summary = gr.Markdown(label="Model summary", elem_id="summary")
    outputs = [filters, similarity, distance, summary]
    fresh.listen(
        [button.click],
        ctx.handler(show, None),
        [picker.active],
        outputs,
        concurrency_id=COMPUTE,
        api_name="inspect_page",
    )
    fresh.on_change([picker.active.change], [GROUP], [picker.active, picker.active], lambda _: BLANK, outputs)
    gr.on([], ctx.handler(inspect, estimate), [picker.choice], outputs, api_name="inspect", concurrency_id=COMPUTE)
