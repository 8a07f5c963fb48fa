"""The Explore patches tab: click a patch of the image to see where it attends, layer by layer and head by head,
and its attention rollout (``webapp.explorer``); ``/explore`` is the API, with the point in image pixels."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import torch
from PIL import Image

from vit_core import VisionTransformer

from .. import explorer
from ..admission import COMPUTE
from ..catalog import BUNDLED_LABEL
from ..errors import user_errors
from ..settings import parse_settings
from .classify import ClassifyTab, head_choices
from .context import Context
from .inputs import CheckedDropdown
from .picker import Picker


@user_errors
def view(ctx: Context, image: str | None, model_choice: str) -> Image.Image | None:
    """The upload to click on: the region the model saw bright, its token grid drawn."""
    return None if image is None else explorer.view(ctx.analysis(image, model_choice))


@user_errors
def explore(
    ctx: Context,
    image: str | None,
    model_choice: str = BUNDLED_LABEL,
    x: float = 0.0,
    y: float = 0.0,
    layer: int = -1,
    head: str = "mean",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    opacity: float = 0.5,
) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The patch under the point (x, y) of the image, in the image's own pixels: its attention over the
    patches at ``layer`` for ``head`` (or the mean), its attention-rollout row, every head of that layer,
    and a sentence. The patch is outlined on each map."""
    a = ctx.analysis(image, model_choice)
    s = parse_settings(
        a.model, layer=layer, head=head, head_fusion=head_fusion, discard_ratio=discard_ratio, opacity=opacity
    )
    patch = explorer.patch_at(a, float(x), float(y))
    if patch is None:
        raise ValueError(f"({x:g}, {y:g}) is outside the region the model saw; pick a point inside it")
    return explorer.explore(a, patch, s)


@user_errors
def on_select(ctx: Context, image, model_choice, layer, head, head_fusion, discard_ratio, opacity, evt: gr.SelectData):
    """A click on the explorer's picture: its pixels to the upload's, then ``explore``; the view is redrawn
    with the patch outlined."""
    if image is None or evt.index is None:
        return (gr.skip(),) * 7
    a = ctx.analysis(image, model_choice)
    x, y = explorer.from_view(a, *evt.index)
    patch = explorer.patch_at(a, x, y)
    if patch is None:
        gr.Warning("That point is outside the region the model saw: click inside the bright region.")
        return (gr.skip(),) * 7
    shown = explore(ctx, image, model_choice, x, y, layer, head, head_fusion, discard_ratio, opacity)
    return explorer.view(a, patch), round(x, 1), round(y, 1), *shown


def re_explore(ctx: Context, image, model_choice, x, y, *settings):
    """Live explorer controls: redraw the last clicked patch with the new layer or head."""
    if image is None or x is None or y is None:
        return (gr.skip(),) * 4
    return explore(ctx, image, model_choice, x, y, *settings)


@dataclass
class ExploreTab:
    """The tab's layer and head controls, which follow the loaded model."""

    layer: gr.Slider
    head: gr.Dropdown

    @property
    def fitted(self) -> list[gr.components.Component]:
        return [self.layer, self.head]

    def fit(self, model: VisionTransformer, device: torch.device) -> list:
        depth = model.config.depth
        return [
            gr.Slider(minimum=-depth, maximum=depth - 1, value=-1, step=1),
            gr.Dropdown(choices=head_choices(model), value="mean"),
        ]


def build(ctx: Context, picker: Picker, classify: ClassifyTab) -> ExploreTab:
    """The picture to click, its layer and head, the point clicked; the patch's maps. Head fusion, discard
    ratio and opacity are the Classify tab's."""
    depth = picker.model.config.depth
    gr.Markdown(
        "Click a patch inside the bright region (what the model saw) to see where that patch "
        "attends at one layer and head, its attention rollout, and every head of the layer."
    )
    with gr.Row():
        with gr.Column():
            picture = gr.Image(type="pil", label="Click a patch", interactive=False, elem_id="view")
            with gr.Row():
                layer = gr.Slider(-depth, depth - 1, value=-1, step=1, label="Layer (-1 = last)")
                head = CheckedDropdown(head_choices(picker.model), value="mean", allow_custom_value=True, label="Head")
            with gr.Row():
                point_x = gr.Number(label="x (image pixels)", precision=1)
                point_y = gr.Number(label="y (image pixels)", precision=1)
        with gr.Column():
            patch_text = gr.Textbox(label="Selected patch", lines=2, interactive=False, elem_id="patch-text")
            with gr.Row():
                patch_attention = gr.Image(type="pil", label="Its attention (layer, head)", elem_id="patch-attention")
                patch_rollout = gr.Image(type="pil", label="Its attention rollout", elem_id="patch-rollout")
            heads_grid = gr.Image(type="pil", label="Every head of the layer", elem_id="heads-grid")

    settings = [layer, head, classify.head_fusion, classify.discard, classify.opacity]
    outputs = [patch_attention, patch_rollout, heads_grid, patch_text]
    image = classify.image
    gr.on(
        [image.change, picker.active.change],
        ctx.handler(view, "view"),
        [image, picker.choice],
        picture,
        api_visibility="private",
        concurrency_id=COMPUTE,
    )
    picture.select(
        ctx.handler(on_select, "explore"),
        [image, picker.choice, *settings],
        [picture, point_x, point_y, *outputs],
        api_visibility="private",
        trigger_mode="always_last",
        concurrency_id=COMPUTE,
    )
    inputs = [image, picker.choice, point_x, point_y, *settings]
    gr.on(
        [point_x.submit, point_y.submit],
        ctx.handler(explore, "explore"),
        inputs,
        outputs,
        api_name="explore",
        concurrency_id=COMPUTE,
    )
    gr.on(
        [layer.release, head.input],
        ctx.handler(re_explore, "explore"),
        inputs,
        outputs,
        api_visibility="private",
        trigger_mode="always_last",
        show_progress="hidden",
        concurrency_id=COMPUTE,
    )
    return ExploreTab(layer, head)
