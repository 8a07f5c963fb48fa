"""The Batch tab: several images, or zip archives of images, at once: a gallery of overlays and a CSV of each
image's top-k predictions; ``/batch`` is the API. New files or another model clear the results (``fresh``).

The uploads are read by ``webapp.inference.archives`` (zip archives safely, one image's bytes at a time). Images are
then decoded, classified and let go one at a time (``classify_batch``): each goes through ``analysis.decode``, the
decode every tab uses (so a file gets the Classify tab's numbers here), its decoding cost read from its header
first: at most ``MAX_DECODE_BYTES`` for one image, and ``MAX_DECODED_PIXELS`` for the whole batch. Only the small
results stay: the gallery's overlays (``THUMB``), the probabilities and the model inputs of one chunk
(``chunk_size``).
"""

from __future__ import annotations

import csv
import io
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch
from PIL import Image

from vit_core import VisionTransformer, methods
from vit_core.calibration import predict
from vit_core.data import ImageDataError, ImageTransform

from ..inference import estimates, render
from ..inference.analysis import MAX_SIDE, autocast, decode, needed_side, open_upload
from ..inference.archives import MAX_IMAGES, Item, read_uploads
from ..inference.model_info import UNSURE_BELOW, verdict
from ..inference.settings import Settings, legend, lrp_based, lrp_notice
from ..server.tempfiles import process_folder
from ..ui.controls import tiles
from ..ui.declarations import Api, Clear, Event, Page, Shown, Tab, problem_last
from ..ui.endpoints import Context, Prepared, api
from ..ui.inputs import CheckedRadio, Uploads

TITLE = "Batch"
MAX_DECODED_PIXELS = 400_000_000  # pixels decoded per batch: eight 50 MP PNGs, or dozens of large JPEGs
MAX_DECODE_BYTES = 320 << 20  # memory decoding one image may take (``ImageHeader.decode_bytes``): a 50 MP RGB PNG
THUMB = 384  # long side of the gallery's overlays
CHUNK = 16  # images per forward pass
GRADIENT_CHUNK = 4  # per forward and backward pass: ViT-B/16 keeps about 180 MB an image for its backward pass
CSV_TTL_S = 3600.0  # a batch's CSV is kept this long, in this process's own folder


def batchable() -> list[methods.Method]:
    """The methods the Batch tab offers: those of the table that map a batch in a few passes."""
    return [m for m in methods.METHODS if m.batchable]


def _batch(ctx: Context, request: Prepared) -> tuple[list[tuple[Image.Image, str]], str, str]:
    """Many images (files, or zip archives of images) at once: a gallery of overlays, a CSV of each image's
    top-k predictions (downloadable), and a one-line summary. At most 64 images per batch."""
    model, transform, _ = ctx.model(request)
    s, k = request.checked(model, batchable()[0]), request.settings.top(model)
    items, gallery = classify_batch(model, transform, request["files"] or [], s, ctx.device)
    path = write_csv(items, model.class_names, k)
    skipped = [i for i in items if i.probs is None]
    note = f"{len(gallery)} image(s) classified" + (f", {len(skipped)} skipped (see the CSV)" if skipped else "")
    if skipped and not gallery:
        note += f"; {skipped[0].name}: {skipped[0].error}"
    return gallery, str(path), f"{note}; maps: {s.method.name}"


batch = api(_batch, ("files", "model_choice", "method", "top_k", "opacity"), method=batchable()[0].title)
GROUP = "batch"
BLANK = ([], None, "")  # gallery, CSV, summary


def blank(files: list[str] | None) -> tuple:
    return (*BLANK[:2], "Classifying…") if files else BLANK


