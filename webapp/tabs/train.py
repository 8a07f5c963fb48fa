"""The Train tab: fine-tune the model in use on the visitor's labelled photos (a zip, one folder per class), with
live progress, a Cancel button, a result page (``webapp.jobs.result_page``: how it trained and why, accuracy per class,
the confusion matrix, the misclassified held-out photos, which a click opens in Classify, calibration in words),
the run folder as a zip, and the picker switched to the new model so that every other tab explains it at once;
``/train`` streams the same progress to API clients, and its last update the same result.

A visitor's mistake (a bad zip, a budget over the limit, a busy server) is a line in the tab's progress, and
everything else stays as it was: an error raised would put an error badge over every output, the model picker
and the previous result included. A cancelled run leaves the model in use as it was (its run folder is offered,
uncalibrated).

The work is ``webapp.jobs.trainer`` (one job at a time, in a process of its own, ``vit_core.finetune``) on the
folder ``webapp.jobs.trainset`` writes. In public mode the limits are ``trainset.PUBLIC``, the model is the session's
only and is deleted after an hour, and there is no Hub push.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import pandas as pd

import vit_core

from ..errors import sentence
from ..inference import estimates
from ..inference.archives import zip_directory
from ..inference.estimates import request_only
from ..jobs import trainset
from ..jobs.result_page import confusion_image, keep_misclassified, summary
from ..jobs.trainer import Job, TrainingBusy, zip_run
from ..jobs.trainset import LOCAL, PUBLIC, Limits, from_zip
from ..ui.controls import figure
from ..ui.declarations import Api, Page, Tab
from ..ui.endpoints import Context
from ..ui.inputs import PathFile

TITLE = "Train"
MAX_DOUBLED = 224  # the largest input "twice the size" may ask for (a CPU trains 448 px far too slowly)
UPDATE_S = 2.0  # the page gets at most one update this often while training
CURVE_AXES = dict(x_title="training step", y_title="training loss")  # the loss curve's axes
OUTPUTS = 9  # progress, curve, result, zip, model, confusion matrix, misclassified photos, details, their paths
# A click on a misclassified photo shows the tab that lays out the page's image (``#image``: Classify's).
SHOW_IMAGE_TAB_JS = """() => {
  const panel = document.getElementById('image')?.closest('[role=tabpanel]');
  const tab = panel && document.querySelector(`[role=tab][aria-controls="${panel.id}"]`);
  tab?.click();
  return [];
}"""


def limits_of(ctx: Context) -> Limits:
    return PUBLIC if ctx.models.options.public else LOCAL


def estimate(ctx: Context, model: vit_core.VisionTransformer, double_size: bool, images: int | None) -> int:
    """The request and its training process (``trainset.training_bytes``) for ``images`` photos (the zip's
    entries; without them, the most the limits allow) on ``model``, at twice its input size with
    ``double_size``."""
    limit = limits_of(ctx).max_images
    cfg = model.config.replace(img_size=2 * model.config.img_size) if double_size else model.config
    return estimates.REQUEST_BYTES + trainset.training_bytes(cfg, model.num_params(), min(images or limit, limit))


def _curve(points: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(points, columns=["step", "loss"]).astype({"step": int, "loss": float})


def _plot(points: list[dict]) -> dict:
    """The loss curve's update, drawn whole: from 0 to a tenth above its highest loss (the first points are not
    cut at the top edge), its axes named in every update (Gradio 6.31 drops the titles of a plot whose value
    alone is updated)."""
    top = 1.1 * max(p["loss"] for p in points) if points else None
    return gr.update(value=_curve(points), y_lim=[0, top], **CURVE_AXES)


def _line(p: dict, stopping: bool = False) -> str:
    """A progress report in words; ``stopping``: Cancel was pressed, the current step is finishing. Every phase
    has its words, so that the line never goes back to "Training" after calibrating or cancelling."""
    if p["phase"] == "cancelled" or (stopping and p["phase"] == "training"):
        return f"Cancelling: finishing step {p['step']}…" if p["phase"] == "training" else "Cancelling: saving…"
    words = {
        "loading": "Reading the photos and the model…",
        "features": f"Plan: {p.get('strategy') or 'chosen'}.",
        "calibrating": "Calibrating on the held-out photos…",
        "done": "Done; writing the result page…",
    }
    if p["phase"] in words:
        return words[p["phase"]]
    total = f" of ~{p['total_steps']}" if p.get("total_steps") else ""
    loss = f", loss {p['loss']:.3f}" if p.get("loss") is not None else ""
    val = f", held-out accuracy {p['val_accuracy']:.1f}%" if p.get("val_accuracy") is not None else ""
    best = f" (best so far {p['best_accuracy']:.1f}%)" if p.get("best_accuracy") is not None else ""
    eta = f", about {p['eta_s']:.0f} s of the budget left" if p.get("eta_s") else ""
    stage = f" — {p['stage']}" if p.get("stage") else ""
    return f"Training{stage}: step {p['step']}{total} (epoch {p['epoch']}){loss}{val}{best}{eta}"


def _problem(message: str) -> tuple:
    """A visitor's mistake or a refusal, in the tab's progress line; every other output left as it is."""
    return (f"⚠️ {sentence(message)}", *[gr.skip()] * (OUTPUTS - 1))


def train(
    ctx: Context,
    photos: str | None,
    model_choice: str,
    minutes: float = 1.0,
    double_size: bool = False,
    request: gr.Request | None = None,
) -> Iterator[tuple]:
    """Fine-tune ``model_choice`` on a zip of labelled photos (one folder per class) for ``minutes``; yields
    (progress, loss curve, result, run folder zip, model, confusion matrix, misclassified photos, result details):
    the fifth is the new model's value for ``/classify``; the last update's details are the run's result
    (strategy and why, per-class accuracy, confusion matrix, misclassified files, ECE, threshold). A problem
    (a bad zip, the server busy, the training failed) is the progress line of an update that changes nothing
    else."""
    yield ("Checking the zip…", *[gr.skip()] * (OUTPUTS - 1))  # the previous attempt's warning goes at once
    try:
        yield from _job(ctx, photos, model_choice, minutes, double_size, getattr(request, "session_hash", None))
    except gr.Error as e:  # Busy, a refused model and the checks below are gr.Errors too
        yield _problem(e.message)


def _job(
    ctx: Context, photos: str | None, model_choice: str, minutes: float, double_size: bool, session: str | None
) -> Iterator[tuple]:
    """``train``'s job: its arguments checked, then run holding the job slot and the memory gate."""
    limits = limits_of(ctx)
    if not photos:
        raise gr.Error("Upload a zip of photos, one folder per class.", print_exception=False)
    if not 0 < minutes <= limits.max_minutes:
        raise gr.Error(f"The time budget is at most {limits.max_minutes:g} minutes.", print_exception=False)
    choice = ctx.models.resolve(model_choice)  # once: the access rules, the loaded model's size, the job's source
    model, _ = ctx.models.get(choice)
    size = 2 * model.config.img_size if double_size else None
    if size is not None and size > MAX_DOUBLED:
        raise gr.Error(f"Twice this model's input is over {MAX_DOUBLED} px: too slow to train here.")
    trainer = ctx.trainer
    try:
        job = trainer.start(session or "api", minutes)
    except TrainingBusy as e:
        raise gr.Error(str(e), print_exception=False) from None
    declared = _declared(photos)  # the gate reserves for its photos; a zip holding more is refused (``_train``)
    entries = declared[0] if declared is not None else None
    try:
        with ctx.held(lambda: estimate(ctx, model, double_size, entries)):
            yield from _train(ctx, job, photos, choice.source, size, declared)
    finally:
        trainer.finish(job)


