"""The Explore tab: click a patch of the image to see where it attends, layer by layer and head by head, and its
attention rollout; ``/explore`` is the API, with the point in image pixels.

A click sets the point (x, y, in the image's pixels); a change of the point or of a setting redraws the maps
(``redraw``); a new image or model clears the point and draws the picture to click (``picture``). Each answers
the page's newest request only (``fresh``).

The computation: a point on the upload (in the upload's own pixels) is mapped into the eval crop, the region the
model saw (``transform.crop_box``), then to the token whose cell of the model input contains it (``patch_at``).
Token cells are ``feature_stride`` pixels of the input: the patch size for a plain ViT, the CNN's stride times
the patch size for hybrids (whose last row and column may be partly padding: the grid is rounded up). Prefix
tokens (a class token, if any) are not patches: they are left out of the rows shown, as in ``vit_core.explain``.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import torch
from PIL import Image

from vit_core import VisionTransformer, explain, methods

from ..inference import estimates, render
from ..inference.analysis import Analysis, declared
from ..inference.settings import Settings, head_name, layer_name
from ..ui.controls import figure, head_choices, layer_range
from ..ui.declarations import Api, Clear, Event, Page, Shown, Tab, problem_last
from ..ui.endpoints import Context, Prepared, api, problem
from ..ui.inputs import CheckedDropdown

TITLE = "Explore"
GROUP = "explore"
POINT = "explore point"
HINT = "Click a patch inside the bright region."
OUTSIDE = "That point is outside the region the model saw: click inside the bright region."


SIDE = 320  # long side of the explorer's overlays, in pixels
TILE = 144  # long side of one head's tile
VIEW_SIDE = 720  # long side of the picture to click on
# Drawing, per pixel of the reduced image: the 720-pixel picture to click, the 320-pixel crops of a patch's maps
# (measured 2 and 5).
VIEW_DRAW_BYTES, DRAW_BYTES = 4, 8


@dataclass(frozen=True)
class Patch:
    """A token of the model's grid, and the part of the model input it covers."""

    row: int
    col: int
    grid: tuple[int, int]
    token: int  # index among all tokens, prefix tokens included
    cell: tuple[float, float, float, float]  # (left, top, right, bottom) as fractions of the input

    def describe(self) -> str:
        return f"row {self.row + 1}, column {self.col + 1} of the {self.grid[0]}x{self.grid[1]} token grid"


