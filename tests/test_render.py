"""webapp.inference.render: what a map's colours and colour bar claim."""

from __future__ import annotations

import matplotlib
import numpy as np
import torch
from PIL import Image

from webapp.inference import render
from webapp.registry.catalog import ROOT


def _colours(img: Image.Image, box: tuple[int, int, int, int]) -> int:
    return len(np.unique(np.asarray(img.crop(box)).reshape(-1, 3), axis=0))


def test_a_flat_map_is_drawn_in_one_colour_and_its_bar_says_so():
    """Chefer et al.'s map of a kitten once spanned 0.99990 to 1: stretched to the full colour range it looked
    like a map, and its colour bar read "0.99990 … 1.00000". Below ``FLAT`` of its peak a map is drawn in one
    colour and the bar says it is flat."""
    g = torch.Generator().manual_seed(0)
    flat = 1.0 - 9e-5 * torch.rand(8, 8, generator=g)
    flat[0, 0] = 1.0
    photo = Image.new("RGB", (256, 256), (120, 120, 120))
    shown = render.map_on_image(photo, (0, 0, 256, 256), flat, 0.5, "chefer et al.")
    assert render.bar_labels(flat) == (render.FLAT_LABEL, "1")
    assert _colours(shown, (0, 0, 256, 256)) == 1  # the image under the map: one colour
    assert _colours(shown, (0, 258, 256, 262)) == 1  # the colour bar: that colour, not a ramp
    assert render.bar_labels(torch.zeros(4, 4))[0] == render.FLAT_LABEL

    # a map with a range, however small its values (raw attention over 1024 tokens), is a map
    spread = torch.linspace(0.0009, 0.0011, 64).reshape(8, 8)
    assert render.bar_labels(spread) == ("0.0009", "0.0011")
    shown = render.map_on_image(photo, (0, 0, 256, 256), spread, 0.5, "raw attention")
    assert _colours(shown, (0, 0, 256, 256)) > 50 and _colours(shown, (0, 258, 256, 262)) > 50
    # just above the tolerance: the digits it takes to tell the ends apart (render.range_labels)
    assert render.bar_labels(torch.tensor([[0.9997, 1.0]])) == ("0.9997", "1.0000")


def test_the_colour_bar_is_matplotlibs_ramp_and_each_map_labels_its_own():
    """The bar's ramp is matplotlib's colormap across the bar's width, to the 8-bit rounding, for every map drawn
    (whatever is kept between maps); the labels are each map's own."""
    from matplotlib import colormaps

    photo = Image.new("RGB", (300, 200), (120, 120, 120))
    first = np.asarray(render.with_colorbar(photo, torch.linspace(0, 1, 64).reshape(8, 8), "attnlrp"))
    second = np.asarray(render.with_colorbar(photo, torch.linspace(3, 7, 64).reshape(8, 8), "raw attention"))
    expected = np.round(colormaps[render.COLORMAP](np.linspace(0.0, 1.0, 300))[:, :3] * 255)
    for shown in (first, second):
        assert np.array_equal(shown[:200], np.asarray(photo))  # the picture above, untouched
        ramp = [y for y in range(200, shown.shape[0]) if np.array_equal(shown[y], expected)]
        assert len(ramp) >= 6 and ramp == list(range(ramp[0], ramp[0] + len(ramp)))  # a band of that ramp
    labels = slice(max(ramp) + 1, None)
    assert not np.array_equal(first[labels], second[labels])  # "0.00 ... 1.00" against "3.00 ... 7.00"


def test_a_map_on_the_image_is_the_overlay_over_the_region_seen_outlined_above_its_colour_bar():
    """``map_on_image`` against what each part must be, read off the picture: inside the region the model saw (off
    its outline), the library's overlay of that region (``vit_core.figures.overlay``, the reference); outside it,
    the image untouched; below the image, a bar as wide as the image whose colours run along the colormap from
    left to right; ``shown``, shared between requests, left as it was."""
    from vit_core import figures

    rng = np.random.default_rng(0)
    shown = Image.fromarray(rng.integers(0, 256, (300, 451, 3), dtype=np.uint8))
    before = np.asarray(shown).copy()
    heat = torch.from_numpy(rng.random((14, 14), dtype=np.float32))
    cmap = matplotlib.colormaps[render.COLORMAP]
    for box in [(75, 0, 375, 300), (0, 0, 451, 300), (10, 20, 200, 150)]:
        out = np.asarray(render.map_on_image(shown, box, heat, 0.5, "attnlrp")).astype(int)
        assert out.shape[1] == 451 and out.shape[0] > 300  # the bar below the image
        left, top, right, bottom = box
        seen = np.asarray(figures.overlay(shown.crop(box), heat, 0.5, render.COLORMAP)).astype(int)
        inner = out[top + 3 : bottom - 3, left + 3 : right - 3]  # off the outline (2 px)
        assert np.abs(inner - seen[3:-3, 3:-3]).max() <= 1  # within 1/255: the overlay's 8-bit blend
        outside = np.ones((300, 451), bool)
        outside[max(0, top - 3) : bottom + 3, max(0, left - 3) : right + 3] = False
        assert np.array_equal(out[:300][outside], before[outside].astype(int))
        bar = out[300:]
        row = bar[np.argmax([len(np.unique(r, axis=0)) for r in bar])]  # the bar's most colourful row: its ramp
        ramp = np.array([cmap(x)[:3] for x in np.linspace(0.0, 1.0, len(row))]) * 255
        assert np.abs(row - ramp).mean() < 12  # the colormap from its low end on the left to its high end
    assert np.array_equal(np.asarray(shown), before)


def test_the_overlay_is_sent_as_a_jpeg_close_to_what_was_drawn(tmp_path):
    """Classify's overlay output (``classify.overlay_output``, a ``JpegFigure``) writes the drawn picture into
    Gradio's cache as a JPEG with its colours at full resolution: every pixel within 16 levels of what was drawn,
    under 1 on average, where Gradio's own JPEG (the format it had) is off by more on average; the EXIF that makes
    each answer a file of its own is kept, and the page draws it as a ``gr.Image``."""
    import gradio as gr
    from PIL import JpegImagePlugin

    from webapp.tabs import classify

    photo = Image.open(ROOT / "examples" / "cat_chelsea.jpg").convert("RGB")
    heat = torch.rand(8, 8, generator=torch.Generator().manual_seed(0))
    drawn = render.unique(render.map_on_image(photo, (75, 0, 375, 300), heat, 0.5, "attnlrp"), "AttnLRP")

    def sent(component: gr.Image) -> tuple[Image.Image, np.ndarray]:
        component.GRADIO_CACHE = str(tmp_path)
        img = Image.open(component.postprocess(drawn).path)
        return img, np.abs(np.asarray(img.convert("RGB")).astype(int) - np.asarray(drawn).astype(int))

    output = classify.overlay_output()
    img, off = sent(output)
    assert img.format == "JPEG" and JpegImagePlugin.get_sampling(img) == 0  # 4:4:4
    assert off.max() <= 16 and off.mean() < 1.0, (off.max(), off.mean())
    assert sent(gr.Image(type="pil", format="jpeg"))[1].mean() > 2 * off.mean()
    assert img.getexif()[render.IMAGE_DESCRIPTION] == drawn.getexif()[render.IMAGE_DESCRIPTION]
    assert output.get_block_name() == "image"