def build(ctx: Context, page: Page) -> Tab:
    """The upload, the method (the table's batchable ones), the gallery and the CSV. Top-k and opacity are the
    page's (``Controls``)."""
    picker, c = page.picker, page.controls
    titles = [m.title for m in batchable()]
    gr.Markdown(f"Several images, or a zip archive of images (at most {MAX_IMAGES}).")
    files = Uploads(
        file_count="multiple", file_types=["image", ".zip"], type="filepath", label="Images", elem_id="files"
    )
    method = CheckedRadio(titles, value=titles[0], label="Explanation")
    gr.Markdown(legend(batchable()), elem_classes="legend", elem_id="batch-legend")
    if any(m.batchable for m in lrp_based()):
        gr.Markdown(lrp_notice(), elem_classes="notice")
    button = gr.Button("Classify all", variant="primary")
    note = gr.Textbox(label="Summary", interactive=False, elem_id="batch-note")
    gallery = tiles("Overlays", "batch-gallery")
    csv = gr.File(label="Top-k predictions (CSV)", elem_id="batch-csv")
    outputs = [gallery, csv, note]
    inputs = {"files": files, "model_choice": picker.active, "method": method, **c.named("top_k", "opacity")}
    shown = Shown(
        _batch, estimate, inputs, outputs, problem_last(BLANK), GROUP, subject=("files", "model_choice"), ready=_chosen
    )
    subject = (files, picker.active)
    return Tab(
        apis=[Api("batch", batch, [files, picker.choice, method, c.top_k, c.opacity], outputs, estimate)],
        # new files are classified at once (as an image on the Classify tab); another model clears the results
        clears=[
            Clear("new files", [files.change], [GROUP], subject, blank, outputs),
            Clear("new model", [picker.active.change], [GROUP], subject, lambda _: BLANK, outputs),
        ],
        events=[Event("batch_page", shown, triggers=[button.click]), Event("batch_new", shown, after="new files")],
    )


def _chosen(request: Prepared) -> bool:
    """Whether there are files to classify (removing them leaves the cleared results)."""
    return bool(request["files"])


def estimate(ctx: Context, request: Prepared) -> int:
    """One image decoded at a time (at most ``MAX_DECODE_BYTES``), the gallery's overlays, and on a CPU one
    chunk through the model (forward passes, or ``BACKWARD`` of them for a map with a backward pass)."""
    model, _ = ctx.loaded(request)
    gallery = MAX_IMAGES * 4 * THUMB * THUMB
    work = 0
    if model is not None and ctx.device.type == "cpu":
        method = request.method(batchable()[0], strict=False)
        factor = estimates.BACKWARD if method.cost.backward else 2
        work = factor * estimates.forward_bytes(model.config, chunk_size(method))
    return estimates.REQUEST_BYTES + MAX_DECODE_BYTES + gallery + work


@dataclass
class Decoding:
    """The pixels a batch may still decode (``MAX_DECODED_PIXELS`` in all), charged image by image."""

    pixels: int = MAX_DECODED_PIXELS


def _decode(item: Item, data: bytes, transform: ImageTransform, left: Decoding) -> Image.Image | None:
    """The image in ``data`` decoded as every tab decodes it (``analysis.decode``), its decoded pixels charged to
    ``left`` from its header first; None (``item.error`` set) when it is unreadable or over what is left."""
    buf = io.BytesIO(data)
    buf.name = item.name  # load_image's messages name their source
    need = needed_side(transform)
    try:
        with open_upload(buf) as opened:  # its header read once, for the charge and the decode
            header = opened.header
            w, h = header.decoded_size(MAX_SIDE, need)
            if header.decode_bytes(MAX_SIDE, need) > MAX_DECODE_BYTES:
                item.error = (
                    f"skipped: decoding this {header.size[0]}x{header.size[1]} {header.format} takes about "
                    f"{header.decode_bytes(MAX_SIDE, need) >> 20:,} MB, more than a batch gives one image "
                    f"({MAX_DECODE_BYTES >> 20} MB); classify it on its own"
                )
                return None
            if w * h > left.pixels:
                item.error = (
                    f"skipped: decoding it takes {w * h:,} pixels, more than the batch has left "
                    f"({left.pixels:,} of {MAX_DECODED_PIXELS:,}); send large images in smaller batches"
                )
                return None
            left.pixels -= w * h
            return decode(opened, transform)
    except ImageDataError as e:
        item.error = str(e)
        return None


