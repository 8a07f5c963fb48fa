"""The Compare tab: every method's map for the same image and class, each with its deletion and insertion AUC
on that image, beside the centre-Gaussian baseline (``webapp.comparison``); ``/compare``. A new image or model
clears the comparison (``fresh``); the button computes it for what is on screen."""

from __future__ import annotations

import gradio as gr
from PIL import Image

from .. import explorer, render
from ..admission import COMPUTE
from ..analysis import explained_class
from ..catalog import BUNDLED_LABEL
from ..comparison import compare as score_methods
from ..errors import user_errors
from ..model_info import format_ms
from ..settings import PREDICTED, head_name, layer_name, parse_settings
from . import fresh
from .classify import ClassifyTab
from .context import Context
from .picker import Picker


@user_errors
def compare(
    ctx: Context,
    image: str | None,
    model_choice: str = BUNDLED_LABEL,
    target: str = PREDICTED,
    layer: int = -1,
    head: str = "mean",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    opacity: float = 0.5,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's idiom)
) -> tuple[list[tuple[Image.Image, str]], list[list], str]:
    """Every method's map (RISE where it fits the server's budget) and a centre-Gaussian baseline for the same
    image and class, each with its deletion AUC (lower is better) and insertion AUC (higher is better), and on
    its picture and caption the time the map took on this image (``comparison.compare``)."""
    a = ctx.analysis(image, model_choice)
    s = parse_settings(a.model, None, target, layer, head, head_fusion, discard_ratio, opacity)
    scored = score_methods(a, s, ctx.device, lambda f, desc: progress(f, desc=desc))
    gallery, table = [], []
    for name, heat, deletion, insertion, ms in scored:
        scores = f"deletion {deletion:.3f}, insertion {insertion:.3f}"
        took = "" if ms is None else format_ms(ms)
        img = render.titled(
            render.map_on_crop(a.shown, a.box, heat, s.opacity, explorer.SIDE, "relevance"),
            [name.split(" (")[0] + (f", {took}" if took else ""), scores],
        )
        gallery.append((render.unique(img, name), f"{name}: {scores}" + (f"; {took}" if took else "")))
        table.append([name, round(deletion, 4), round(insertion, 4)])
    target_name = a.names[explained_class(a, s)]
    where = f"{layer_name(s.layer, a.model.config.depth)}, {head_name(s.head)}"
    return gallery, table, f"Maps and scores for class {target_name}; raw attention: {where}."


GROUP = "compare"
BLANK = ([], None, "")  # gallery, table, what is compared


def show(
    ctx: Context,
    image: str | None,
    model_choice: str,
    target: str,
    layer: int,
    head: str,
    head_fusion: str,
    discard_ratio: float,
    opacity: float,
    ticket: float | None,
    request: gr.Request,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's idiom)
) -> tuple:
    """``compare`` for what is on screen; an error in place of the text."""
    settings = (target, layer, head, head_fusion, discard_ratio, opacity)
    return fresh.answer(
        request,
        GROUP,
        ticket,
        fresh.subject_of(image, model_choice),
        len(BLANK),
        lambda: compare(ctx, image, model_choice, *settings, progress=progress),
        lambda e: (*BLANK[:2], fresh.problem(e)),
        ctx.held("compare", image=image, model_choice=model_choice),
    )


def build(ctx: Context, picker: Picker, classify: ClassifyTab) -> None:
    """The button, the scores table and the maps. The image, class, layer, head and opacity are the Classify
    tab's."""
    gr.Markdown(
        "Every map for the same image and class, each scored on this image: **deletion AUC** (pixels "
        "removed most relevant first; lower is better) and **insertion AUC** (revealed most relevant "
        "first; higher is better), with the time the map took on each picture. The centre Gaussian ignores "
        "the image: a map that does no better says little about this image. Uses the class, layer and head "
        "of the Classify tab's settings."
    )
    button = gr.Button("Compare methods", variant="primary")
    text = gr.Textbox(label="What is compared", interactive=False, elem_id="compare-text")
    table = gr.Dataframe(
        headers=["method", "deletion AUC (lower is better)", "insertion AUC (higher is better)"],
        label="Faithfulness on this image",
        interactive=False,
        wrap=True,
        elem_id="compare-table",
    )
    gallery = gr.Gallery(
        label="Maps (coloured: the region the model saw)",
        columns=4,
        height="auto",
        object_fit="contain",
        elem_id="compare-gallery",
        elem_classes=["tiles", "phone-2-columns"],
    )
    c = classify
    fresh.listen(
        [button.click],
        ctx.handler(show, None),
        [c.image, picker.active, c.target, c.layer, c.head, c.head_fusion, c.discard, c.opacity],
        [gallery, table, text],
        concurrency_id=COMPUTE,
        api_name="compare_page",
    )
    fresh.on_change(
        [c.image.change, picker.active.change],
        [GROUP],
        [c.image, picker.active],
        lambda _: BLANK,
        [gallery, table, text],
    )
    gr.on(
        [],
        ctx.handler(compare, "compare"),
        [c.image, picker.choice, c.target, c.api_layer, c.head, c.head_fusion, c.discard, c.opacity],
        [gallery, table, text],
        api_name="compare",
        concurrency_id=COMPUTE,
    )