def patch_at(a: Analysis, x: float, y: float) -> Patch | None:
    """The token under the point (``x``, ``y``) of the upload, in its own pixels; None outside the region
    the model saw."""
    left, top, right, bottom = a.crop
    fx, fy = (x - left) / (right - left), (y - top) / (bottom - top)
    if not (0.0 <= fx <= 1.0 and 0.0 <= fy <= 1.0):
        return None
    h, w = a.x.shape[-2:]
    stride = a.model.config.feature_stride
    gh, gw = a.grid
    row, col = min(int(fy * h // stride), gh - 1), min(int(fx * w // stride), gw - 1)
    cell = (col * stride / w, row * stride / h, min((col + 1) * stride, w) / w, min((row + 1) * stride, h) / h)
    return Patch(row, col, (gh, gw), a.model.num_prefix_tokens + row * gw + col, cell)


def from_view(a: Analysis, x: float, y: float) -> tuple[float, float]:
    """A pixel of the explorer's picture (``clickable``) to a point of the upload, in its own pixels."""
    w, h = render.fit(a.shown.size, VIEW_SIDE)
    return (x + 0.5) * a.size[0] / w, (y + 0.5) * a.size[1] / h


def attention_row(a: Analysis, patch: Patch, layer: int, head: int | None) -> torch.Tensor:
    """(grid_h, grid_w): the patch's attention probabilities over the patches at ``layer``, one head or the mean."""
    attn = a.attentions[layer][0]
    row = (attn.mean(dim=0) if head is None else attn[head])[patch.token]
    return row[a.model.num_prefix_tokens :].reshape(patch.grid)


def rollout_row(a: Analysis, patch: Patch, head_fusion: str, discard_ratio: float) -> torch.Tensor:
    """(grid_h, grid_w): the patch's row of the attention rollout ``Â_L ... Â_1``, divided by its maximum:
    ``explain.rollout`` carried from this patch's token instead of the read-out row."""
    prefix = a.model.num_prefix_tokens
    v = torch.zeros(1, a.attentions[0].shape[-1])
    v[0, patch.token] = 1.0
    row = explain.rollout(a.attentions, v, prefix, head_fusion, discard_ratio)[0, prefix:].reshape(patch.grid)
    return row / row.max().clamp_min(torch.finfo(row.dtype).tiny)


def clickable(a: Analysis, patch: Patch | None = None) -> Image.Image:
    """The upload to click on: dimmed outside the region the model saw, its token grid drawn, the chosen
    patch outlined."""
    img = render.dim_outside(a.shown, a.box, VIEW_SIDE, a.grid)
    if patch is not None:
        scale = img.width / a.size[0]
        left, top, right, bottom = a.crop
        cw, ch = right - left, bottom - top
        l, t, r, b = patch.cell
        render.outline(
            img, ((left + l * cw) * scale, (top + t * ch) * scale, (left + r * cw) * scale, (top + b * ch) * scale)
        )
    return render.unique(img, "explorer view")


def patch_maps(a: Analysis, patch: Patch, s: Settings) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The patch's attention row at ``s.layer`` / ``s.head``, its rollout row, a grid of every head's row at
    that layer, and a sentence saying what they show."""
    heads = a.model.config.num_heads
    layer, head = layer_name(s.layer, a.model.config.depth), head_name(s.head)
    attention = attention_row(a, patch, s.layer, s.head)
    first = render.map_on_crop(a.shown, a.box, attention, s.opacity, SIDE, f"attention, {layer}, {head}", patch.cell)
    rollout = rollout_row(a, patch, s.head_fusion, s.discard_ratio)
    second = render.map_on_crop(a.shown, a.box, rollout, s.opacity, SIDE, "rollout", patch.cell)
    tiles = [
        render.with_colorbar(render.map_on_crop(a.shown, a.box, row, s.opacity, TILE, patch=patch.cell), row, "")
        for row in (attention_row(a, patch, s.layer, h) for h in range(heads))
    ]
    grid = render.tile_grid(tiles, [head_name(h) for h in range(heads)], columns=min(heads, 4))
    grid = render.titled(grid, [f"Every head of {layer}"])
    gw = patch.grid[1]
    top = int(attention.flatten().argmax())
    text = (
        f"Patch at {patch.describe()}. At {layer}, {head}, it attends most to row {top // gw + 1}, "
        f"column {top % gw + 1} ({float(attention.max()):.0%} of its attention)."
    )
    return (
        render.unique(first, "patch attention"),
        render.unique(second, "patch rollout"),
        render.unique(grid, "heads"),
        text,
    )


def estimate_view(ctx: Context, request: Prepared) -> int:
    """The picture to click, or a click: the upload decoded, its analysis, a 720-pixel picture."""
    return _estimate(ctx, request, VIEW_DRAW_BYTES)


def estimate(ctx: Context, request: Prepared) -> int:
    """A patch's maps: the analysis, and 320-pixel crops."""
    return _estimate(ctx, request, DRAW_BYTES)


def _estimate(ctx: Context, request: Prepared, draw: int) -> int:
    model, transform = ctx.loaded(request)
    cpu = model is not None and ctx.device.type == "cpu"
    work = estimates.analysis_bytes(model.config) if cpu else 0
    return estimates.image_request(declared(request.values.get("image")), transform, draw, work)


def _explore(ctx: Context, request: Prepared) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The patch under the point (x, y) of the image, in the image's own pixels: its attention over the
    patches at a layer (from 0, the first; negative from the end) for a head (from 0, or the mean), its
    attention-rollout row, every head of that layer, and a sentence. The patch is outlined on each map."""
    a = ctx.analysis(request)
    s = request.checked(a.model, methods.METHODS[0])
    x, y = request["x"], request["y"]
    patch = patch_at(a, float(x), float(y))
    if patch is None:
        raise ValueError(f"({x:g}, {y:g}) is outside the region the model saw; pick a point inside it")
    return patch_maps(a, patch, s)


SETTINGS = ("layer", "head", "head_fusion", "discard_ratio", "opacity")  # the API's, after the point
explore = api(_explore, ("image", "model_choice", "x", "y", *SETTINGS))
EMPTY = (None, None, None, None, None)  # x, y and the three maps


def picture(ctx: Context, request: Prepared) -> tuple:
    """After a new image or model: the picture to click, no point, no maps."""
    image = request["image"]
    shown = None if image is None else clickable(ctx.analysis(request))
    return shown, *EMPTY, HINT if image is not None else ""


def point(ctx: Context, request: Prepared) -> tuple:
    """A click on the picture: its pixels to the upload's (x, y), which ``redraw`` then follows."""
    if request["image"] is None or request.event.index is None:
        return gr.skip(), gr.skip()
    x, y = from_view(ctx.analysis(request), *request.event.index)
    return round(x, 1), round(y, 1)


def redraw(ctx: Context, request: Prepared) -> tuple:
    """The chosen patch's maps and the picture with it outlined, for the point and settings on screen; the
    reason in place of the maps when the point is outside the region the model saw."""
    a = ctx.analysis(request)
    patch = patch_at(a, float(request["x"]), float(request["y"]))
    if patch is None:
        return clickable(a), None, None, None, OUTSIDE
    return clickable(a, patch), *patch_maps(a, patch, request.checked(a.model, methods.METHODS[0]))


def pointed(request: Prepared) -> bool:
    """Whether there is a point to draw (before one is chosen, ``picture`` drew the page)."""
    return request["image"] is not None and request["x"] is not None and request["y"] is not None


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


def build(ctx: Context, page: Page) -> Tab:
    """The picture to click, its layer and head, the point clicked; the patch's maps. Head fusion, discard
    ratio and opacity are the page's (``Controls``)."""
    picker, c = page.picker, page.controls
    gr.Markdown(
        "Click a patch inside the bright region (what the model saw) to see where that patch "
        "attends at one layer and head, its attention rollout, and every head of the layer. "
        "Layers and heads are numbered from 0."
    )
    with gr.Row():
        with gr.Column():
            view_image = figure("Click a patch", "view", interactive=False)
            with gr.Row():
                # wide enough for its label and number box beside each other: a row of its own on phones
                layer = gr.Slider(step=1, min_width=260, elem_id="explore-layer", **layer_range(picker.model, "Layer"))
                head = CheckedDropdown(head_choices(picker.model), value="mean", allow_custom_value=True, label="Head")
            with gr.Row():
                point_x = gr.Number(label="x (image pixels)", precision=1, elem_id="point-x")
                point_y = gr.Number(label="y (image pixels)", precision=1, elem_id="point-y")
        with gr.Column():
            patch_text = gr.Textbox(label="Selected patch", lines=2, interactive=False, elem_id="patch-text")
            # their colour bars and titles say what they show
            with gr.Row():
                patch_attention = figure("Its attention (layer, head)", "patch-attention")
                patch_rollout = figure("Its attention rollout", "patch-rollout")
            heads_grid = figure("Every head of the layer", "heads-grid")

    image, active = c.image, picker.active
    maps = [patch_attention, patch_rollout, heads_grid, patch_text]
    subject, hidden = {"image": image, "model_choice": active}, {"show_progress": "hidden"}
    drawn = Shown(
        picture, estimate_view, subject, [view_image, point_x, point_y, *maps], problem_last((None, *EMPTY, "")), GROUP
    )
    clicked = Shown(point, estimate_view, subject, [point_x, point_y], _no_point, POINT, select=True, options=hidden)
    settings = {"layer": layer, "head": head, **c.named("head_fusion", "discard_ratio", "opacity")}
    inputs = {**subject, "x": point_x, "y": point_y, **settings}
    maps_drawn = Shown(redraw, estimate, inputs, [view_image, *maps], _no_maps, GROUP, ready=pointed, options=hidden)
    # redrawn after a click, a typed point or a setting; not on the point's `change`, which clearing it fires too
    triggers = [point_x.submit, point_y.submit, layer.release, head.input, c.head_fusion.input]
    triggers += [c.discard_ratio.release, c.opacity.release]
    api_inputs = [image, picker.choice, point_x, point_y, c.api_layer, *list(settings.values())[1:]]
    cleared = (None, None, None, None, None, None, "")
    return Tab(
        apis=[Api("explore", explore, api_inputs, maps, estimate)],
        clears=[
            Clear(
                "new input",
                [image.change, active.change],
                [GROUP, POINT],
                (image, active),
                lambda _: cleared,
                [view_image, point_x, point_y, *maps],
            )
        ],
        events=[
            Event("explore_picture", drawn, after="new input"),
            Event("explore_point", clicked, triggers=[view_image.select]),
            Event("explore_clicked", maps_drawn, after="explore_point"),
            Event("explore_page", maps_drawn, triggers=triggers),
        ],
        fitted=ExploreTab(layer, head),
    )


def _no_point(message: str) -> tuple:
    return gr.skip(), gr.skip()


def _no_maps(message: str) -> tuple:
    return gr.skip(), None, None, None, problem(message)
