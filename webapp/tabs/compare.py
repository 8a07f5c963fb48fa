"""The Compare tab: every method's map for the same image and class, each scored by how faithful it is on that
image, beside the centre-Gaussian baseline; ``/compare``. A new image or model clears the comparison
(``fresh``); the button computes it for what is on screen.

Deletion (pixels removed most relevant first; lower is better) and insertion (revealed most relevant first;
higher is better), ``vit_core.explain.faithfulness.deletion_insertion_auc``, beside a map that ignores the image, the
centre Gaussian: a method that does no better than it says little about this image (``score_methods``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import gradio as gr
import torch
from PIL import Image

from vit_core import explain, methods
from vit_core.explain.faithfulness import deletion_insertion_auc

from ..inference import estimates, render
from ..inference.analysis import Analysis, autocast, declared, explained_class, map_key, relevance
from ..inference.model_info import format_ms
from ..inference.settings import Settings, affordable, head_name, layer_name, legend, lrp_based, lrp_notice
from ..ui.controls import tiles
from ..ui.declarations import Api, Clear, Event, Page, Shown, Tab, problem_last
from ..ui.endpoints import Context, Prepared, api

TITLE = "Compare"
COMPARE_STEPS = 16  # deletion/insertion curve points: 2 x 17 forward passes per map, batched
CENTRE = "Centre Gaussian (baseline: ignores the image)"
SIDE = 320  # long side of each map's picture, in pixels
DRAW_BYTES = 24  # 320-pixel crops of every map, a pixel of the reduced image (measured 19)


def score_methods(
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


def estimate(ctx: Context, request: Prepared) -> int:
    """The upload decoded, then on a CPU the analysis, every map this server draws for the model, and the
    deletion and insertion curves, ``COMPARE_STEPS + 1`` images each."""
    model, transform = ctx.loaded(request)
    work = 0
    if model is not None and ctx.device.type == "cpu":
        cfg = model.config
        curves = estimates.forward_bytes(cfg, COMPARE_STEPS + 1, attention=False)
        runs = [m for m in methods.METHODS if affordable(m, cfg, ctx.device)]
        work = estimates.analysis_bytes(cfg) + sum(estimates.map_bytes(cfg, m) for m in runs) + curves
    return estimates.image_request(declared(request.values.get("image")), transform, DRAW_BYTES, work)


def _compare(ctx: Context, request: Prepared) -> tuple[list[tuple[Image.Image, str]], list[list], str]:
    """Every method's map (RISE where it fits the server's budget) and a centre-Gaussian baseline for the same
    image and class, each with its deletion AUC (lower is better) and insertion AUC (higher is better), and on
    its picture and caption the time the map took on this image."""
    a = ctx.analysis(request)
    s = request.checked(a.model, methods.METHODS[0])
    scored = score_methods(a, s, ctx.device, request.report)
    gallery, table = [], []
    for name, heat, deletion, insertion, ms in scored:
        scores = f"deletion {deletion:.3f}, insertion {insertion:.3f}"
        took = "" if ms is None else format_ms(ms)
        img = render.titled(
            render.map_on_crop(a.shown, a.box, heat, s.opacity, SIDE, "relevance"),
            [name.split(" (")[0] + (f", {took}" if took else ""), scores],
        )
        gallery.append((render.unique(img, name), f"{name}: {scores}" + (f"; {took}" if took else "")))
        table.append([name, round(deletion, 4), round(insertion, 4)])
    target_name = a.names[explained_class(a, s)]
    where = f"{layer_name(s.layer, a.model.config.depth)}, {head_name(s.head)}"
    return gallery, table, f"Maps and scores for class {target_name}; raw attention: {where}."


SETTINGS = ("target", "layer", "head", "head_fusion", "discard_ratio", "opacity")  # the API's, in its order
compare = api(_compare, ("image", "model_choice", *SETTINGS), progress=True)
GROUP = "compare"
BLANK = ([], None, "")  # gallery, table, what is compared


def build(ctx: Context, page: Page) -> Tab:
    """The button, the scores table and the maps. The image, class, layer, head and opacity are the page's
    (``Controls``)."""
    c = page.controls
    gr.Markdown(
        "Every map for the same image and class, each scored on this image: **deletion AUC** (pixels "
        "removed most relevant first; lower is better) and **insertion AUC** (revealed most relevant "
        "first; higher is better), with the time the map took on each picture. The centre Gaussian ignores "
        "the image: a map that does no better says little about this image. Uses the class, layer and head "
        "of the Classify tab's settings."
    )
    if lrp_based():
        gr.Markdown(lrp_notice(), elem_classes="notice")
    button = gr.Button("Compare methods", variant="primary")
    text = gr.Textbox(label="What is compared", interactive=False, elem_id="compare-text")
    table = gr.Dataframe(
        headers=["method", "deletion AUC (lower is better)", "insertion AUC (higher is better)"],
        label="Faithfulness on this image",
        interactive=False,
        wrap=True,
        max_height=2000,  # every row in sight (the default, 500 px, hides the last ones in a box of its own on phones)
        elem_id="compare-table",
    )
    gallery = tiles("Maps (coloured: the region the model saw)", "compare-gallery")
    gr.Markdown(legend(methods.METHODS), elem_classes="legend", elem_id="compare-legend")
    outputs = [gallery, table, text]
    inputs = {"image": c.image, "model_choice": page.picker.active, **c.named(*SETTINGS)}
    # one progress bar, not one over each output
    shown = Shown(
        _compare,
        estimate,
        inputs,
        outputs,
        problem_last(BLANK),
        GROUP,
        progress=True,
        options={"show_progress_on": [table]},
    )
    changes = [c.image.change, page.picker.active.change]
    return Tab(
        apis=[
            Api(
                "compare",
                compare,
                [c.image, page.picker.choice, *c.named(*SETTINGS, api=True).values()],
                outputs,
                estimate,
            )
        ],
        clears=[Clear("new input", changes, [GROUP], (c.image, page.picker.active), lambda _: BLANK, outputs)],
        events=[Event("compare_page", shown, triggers=[button.click])],
    )
