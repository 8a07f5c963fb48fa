"""webapp.render: what a map's colours and colour bar claim."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from webapp import render


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
