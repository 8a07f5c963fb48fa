"""The patch explorer: where one patch attends, layer by layer and head by head, and its attention rollout.

A point on the upload (in the upload's own pixels) is mapped into the eval crop, the region the model saw
(``transform.crop_box``), then to the token whose cell of the model input contains it. Token cells are
``feature_stride`` pixels of the input: the patch size for a plain ViT, the CNN's stride times the patch
size for hybrids (whose last row and column may be partly padding: the grid is rounded up). Prefix tokens
(a class token, if any) are not patches: they are left out of the rows shown, as in ``vit_core.explain``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from vit_core import explain

from . import render
from .analysis import Analysis
from .settings import Settings, head_name, layer_name

SIDE = 320  # long side of the explorer's overlays, in pixels
TILE = 144  # long side of one head's tile
VIEW_SIDE = 720  # long side of the picture to click on


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
    """A pixel of the explorer's picture (``view``) to a point of the upload, in its own pixels."""
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


def view(a: Analysis, patch: Patch | None = None) -> Image.Image:
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


def explore(a: Analysis, patch: Patch, s: Settings) -> tuple[Image.Image, Image.Image, Image.Image, str]:
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
