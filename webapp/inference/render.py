"""Pictures for the app's views: maps over the region the model saw, colour bars, patch outlines, head grids.

Everything is drawn with PIL (no matplotlib figure per request): an explorer click draws a handful of small
images, and each costs a few milliseconds this way, so a click stays about as fast as a plain classify.
The colours are ``vit_core.figures.overlay``'s, so a map looks the same in every view and in the library.
"""

from __future__ import annotations

import uuid
from functools import lru_cache

import numpy as np
import torch
from matplotlib import colormaps
from PIL import Image, ImageDraw, ImageFont

from vit_core import figures

Box = tuple[int, int, int, int]  # (left, top, right, bottom) in pixels

COLORMAP = "jet"
OUTLINE = (255, 255, 255)
SHADOW = (0, 0, 0)
IMAGE_DESCRIPTION = 0x010E  # EXIF tag
MIN_SIDE = 256  # smaller images are shown enlarged: a map over an 8-pixel image is not an 8-pixel speck
# A map whose range is below this share of its largest magnitude is flat: stretched to the full colour range,
# its colours would show float rounding (Chefer et al.'s map once spanned 0.99990 to 1 and was drawn as a map)
FLAT = 1e-4
FLAT_LABEL = f"flat map: range < {FLAT:.2%}"


@lru_cache(maxsize=16)
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def range_labels(lo: float, hi: float) -> tuple[str, str]:
    """The two ends of a map's range, with as many decimals as it takes to tell them apart (up to 6): a nearly
    flat map (gradient rollout's can span 0.1%) reads "0.9991 … 1.0000", not "1.00 … 1.00"; values under
    0.01 keep two significant digits ("0.0014")."""
    for decimals in range(2, 7):
        labels = tuple(f"{v:.2g}" if 0 < abs(v) < 0.01 else f"{v:.{decimals}f}" for v in (lo, hi))
        if labels[0] != labels[1]:
            break
    return labels


def is_flat(heat: torch.Tensor) -> bool:
    """Whether ``heat``'s range is below ``FLAT`` of its largest magnitude (an all-zero map is flat)."""
    lo, hi = float(heat.min()), float(heat.max())
    return hi - lo <= FLAT * max(abs(lo), abs(hi))


def bar_labels(heat: torch.Tensor) -> tuple[str, str]:
    """What the colour bar's two ends say: the map's range (``range_labels``), or for a flat map that it is flat
    and the value it holds."""
    lo, hi = float(heat.min()), float(heat.max())
    return (FLAT_LABEL, f"{hi:.4g}") if is_flat(heat) else range_labels(lo, hi)


def _coloured(image: Image.Image, heat: torch.Tensor, alpha: float) -> Image.Image:
    """``figures.overlay``, which stretches a map to the full colour range, except for a flat map: one colour."""
    return figures.overlay(image, torch.zeros_like(heat) if is_flat(heat) else heat, alpha=alpha, colormap=COLORMAP)


def outline(img: Image.Image, box: tuple[float, float, float, float], width: int = 2) -> Image.Image:
    """``img`` with ``box`` outlined in white over black, visible on any colour; drawn in place, returned."""
    draw = ImageDraw.Draw(img)
    l, t, r, b = (round(v) for v in box)
    draw.rectangle((l - width, t - width, r + width - 1, b + width - 1), outline=SHADOW, width=width)
    draw.rectangle((l, t, r - 1, b - 1), outline=OUTLINE, width=width)
    return img


@lru_cache(maxsize=32)
def _ramp(width: int, height: int, flat: bool) -> Image.Image:
    """The colour bar's colours, ``width`` x ``height``: the colormap across its width, or for a flat map
    (``is_flat``) the one colour it is drawn in. Made once for each size and shared: pasted, never drawn on."""
    ramp = colormaps[COLORMAP](np.zeros(width) if flat else np.linspace(0.0, 1.0, width))[None, :, :3]
    return Image.fromarray(np.round(np.repeat(ramp, height, axis=0) * 255).astype(np.uint8))


