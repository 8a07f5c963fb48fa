"""The Explore tab: click a patch of the image to see where it attends, layer by layer and head by head, and its
attention rollout (``webapp.explorer``); ``/explore`` is the API, with the point in image pixels.

A click sets the point (x, y, in the image's pixels); a change of the point or of a setting redraws the maps
(``redraw``); a new image or model clears the point and draws the picture to click (``picture``). Each answers
the page's newest request only (``fresh``)."""

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
from . import fresh
from .classify import ClassifyTab, head_choices, layer_range
from .context import Context
from .inputs import CheckedDropdown
from .picker import Picker

GROUP = "explore"
POINT = "explore point"
HINT = "Click a patch inside the bright region."
OUTSIDE = "That point is outside the region the model saw: click inside the bright region."


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
    patches at ``layer`` (from 0, the first; negative from the end) for ``head`` (from 0, or the mean), its
    attention-rollout row, every head of that layer, and a sentence. The patch is outlined on each map."""
    a = ctx.analysis(image, model_choice)
    s = parse_settings(
        a.model, layer=layer, head=head, head_fusion=head_fusion, discard_ratio=discard_ratio, opacity=opacity
    )
    patch = explorer.patch_at(a, float(x), float(y))
    if patch is None:
        raise ValueError(f"({x:g}, {y:g}) is outside the region the model saw; pick a point inside it")
    return explorer.explore(a, patch, s)


def picture(ctx: Context, image: str | None, model_choice: str, ticket: float | None, request: gr.Request) -> tuple:
    """After a new image or model: the picture to click, no point, no maps (an error in place of the text)."""
    empty = (None, None, None, None, None)  # x, y and the three maps

    def compute() -> tuple:
        return view(ctx, image, model_choice), *empty, HINT if image is not None else ""

    subject, held = fresh.subject_of(image, model_choice), ctx.held("view", image=image, model_choice=model_choice)
    return fresh.answer(request, GROUP, ticket, subject, 7, compute, lambda e: (None, *empty, fresh.problem(e)), held)


def point(
    ctx: Context, image: str | None, model_choice: str, ticket: float | None, evt: gr.SelectData, request: gr.Request
):
    """A click on the picture: its pixels to the upload's (x, y), which ``redraw`` then follows."""

    def compute() -> tuple:
        if image is None or evt.index is None:
            return gr.skip(), gr.skip()
        x, y = explorer.from_view(ctx.analysis(image, model_choice), *evt.index)
        return round(x, 1), round(y, 1)

    subject, held = fresh.subject_of(image, model_choice), ctx.held("view", image=image, model_choice=model_choice)
    return fresh.answer(request, POINT, ticket, subject, 2, user_errors(compute), lambda e: (gr.skip(),) * 2, held)


def redraw(
    ctx: Context,
    image: str | None,
    model_choice: str,
    x: float | None,
    y: float | None,
    layer: int,
    head: str,
    head_fusion: str,
    discard_ratio: float,
    opacity: float,
    ticket: float | None,
    request: gr.Request,
) -> tuple:
    """The chosen patch's maps and the picture with it outlined, for the point and settings on screen; the
    reason in place of the maps when the point is outside the region the model saw, or the request fails.
    Nothing to do before a point is chosen (``picture`` drew the page then)."""
    if image is None or x is None or y is None:
        return (gr.skip(),) * 5

    def compute() -> tuple:
        a = ctx.analysis(image, model_choice)
        patch = explorer.patch_at(a, float(x), float(y))
        if patch is None:
            return explorer.view(a), None, None, None, OUTSIDE
        shown = explore(ctx, image, model_choice, x, y, layer, head, head_fusion, discard_ratio, opacity)
        return explorer.view(a, patch), *shown

    def failed(message: str) -> tuple:
        return gr.skip(), None, None, None, fresh.problem(message)

    subject, held = fresh.subject_of(image, model_choice), ctx.held("explore", image=image, model_choice=model_choice)
    return fresh.answer(request, GROUP, ticket, subject, 5, user_errors(compute), failed, held)


