"""The Train tab: fine-tune the model in use on the visitor's labelled photos (a zip, one folder per class), with
live progress, a Cancel button, the calibration numbers, the run folder as a zip, and the picker switched to the
new model so that every other tab explains it at once; ``/train`` streams the same progress to API clients.

The work is ``webapp.training`` (one job at a time, in a process of its own, ``vit_core.training.finetune``) on the
folder ``webapp.trainset`` writes. In public mode the limits are ``trainset.PUBLIC``, the model is the session's only
and is deleted after an hour, and there is no Hub push.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import gradio as gr
import pandas as pd

import vit_core

from .. import estimates
from ..admission import MB
from ..errors import sentence
from ..training import Job, TrainingBusy, zip_run
from ..trainset import LOCAL, PUBLIC, Limits, from_zip
from ..ui.context import Context
from ..ui.endpoints import Api, Page, Tab

TITLE = "Train"
# the training process before its images: torch, the model, a batch (the bundled model on 80 photos: 1.06 GB RSS)
WORKER_BYTES = 1024 * MB
BATCH = 32  # vit_core.training.finetune.FINETUNE_RECIPE's batch
MAX_DOUBLED = 224  # the largest input "twice the size" may ask for (a CPU trains 448 px far too slowly)
UPDATE_S = 2.0  # the page gets at most one update this often while training


def limits_of(ctx: Context) -> Limits:
    return PUBLIC if ctx.models.options.public else LOCAL


def estimate(ctx: Context, arguments: dict) -> int:
    """The training process: its start, the model with its gradients and SGD's momentum, a batch's
    activations (forward and backward), and the largest training set the limits allow, decoded (uint8)."""
    model, _ = estimates.model_of(ctx.models.loaded, arguments.get("model_choice"))
    if model is None:
        return estimates.REQUEST_BYTES + WORKER_BYTES
    cfg = model.config
    if arguments.get("double_size"):
        cfg = cfg.replace(img_size=2 * cfg.img_size)
    side = math.ceil(cfg.img_size * 1.15)  # decoded at the eval transform's resize, before its crop
    images = limits_of(ctx).max_images * 3 * side * side
    weights = 3 * 4 * model.num_params()
    return estimates.REQUEST_BYTES + WORKER_BYTES + weights + 3 * estimates.forward_bytes(cfg, BATCH) + images


def _curve(points: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(points, columns=["step", "loss"]).astype({"step": int, "loss": float})


def _line(p: dict) -> str:
    words = {"loading": "Reading the photos and the model…", "calibrating": "Calibrating on the held-out photos…"}
    if p["phase"] in words:
        return words[p["phase"]]
    total = f" of ~{p['total_steps']}" if p.get("total_steps") else ""
    loss = f", loss {p['loss']:.3f}" if p.get("loss") is not None else ""
    val = f", held-out accuracy {p['val_accuracy']:.1f}%" if p.get("val_accuracy") is not None else ""
    eta = f", about {p['eta_s']:.0f} s left" if p.get("eta_s") else ""
    return f"Training: step {p['step']}{total} (epoch {p['epoch']}){loss}{val}{eta}"


def _summary(result: dict, value: str, label: str) -> str:
    if not result["complete"]:
        head = "**Cancelled**: the model as it was then (uncalibrated) is in use now."
    else:
        acc = result["val_accuracy"]
        head = f"**Done**: held-out accuracy **{acc:.1f}%** on {result['val_images']} photos."
    rows = [
        head,
        f"- classes: {', '.join(result['classes'])}; {result['train_images']} photos, {result['steps']} steps",
    ]
    if result["temperature"] is not None:
        rows.append(f"- calibration: temperature {result['temperature']:.3f}, 'none of my classes' detector fitted")
    rows.append(f"- the picker now uses **{label}** (`{value}`): Classify, Explore, Compare and Batch explain it")
    return "\n".join(rows)


def train(
    ctx: Context,
    photos: str | None,
    model_choice: str,
    minutes: float = 1.0,
    double_size: bool = False,
    request: gr.Request | None = None,
) -> Iterator[tuple]:
    """Fine-tune ``model_choice`` on a zip of labelled photos (one folder per class) for ``minutes``; yields
    (progress, loss curve, result, run folder zip, model): the last is the new model's value for ``/classify``."""
    session = getattr(request, "session_hash", None) or "api"
    limits = limits_of(ctx)
    if not photos:
        raise gr.Error("Upload a zip of photos, one folder per class.", print_exception=False)
    if not 0 < minutes <= limits.max_minutes:
        raise gr.Error(f"The time budget is at most {limits.max_minutes:g} minutes.", print_exception=False)
    model, _ = ctx.models.get(model_choice)  # the access rules, and the loaded model's size
    source = ctx.models.access.resolve(model_choice)
    size = 2 * model.config.img_size if double_size else None
    if size is not None and size > MAX_DOUBLED:
        raise gr.Error(f"Twice this model's input is over {MAX_DOUBLED} px: too slow to train here.")
    trainer = ctx.trainer
    try:
        job = trainer.start(session, minutes)
    except TrainingBusy as e:
        raise gr.Error(str(e), print_exception=False) from None
    try:
        with ctx.held(estimate, model_choice=model_choice, double_size=double_size):
            yield from _train(ctx, job, photos, source.source, size, limits)
    finally:
        trainer.finish(job)