def colour_bar(width: int, heat: torch.Tensor, caption: str) -> Image.Image:
    """A horizontal colour bar ``width`` pixels wide, labelled with the map's smallest and largest values:
    ``figures.overlay`` stretches every map to the full colour range, so the ends say what the colours mean.
    A flat map (``is_flat``) is drawn in one colour, and its bar, that colour, says so (``bar_labels``)."""
    size = max(10, min(28, round(width / 32)))
    font = _font(size)
    bar_h, pad = max(6, size // 2), max(2, size // 4)
    strip = Image.new("RGB", (width, pad + bar_h + pad + size + pad), "white")
    strip.paste(_ramp(width, bar_h, is_flat(heat)), (0, pad))
    draw = ImageDraw.Draw(strip)
    y = pad + bar_h + pad
    lo, hi = bar_labels(heat)
    draw.text((1, y), lo, fill="black", font=font)
    draw.text((width - 1, y), hi, fill="black", font=font, anchor="ra")
    room = width - draw.textlength(lo, font=font) - draw.textlength(hi, font=font) - 4 * size
    if draw.textlength(caption, font=font) <= room:
        draw.text((width / 2, y), caption, fill="black", font=font, anchor="ma")
    return strip


def with_colorbar(img: Image.Image, heat: torch.Tensor, caption: str) -> Image.Image:
    """``img`` with its map's ``colour_bar`` below it."""
    strip = colour_bar(img.width, heat, caption)
    out = Image.new("RGB", (img.width, img.height + strip.height), "white")
    out.paste(img if img.mode == "RGB" else img.convert("RGB"), (0, 0))
    out.paste(strip, (0, img.height))
    return out


def map_on_image(shown: Image.Image, box: Box, heat: torch.Tensor, alpha: float, caption: str) -> Image.Image:
    """The whole image with ``heat`` blended over ``box``, the region the model saw (outlined), and a colour bar:
    drawn on one new picture (``shown`` is cached and shared between requests)."""
    strip = colour_bar(shown.width, heat, caption)
    out = Image.new("RGB", (shown.width, shown.height + strip.height), "white")
    if box == (0, 0, *shown.size):  # the model saw it all
        out.paste(_coloured(shown, heat, alpha), (0, 0))
    else:  # the part it did not see as it is, the part it saw coloured and outlined
        out.paste(shown if shown.mode == "RGB" else shown.convert("RGB"), (0, 0))
        out.paste(_coloured(shown.crop(box), heat, alpha), box[:2])
        outline(out, box, width=max(1, round(max(shown.size) / 300)))
    out.paste(strip, (0, shown.height))  # after the outline, which may reach below the image
    return out


def map_on_crop(
    shown: Image.Image,
    box: Box,
    heat: torch.Tensor,
    alpha: float,
    side: int,
    caption: str | None = None,
    patch: tuple[float, float, float, float] | None = None,
) -> Image.Image:
    """Only the region the model saw, scaled to ``side`` pixels on its long side, with ``heat`` blended over it,
    ``patch`` (fractions of the region: left, top, right, bottom) outlined, and a colour bar unless
    ``caption`` is None (the head grid labels its tiles instead)."""
    crop = shown.crop(box)
    scale = side / max(crop.size)
    crop = crop.resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))), Image.BILINEAR)
    out = _coloured(crop, heat, alpha)
    if patch is not None:
        l, t, r, b = patch
        outline(out, (l * out.width, t * out.height, r * out.width, b * out.height))
    return out if caption is None else with_colorbar(out, heat, caption)