@dataclass
class ExploreTab:
    """The tab's layer and head controls, which follow the loaded model."""

    layer: gr.Slider
    head: gr.Dropdown

    @property
    def fitted(self) -> list[gr.components.Component]:
        return [self.layer, self.head]

    def fit(self, model: VisionTransformer, device: torch.device) -> list:
        return [gr.Slider(**layer_range(model, "Layer")), gr.Dropdown(choices=head_choices(model), value="mean")]


def build(ctx: Context, picker: Picker, classify: ClassifyTab) -> ExploreTab:
    """The picture to click, its layer and head, the point clicked; the patch's maps. Head fusion, discard
    ratio and opacity are the Classify tab's."""
    gr.Markdown(
        "Click a patch inside the bright region (what the model saw) to see where that patch "
        "attends at one layer and head, its attention rollout, and every head of the layer. "
        "Layers and heads are numbered from 0."
    )
    with gr.Row():
        with gr.Column():
            view_image = gr.Image(
                type="pil",
                label="Click a patch",
                show_label=False,
                interactive=False,
                elem_id="view",
                elem_classes="figure",
            )
            with gr.Row():
                layer = gr.Slider(step=1, **layer_range(picker.model, "Layer"))
                head = CheckedDropdown(head_choices(picker.model), value="mean", allow_custom_value=True, label="Head")
            with gr.Row():
                point_x = gr.Number(label="x (image pixels)", precision=1, elem_id="point-x")
                point_y = gr.Number(label="y (image pixels)", precision=1, elem_id="point-y")
        with gr.Column():
            patch_text = gr.Textbox(label="Selected patch", lines=2, interactive=False, elem_id="patch-text")
            # no labels drawn over the maps: their colour bars and titles say what they show
            with gr.Row():
                patch_attention = gr.Image(
                    type="pil",
                    label="Its attention (layer, head)",
                    show_label=False,
                    elem_id="patch-attention",
                    elem_classes="figure",
                )
                patch_rollout = gr.Image(
                    type="pil",
                    label="Its attention rollout",
                    show_label=False,
                    elem_id="patch-rollout",
                    elem_classes="figure",
                )
            heads_grid = gr.Image(
                type="pil",
                label="Every head of the layer",
                show_label=False,
                elem_id="heads-grid",
                elem_classes="figure",
            )

    image, active = classify.image, picker.active
    maps = [patch_attention, patch_rollout, heads_grid, patch_text]
    cleared = fresh.on_change(
        [image.change, active.change],
        [GROUP, POINT],
        [image, active],
        lambda _: (None, None, None, None, None, None, ""),
        [view_image, point_x, point_y, *maps],
    )
    fresh.then(
        cleared,
        ctx.handler(picture, None),
        [image, active],
        [view_image, point_x, point_y, *maps],
        concurrency_id=COMPUTE,
        api_name="explore_picture",
    )
    clicked = fresh.listen(
        [view_image.select],
        ctx.handler(point, None),
        [image, active],
        [point_x, point_y],
        show_progress="hidden",
        concurrency_id=COMPUTE,
        api_name="explore_point",
    )
    settings = [layer, head, classify.head_fusion, classify.discard, classify.opacity]
    inputs, outputs = [image, active, point_x, point_y, *settings], [view_image, *maps]
    # redrawn after a click, a typed point or a setting; not on the point's `change`, which clearing it fires too
    redrawn = ctx.handler(redraw, None)
    fresh.then(
        clicked,
        redrawn,
        inputs,
        outputs,
        show_progress="hidden",
        concurrency_id=COMPUTE,
        api_name="explore_clicked",
    )
    fresh.listen(
        [
            point_x.submit,
            point_y.submit,
            layer.release,
            head.input,
            classify.head_fusion.input,
            classify.discard.release,
            classify.opacity.release,
        ],
        redrawn,
        inputs,
        outputs,
        show_progress="hidden",
        concurrency_id=COMPUTE,
        api_name="explore_page",
    )
    api_settings = [classify.api_layer, head, classify.head_fusion, classify.discard, classify.opacity]
    gr.on(
        [],
        ctx.handler(explore, "explore"),
        [image, picker.choice, point_x, point_y, *api_settings],
        maps,
        api_name="explore",
        concurrency_id=COMPUTE,
    )
    return ExploreTab(layer, head)
