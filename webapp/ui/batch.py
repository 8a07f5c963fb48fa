"""The Batch tab: several images, or zip archives of images, at once: a gallery of overlays and a CSV of each
image's top-k predictions (``webapp.batch`` reads the uploads and maps them); ``/batch`` is the API. New files
or another model clear the results (``fresh``)."""

from __future__ import annotations

import gradio as gr
from PIL import Image

from .. import batch as batch_mode
from ..admission import COMPUTE
from ..catalog import BUNDLED_LABEL
from ..errors import user_errors
from ..settings import check_top_k, parse_settings
from . import fresh
from .classify import ClassifyTab
from .context import Context
from .inputs import CheckedRadio, Uploads
from .picker import Picker


@user_errors
def batch(
    ctx: Context,
    files: list[str] | None,
    model_choice: str = BUNDLED_LABEL,
    method: str = batch_mode.batchable()[0].title,
    top_k: int = 5,
    opacity: float = 0.5,
) -> tuple[list[tuple[Image.Image, str]], str, str]:
    """Many images (files, or zip archives of images) at once: a gallery of overlays, a CSV of each image's
    top-k predictions (downloadable), and a one-line summary. At most 64 images per batch."""
    model, transform = ctx.models.get(model_choice)
    s = parse_settings(model, method, opacity=opacity)
    k = check_top_k(top_k, model.config.num_classes)
    items, gallery = batch_mode.classify_batch(model, transform, files or [], s, ctx.device)
    path = batch_mode.write_csv(items, model.class_names, k)
    skipped = [i for i in items if i.probs is None]
    note = f"{len(gallery)} image(s) classified" + (f", {len(skipped)} skipped (see the CSV)" if skipped else "")
    if skipped and not gallery:
        note += f"; {skipped[0].name}: {skipped[0].error}"
    return gallery, str(path), f"{note}; maps: {s.method.name}"


GROUP = "batch"
BLANK = ([], None, "")  # gallery, CSV, summary


def show(
    ctx: Context,
    files: list[str] | None,
    model_choice: str,
    method: str,
    top_k: int,
    opacity: float,
    ticket: float | None,
    request: gr.Request,
) -> tuple:
    """``batch`` for the files on screen; an error in place of the summary."""
    return fresh.answer(
        request,
        GROUP,
        ticket,
        fresh.subject_of(files, model_choice),
        len(BLANK),
        lambda: batch(ctx, files, model_choice, method, top_k, opacity),
        lambda e: (*BLANK[:2], fresh.problem(e)),
        ctx.held("batch", files=files, model_choice=model_choice, method=method),
    )


def show_new(
    ctx: Context,
    files: list[str] | None,
    model_choice: str,
    method: str,
    top_k: int,
    opacity: float,
    ticket: float | None,
    request: gr.Request,
) -> tuple:
    """``show`` when files were chosen; nothing when they were removed."""
    return show(ctx, files, model_choice, method, top_k, opacity, ticket, request) if files else BLANK


def blank(files: list[str] | None) -> tuple:
    return (*BLANK[:2], "Classifying…") if files else BLANK


def build(ctx: Context, picker: Picker, classify: ClassifyTab) -> None:
    """The upload, the method (the table's batchable ones), the gallery and the CSV. Top-k and opacity are the
    Classify tab's."""
    titles = [m.title for m in batch_mode.batchable()]
    gr.Markdown(f"Several images, or a zip archive of images (at most {batch_mode.MAX_IMAGES}).")
    files = Uploads(
        file_count="multiple", file_types=["image", ".zip"], type="filepath", label="Images", elem_id="files"
    )
    method = CheckedRadio(titles, value=titles[0], label="Explanation")
    button = gr.Button("Classify all", variant="primary")
    note = gr.Textbox(label="Summary", interactive=False, elem_id="batch-note")
    gallery = gr.Gallery(
        label="Overlays",
        columns=4,
        height="auto",
        object_fit="contain",
        elem_id="batch-gallery",
        elem_classes=["tiles", "phone-2-columns"],
    )
    csv = gr.File(label="Top-k predictions (CSV)", elem_id="batch-csv")
    inputs, outputs = [files, picker.active, method, classify.top_k, classify.opacity], [gallery, csv, note]
    fresh.listen(
        [button.click], ctx.handler(show, None), inputs, outputs, concurrency_id=COMPUTE, api_name="batch_page"
    )
    # new files are classified at once (as an image on the Classify tab); another model clears the results
    new_files = fresh.on_change([files.change], [GROUP], [files, picker.active], blank, outputs)
    fresh.then(new_files, ctx.handler(show_new, None), inputs, outputs, concurrency_id=COMPUTE, api_name="batch_new")
    fresh.on_change([picker.active.change], [GROUP], [files, picker.active], lambda _: BLANK, outputs)
    gr.on(
        [],
        ctx.handler(batch, "batch"),
        [files, picker.choice, method, classify.top_k, classify.opacity],
        [gallery, csv, note],
        api_name="batch",
        concurrency_id=COMPUTE,
    )