def classify_batch(
    model: VisionTransformer, transform: ImageTransform, paths: list[str], s: Settings, device: torch.device
) -> tuple[list[Item], list[tuple[Image.Image, str]]]:
    """Every upload of ``paths`` (``read_uploads``) with its probabilities or the reason it was skipped, and
    the gallery: an overlay with a caption per image. Images are decoded, classified and let go one at a
    time, ``chunk_size(s.method)`` per forward pass; each item's ``probs`` are the mean over the views the model was
    calibrated for, as the Classify tab's (``vit_core.calibration.predict``), with its "none of my classes" decision.
    The map is ``s.method`` for each image's predicted class, with the options of ``s`` (raw attention: the
    last layer by default, heads averaged); only ``batchable`` methods: RISE, hundreds of forward passes per
    image, is for the Classify tab."""
    if not s.method.batchable:
        titles = ", ".join(m.title for m in batchable())
        raise ValueError(f"the Batch tab's explanations are {titles}; {s.method.title} is on the Classify tab")
    items: list[Item] = []
    gallery: list[tuple[Image.Image, str]] = []
    chunk: list[tuple[Item, torch.Tensor, Image.Image]] = []
    left = Decoding(MAX_DECODED_PIXELS)  # read now: the limit is the module's as it is at the call
    for item, data in read_uploads(paths):
        items.append(item)
        img = None if data is None else _decode(item, data, transform, left)
        if img is None:
            continue
        shown = render.display_copy(img, THUMB)  # an extreme aspect ratio was kept larger for the model
        chunk.append((item, transform(img), shown))
        del img, data
        if len(chunk) == chunk_size(s.method):
            gallery += _classify_chunk(model, transform, chunk, s, device)
            chunk = []
    if chunk:
        gallery += _classify_chunk(model, transform, chunk, s, device)
    return items, gallery


def chunk_size(method: methods.Method) -> int:
    """Images per forward pass: ``GRADIENT_CHUNK`` for a method with a backward pass, else ``CHUNK``."""
    return GRADIENT_CHUNK if method.cost.backward else CHUNK


def _classify_chunk(
    model: VisionTransformer,
    transform: ImageTransform,
    chunk: list[tuple[Item, torch.Tensor, Image.Image]],
    s: Settings,
    device: torch.device,
) -> list[tuple[Image.Image, str]]:
    x = torch.stack([x for _, x, _ in chunk]).to(device)
    with autocast(device):
        _, maps = s.method.fn(model, x, **s.options(), return_logits=True)
        p = predict(model, x)  # as the Classify tab: the model's views, calibrated, checked
    gallery = []
    for j, ((item, _, shown), heat) in enumerate(zip(chunk, maps.float().cpu(), strict=True)):
        item.probs = p.probs[j].float().cpu()
        if p.ood_score is not None:
            item.ood_score, item.is_ood = float(p.ood_score[j]), bool(p.is_ood[j])
        box = tuple(round(v) for v in transform.crop_box(*shown.size))
        caption = f"{item.name}: {verdict(item.probs, model.class_names, item.is_ood)}"
        gallery.append((render.map_on_image(shown, box, heat, s.opacity, ""), caption))
    return gallery


def _cell(text: str) -> str:
    """A text cell a spreadsheet will not run: OWASP's rule for CSV injection, a cell starting with
    ``= + - @``, a tab or a carriage return gets a leading single quote (a file named ``@SUM(1+1).png``)."""
    return "'" + text if text.startswith(("=", "+", "-", "@", "\t", "\r")) else text


def write_csv(items: list[Item], names: list[str], top_k: int) -> Path:
    """A CSV with one row per upload: the verdict, whether it is unsure, the "none of my classes" decision and
    score (empty for a model without a detector), the top-k classes and probabilities, or the error. Written to
    a fresh folder under this process's own (``tempfiles.process_folder``); those older than ``CSV_TTL_S`` are
    removed."""
    out = process_folder() / "batch"
    out.mkdir(exist_ok=True)
    for old in out.iterdir():
        if old.is_dir() and time.time() - old.stat().st_mtime > CSV_TTL_S:
            shutil.rmtree(old, ignore_errors=True)
    folder = out / uuid.uuid4().hex
    folder.mkdir()
    path = folder / "predictions.csv"
    k = max(1, min(top_k, len(names)))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        tops = [f"{c}_{r}" for r in range(1, k + 1) for c in ("class", "p")]
        w.writerow(["file", "prediction", "unsure", "none_of_my_classes", "ood_score", *tops, "error"])
        for item in items:
            p = item.probs
            if p is None:
                w.writerow([_cell(item.name), "", "", "", "", *[""] * (2 * k), _cell(item.error or "")])
                continue
            top = p.topk(k)
            cells = [
                v for pr, i in zip(top.values, top.indices, strict=True) for v in (_cell(names[i]), f"{float(pr):.4f}")
            ]
            ood = ["", ""] if item.is_ood is None else [item.is_ood, f"{item.ood_score:.4g}"]
            unsure = float(top.values[0]) < UNSURE_BELOW
            w.writerow([_cell(item.name), _cell(verdict(p, names, item.is_ood)), unsure, *ood, *cells, ""])
    return path