def _declared(photos: str) -> tuple[int, int] | None:
    """The entries and directory bytes the zip declares (its end record, read from its last bytes, once for the
    whole job: the estimate, the reading and the refusals use it): its entries are at least its photos; None when
    it has no readable record (``from_zip`` then says what is wrong)."""
    try:
        return zip_directory(Path(photos))
    except (OSError, struct.error):
        return None


def _train(
    ctx: Context, job: Job, photos: str, init: str, size: int | None, declared: tuple[int, int] | None
) -> Iterator:
    """The job once it holds the slot and the gate: the zip read, the training process, the result page."""
    trainer, limits = ctx.trainer, limits_of(ctx)
    entries = declared[0] if declared is not None else None
    skip = gr.skip()
    try:
        found = from_zip(photos, job.data, limits, declared)
    except ValueError as e:
        raise gr.Error(sentence(str(e)), print_exception=False) from None
    if entries is not None and found.images > entries:  # its end record lied: the estimate too
        what = f"{entries:,} {'entry' if entries == 1 else 'entries'}"
        lie = f"The zip's directory declares {what} but holds more photos."
        raise gr.Error(lie, print_exception=False)
    hidden = gr.update(value=None, visible=False)
    yield f"{found.text()}. Starting…", _plot([]), "", hidden, skip, hidden, hidden, None, []
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
                yield _line(report, job.stop_file.exists()), _plot(points), *[skip] * (OUTPUTS - 2)
    except RuntimeError as e:
        raise gr.Error(sentence(str(e)), print_exception=False) from None
    download = gr.update(value=str(zip_run(job.out, job.folder / f"{job.out.name}.zip")), visible=True)
    if not result["complete"]:  # the model in use stays: the run is neither finished nor calibrated
        line = f"Cancelled after step {result['steps']}: the model in use is unchanged."
        yield line, _plot(points), summary(result, None), download, skip, hidden, hidden, result, []
        return
    trained = trainer.register(job, result["classes"])
    picker = gr.Dropdown(choices=ctx.models.choices(job.session), value=trained.value)
    shown = keep_misclassified(result, job.data, trainer.shown_folder(job.out))
    confusion = confusion_image(result)
    matrix = gr.update(value=confusion, visible=confusion is not None)
    gallery = gr.update(value=shown, visible=bool(shown))
    text = summary(result, trained.label)
    yield "Done.", _plot(points), text, download, picker, matrix, gallery, result, [p for p, _ in shown]


