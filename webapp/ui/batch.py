"""The Batch tab: several images, or zip archives of images, at once: a gallery of overlays and a CSV of each
image's top-k predictions (``webapp.batch`` reads the uploads and maps them); ``/batch`` is the API."""

from __future__ import annotations

import gradio as gr
from PIL import Image

from .. import batch as batch_mode
from ..admission import COMPUTE
from ..catalog import BUNDLED_LABEL
from ..errors import user_errors
from ..settings import check_top_k, parse_settings
from .classify import ClassifyTab
from .context import Context
from .inputs import CheckedRadio
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
    return gallery, str(path), note


def build(ctx: Context, picker: Picker, classify: ClassifyTab) -> None:
    """The upload, the method (the table's batchable ones), the gallery and the CSV. Top-k and opacity are the
    Classify tab's."""
    titles = [m.title for m in batch_mode.batchable()]
    gr.Markdown(f"Several images, or a zip archive of images (at most {batch_mode.MAX_IMAGES}).")
    files = gr.File(
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
        elem_classes="phone-2-columns",
    )
    csv = gr.File(label="Top-k predictions (CSV)", elem_id="batch-csv")
    button.click(
        ctx.handler(batch, "batch"),
        [files, picker.choice, method, classify.top_k, classify.opacity],
        [gallery, csv, note],
        api_name="batch",
        concurrency_id=COMPUTE,
    )