def _train(ctx: Context, job: Job, photos: str, init: str, size: int | None, limits: Limits) -> Iterator:
    trainer = ctx.trainer
    skip = gr.skip()
    try:
        found = from_zip(photos, job.data, limits)
    except ValueError as e:
        raise gr.Error(sentence(str(e)), print_exception=False) from None
    yield f"{found.text()}. Starting…", _curve([]), "", gr.update(value=None, visible=False), skip
    points, last, result = [], 0.0, None
    try:
        for report in trainer.run(job, init, size):
            if "result" in report:
                result = report["result"]
                continue
            if report.get("loss") is not None and report["phase"] == "training":
                points.append({"step": report["step"], "loss": report["loss"]})
            if report["phase"] != "training" or report["elapsed_s"] - last >= UPDATE_S:
                last = report["elapsed_s"]
                yield _line(report), _curve(points), skip, skip, skip
    except RuntimeError as e:
        raise gr.Error(sentence(str(e)), print_exception=False) from None
    trained = trainer.register(job, result["classes"])
    download = zip_run(job.out, job.folder / f"{job.out.name}.zip")
    summary = _summary(result, trained.value, trained.label)
    picker = gr.Dropdown(choices=ctx.models.choices(job.session), value=trained.value)
    yield "Finished.", _curve(points), summary, gr.update(value=str(download), visible=True), picker


def cancel(ctx: Context, request: gr.Request | None = None) -> str:
    """Stop this session's training job after its current step (the model as it is then is kept)."""
    asked = ctx.trainer.cancel(getattr(request, "session_hash", None) or "api")
    return "Stopping after this step…" if asked else "No training job of yours is running."


def push(ctx: Context, repo: str, token: str, request: gr.Request | None = None) -> str:
    """Push this session's newest trained model to the Hub repo ``repo`` with ``token`` (not on a public
    server)."""
    if ctx.models.options.public:
        raise gr.Error("This public server does not push to the Hub: download the zip instead.")
    mine = ctx.trainer.of_session(getattr(request, "session_hash", None) or "api")
    if not mine:
        raise gr.Error("Train a model first.")
    if not repo.strip():
        raise gr.Error("Give the Hub repo to push to ('owner/name').")
    url = vit_core.push_to_hub(str(mine[-1].out), repo.strip(), token=token.strip() or None)
    return f"Pushed to {url}"


def build(ctx: Context, page: Page) -> Tab:
    """The limits, the upload and settings, the progress, the results and (locally) the Hub push."""
    limits, public = limits_of(ctx), ctx.models.options.public
    keep = "It stays in this browser session only and is deleted after an hour." if public else ""
    gr.Markdown(
        "Fine-tune the model in use (the picker above) on your own photos: a **zip with one folder per class** "
        f"(`ants/1.jpg`, `bees/7.jpg`, …). Limits: {limits.text()}. A fifth of each class is held out to "
        f"measure and calibrate the new model, which the picker then switches to. {keep}"
    )
    with gr.Row():
        photos = gr.File(
            label="Labelled photos (zip)", file_types=[".zip"], type="filepath", min_width=280, elem_id="train-photos"
        )
        with gr.Column(min_width=280):
            top = limits.max_minutes
            minutes = gr.Slider(
                0.1, top, value=min(1.0, top), step=0.1, label="Training time (minutes)", elem_id="train-minutes"
            )
            double = gr.Checkbox(label="Twice the input size (position embeddings interpolated)", value=False)
            with gr.Row():
                start = gr.Button("Train", variant="primary")
                stop = gr.Button("Cancel")
    progress = gr.Markdown(label="Progress", elem_id="train-progress")
    curve = gr.LinePlot(_curve([]), x="step", y="loss", label="Training loss", height=220, elem_id="train-curve")
    result = gr.Markdown(label="Result", elem_id="train-result")
    download = gr.File(label="Run folder (zip)", interactive=False, visible=False)  # shown with its zip
    outputs = [progress, curve, result, download, page.picker.choice]
    with gr.Row(visible=not public):
        repo = gr.Textbox(label="Hub repo (owner/name)", scale=2)
        token = gr.Textbox(label="Hugging Face token", type="password", scale=2)
        upload = gr.Button("Push to the Hub", scale=1)
    pushed = gr.Markdown(label="Pushed to the Hub")
    # no queue: a second job is refused at once ("try again in N min"); the job holds the gate itself (``train``)
    own = {"compute": False, "options": {"concurrency_limit": None}}
    inputs = [photos, page.picker.choice, minutes, double]
    return Tab(
        apis=[
            Api("train", train, inputs, outputs, None, triggers=[start.click], **own),
            Api("train_cancel", cancel, [], [progress], None, triggers=[stop.click], **own),
            Api("push", push, [repo, token], [pushed], None, [upload.click], False, {"api_visibility": "private"}),
        ]
    )