def open_photo(ctx: Context, shown: list[str] | None, event: gr.SelectData) -> str | dict:
    """The misclassified photo clicked on the result page, for the page's image (which Classify explains): its
    path from this session's own list, by the click's index (never a path that the click names)."""
    index = getattr(event, "index", None)
    if not shown or isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(shown):
        return gr.skip()
    return shown[index] if Path(shown[index]).is_file() else gr.skip()


def cancel(ctx: Context, request: gr.Request | None = None) -> str:
    """Stop this session's training job after its current step (the model in use stays as it was; the run
    folder, uncalibrated, is offered)."""
    asked = ctx.trainer.cancel(getattr(request, "session_hash", None) or "api")
    return "Cancelling after this step…" if asked else "No training job of yours is running."


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
    keep = (
        "It is this browser's only (a reload keeps it; another browser cannot use it) and is deleted after an hour."
        if public
        else "The picker keeps it chosen when the page reloads."
    )
    gr.Markdown(
        "Fine-tune the model in use (the picker above) on your own photos: a **zip with one folder per class** "
        "(`ants/1.jpg`, `bees/7.jpg`, …); optionally a folder `_other` of photos of none of your classes, which "
        f"helps set where “none of my classes” starts. Limits: {limits.text()}. A fifth of each class is held out to "
        "measure and calibrate the new model, which the picker then switches to. The training time covers the whole "
        "job once its process has started (a few seconds): reading your photos, training, calibrating on the held-out "
        f"photos and saving the model; a job too large to calibrate in it is refused before it trains. {keep}"
    )
    with gr.Row():
        photos = PathFile(  # no empty copy left in Gradio's cache per job
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
    curve = gr.LinePlot(
        _curve([]),
        x="step",
        y="loss",
        x_lim=[0, None],  # both from 0: the whole curve in sight as it falls (``_plot``)
        y_lim=[0, None],
        **CURVE_AXES,
        label="Training loss",
        elem_id="train-curve",  # no height: a set one cuts off the x axis's title and labels (Gradio 6.31)
    )
    result = gr.Markdown(label="Result", elem_id="train-result")
    with gr.Row():
        matrix = figure(
            "Confusion matrix (held-out photos)", "train-confusion", height=380, visible=False, min_width=300
        )
        wrong = gr.Gallery(
            label="Misclassified held-out photos (true → answered): click one to open it in Classify",
            columns=4,
            height="auto",
            object_fit="contain",
            allow_preview=False,
            visible=False,
            min_width=300,
            elem_id="train-misclassified",
            elem_classes=["tiles", "phone-2-columns"],
        )
    download = gr.File(label="Run folder (zip)", interactive=False, visible=False)  # shown with its zip
    details = gr.JSON(label="Result details", visible=False)  # the API's: the run's result, whole
    shown = gr.State([])  # the misclassified photos' paths, for a click to open one (``open_photo``)
    outputs = [progress, curve, result, download, page.picker.choice, matrix, wrong, details, shown]
    with gr.Row(visible=not public):
        repo = gr.Textbox(label="Hub repo (owner/name)", scale=2)
        token = gr.Textbox(label="Hugging Face token", type="password", scale=2)
        upload = gr.Button("Push to the Hub", scale=1)
    pushed = gr.Markdown(label="Pushed to the Hub")
    # no queue: a second job is refused at once ("try again in N min"); the job holds the gate itself (``train``)
    # the progress line alone shows that it runs: the picker, the curve and the result stay usable and readable
    own = {"compute": False, "options": {"concurrency_limit": None, "show_progress_on": [progress]}}
    inputs = [photos, page.picker.choice, minutes, double]
    wrong.select(None, None, None, js=SHOW_IMAGE_TAB_JS)
    private = {"api_visibility": "private"}
    return Tab(
        apis=[
            Api("train", train, inputs, outputs, None, triggers=[start.click], **own),
            Api("train_cancel", cancel, [], [progress], None, triggers=[stop.click], **own),
            Api("push", push, [repo, token], [pushed], None, [upload.click], False, private),
            Api("train_open", open_photo, [shown], [page.controls.image], request_only, [wrong.select], False, private),
        ]
    )
