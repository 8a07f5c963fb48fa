"""Every method's map for one image and class, each scored by how faithful it is on that image.

Deletion (pixels removed most relevant first; lower is better) and insertion (revealed most relevant first;
higher is better), ``vit_core.faithfulness.deletion_insertion_auc``, beside a map that ignores the image, the
centre Gaussian: a method that does no better than it says little about this image.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from vit_core import explain, methods
from vit_core.faithfulness import deletion_insertion_auc

from .analysis import Analysis, autocast, explained_class, map_key, relevance
from .settings import Settings, affordable

COMPARE_STEPS = 16  # deletion/insertion curve points: 2 x 17 forward passes per map, batched
CENTRE = "Centre Gaussian (baseline: ignores the image)"


def compare(
    a: Analysis, s: Settings, device: torch.device, progress: Callable[[float, str], None]
) -> list[tuple[str, torch.Tensor, float, float, float | None]]:
    """(title, map, deletion AUC, insertion AUC, milliseconds the map took) of each method of the table for the
    explained class, in the table's order, then of the centre Gaussian (no time: it ignores the image); methods
    not ``affordable`` here (RISE over the budget) are left out. A map that runs the model and was computed for
    this image before (by the Classify tab) keeps the time it took then; one drawn from the prediction's
    attentions is timed drawing it."""
    maps, ms = {}, {}
    for m in (m for m in methods.METHODS if affordable(m, a.model, device)):
        chosen, t0 = replace(s, method=m), time.perf_counter()
        maps[m.title] = relevance(a, chosen, device, progress)
        drawn = m.from_attentions is not None
        ms[m.title] = 1000 * (time.perf_counter() - t0 if drawn else a.seconds[map_key(a, chosen)])
    maps[CENTRE] = explain.centre_gaussian_map(a.model, a.x)[0]
    target = explained_class(a, s)
    x = a.x.to(device)
    scored = []
    for i, (name, heat) in enumerate(maps.items()):
        progress(i / len(maps), f"Deleting and inserting pixels in the order of: {name}")
        with autocast(device):
            auc = deletion_insertion_auc(
                a.model, x, lambda m, imgs, h=heat: h[None].to(imgs.device), target=target, steps=COMPARE_STEPS
            )
        scored.append((name, heat, float(auc["deletion"][0]), float(auc["insertion"][0]), ms.get(name)))
    return scored