def titled(img: Image.Image, lines: list[str]) -> Image.Image:
    """``img`` under a few centred lines of text: a title that stays with the picture when it is saved."""
    size = max(10, img.width // 22)
    font, gap = _font(size), max(2, size // 3)
    out = Image.new("RGB", (img.width, img.height + len(lines) * (size + gap) + gap), "white")
    draw = ImageDraw.Draw(out)
    for i, line in enumerate(lines):
        draw.text((img.width / 2, gap + i * (size + gap)), line, fill="black", font=font, anchor="ma")
    out.paste(img, (0, out.height - img.height))
    return out


def tile_grid(tiles: list[Image.Image], titles: list[str], columns: int) -> Image.Image:
    """Tiles of equal size in rows of ``columns``, each titled above: one picture for all heads of a layer."""
    w, h = tiles[0].size
    size = max(10, w // 12)
    font, gap = _font(size), max(2, size // 3)
    rows = -(-len(tiles) // columns)
    cell_w, cell_h = w + gap, h + size + 2 * gap
    out = Image.new("RGB", (columns * cell_w + gap, rows * cell_h + gap), "white")
    draw = ImageDraw.Draw(out)
    for i, (tile, title) in enumerate(zip(tiles, titles, strict=True)):
        x, y = gap + (i % columns) * cell_w, gap + (i // columns) * cell_h
        draw.text((x + w / 2, y), title, fill="black", font=font, anchor="ma")
        out.paste(tile, (x, y + size + gap))
    return out


def display_copy(img: Image.Image, max_side: int, min_side: int = MIN_SIDE) -> Image.Image:
    """``img`` in RGB at a size to show, a copy: shrunk to ``max_side`` pixels on its long side, or enlarged by
    a whole factor until its long side reaches ``min_side``, each pixel a sharp square (nearest neighbour):
    a tiny image is shown as what it is, large enough to see and to carry a readable colour bar."""
    out = img.convert("RGB")
    long = max(out.size)
    if long > max_side:
        out.thumbnail((max_side, max_side))
    elif long < min_side:
        k = -(-min_side // long)
        out = out.resize((out.width * k, out.height * k), Image.NEAREST)
    return out


def fit(size: tuple[int, int], side: int) -> tuple[int, int]:
    """``size`` shrunk (never enlarged) to ``side`` pixels on its long side."""
    scale = min(1.0, side / max(size))
    return max(1, round(size[0] * scale)), max(1, round(size[1] * scale))


def dim_outside(shown: Image.Image, box: Box, side: int, grid: tuple[int, int]) -> Image.Image:
    """The image shrunk to ``fit`` ``side``, darkened outside ``box`` (the region the model saw), with the
    token grid drawn faintly inside it: the picture to click a patch on."""
    size = fit(shown.size, side)
    scale = size[0] / shown.width
    img = shown.resize(size, Image.BILINEAR) if size != shown.size else shown.convert("RGB")
    l, t, r, b = (v * scale for v in box)
    out = Image.blend(img, Image.new("RGB", img.size, "black"), 0.55)
    out.paste(img.crop((round(l), round(t), round(r), round(b))), (round(l), round(t)))
    draw = ImageDraw.Draw(out, "RGBA")
    gh, gw = grid
    for i in range(1, gw):
        x = l + (r - l) * i / gw
        draw.line((x, t, x, b - 1), fill=(255, 255, 255, 70))
    for j in range(1, gh):
        y = t + (b - t) * j / gh
        draw.line((l, y, r - 1, y), fill=(255, 255, 255, 70))
    return outline(out, (l, t, r, b))


def unique(img: Image.Image, note: str) -> Image.Image:
    """Gradio caches outputs under a hash of their bytes and rewrites that file on every request, so two
    identical concurrent requests would overwrite an image while the other downloads it. A unique id in the
    image's EXIF description (which Gradio writes into WebP and JPEG outputs) gives every response its own
    file."""
    exif = Image.Exif()
    exif[IMAGE_DESCRIPTION] = f"{note}; request {uuid.uuid4().hex}"
    img.info["exif"] = exif.tobytes()
    return img
