"""The Inspect tab: the paper's figure 7 for the loaded model (filters, position-embedding similarity, mean
attention distance over the example photos) and a summary of what it is (``webapp.inference.model_info``); ``/inspect``.
Another model clears them (``fresh``)."""

from __future__ import annotations

import gradio as gr
import torch
from PIL import Image

from vit_core.data import load_image

from ..inference import estimates, model_info
from ..registry.catalog import EXAMPLES
from ..resources import MB
from ..ui.controls import figure
from ..ui.declarations import Api, Clear, Event, Page, Shown, Tab, problem_last
from ..ui.endpoints import Context, Prepared, api

TITLE = "Inspect"
FIGURE_BYTES = 64 * MB  # the tab's matplotlib figures
FIGURE_7 = """What this model learned, drawn as in the ViT paper's figure 7, and below, what the model is:
- **Embedding filters**: what the first layer looks for in each patch (the main patterns of its filters).
- **Position embedding similarity**: which positions the model learned as near each other (each small square is one
  patch position, bright where another position's embedding resembles its own).
- **Mean attention distance**: how far each head looks, by depth (the average distance in pixels between a patch
  and the patches it attends to; one dot per head)."""


def estimate(ctx: Context, request: Prepared) -> int:
    """The figures, and on a CPU a forward pass of the example photos."""
    model, _ = ctx.loaded(request)
    cpu = model is not None and ctx.device.type == "cpu"
    work = estimates.forward_bytes(model.config, len(EXAMPLES)) + FIGURE_BYTES if cpu else 0
    return estimates.REQUEST_BYTES + work


def _inspect(ctx: Context, request: Prepared) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The paper's figure 7 for the loaded model (filters, position-embedding similarity, mean attention
    distance over the example images) and a summary of what it is."""
    model, transform, _ = ctx.model(request)
    images = torch.stack([transform(load_image(p)) for p in EXAMPLES])
    figs = model_info.inspect_figures(model, images, ctx.device)
    return *figs, model_info.summary(model, ctx.models.folder_of(request.choice(ctx.models)))


inspect_model = api(_inspect, ("model_choice",))  # not "inspect": the module and the standard library have that name
GROUP = "inspect"
BLANK = (None, None, None, "")


def build(ctx: Context, page: Page) -> Tab:
    """The button, the three figures and the summary."""
    picker = page.picker
    gr.Markdown(FIGURE_7, elem_classes="legend")
    button = gr.Button("Analyse model")
    with gr.Row():
        # labels name the API outputs; each figure has its own title
        filters = figure("Embedding filters", "fig-filters")
        similarity = figure("Position embedding similarity", "fig-similarity")
        distance = figure("Mean attention distance", "fig-distance")
    summary = gr.Markdown(label="Model summary", elem_id="summary")
    outputs = [filters, similarity, distance, summary]
    model = ("model_choice", "model_choice")  # the results are about the model alone
    shown = Shown(
        _inspect, estimate, {"model_choice": picker.active}, outputs, problem_last(BLANK), GROUP, subject=model
    )
    active = (picker.active, picker.active)
    return Tab(
        apis=[Api("inspect", inspect_model, [picker.choice], outputs, estimate)],
        clears=[Clear("new model", [picker.active.change], [GROUP], active, lambda _: BLANK, outputs)],
        events=[Event("inspect_page", shown, triggers=[button.click])],
    )
