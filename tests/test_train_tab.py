"""The Train tab (``webapp.tabs.train``, ``webapp.jobs.trainer``, ``webapp.jobs.trainset``): a zip of labelled photos
becomes a
folder of re-encoded images under names of ours (no member path reaches the disk), the limits refuse what breaks
them, one job runs at a time across the server, a trained model is served to its session under a private value
(public mode too, where local paths are refused) and deleted after its time (an injected clock), a public server
refuses to push, and a short run trains, calibrates and serves a model of the zip's classes. The result page
(``webapp.jobs.result_page``) reads as sentences, a table, a matrix and a gallery whose photos open in Classify; a bad
zip is a line in the progress that changes nothing else; a cancelled run leaves the model in use; the loss curve
has its axes named and room to show whole; Classify offers its examples only for a model of their classes."""

from __future__ import annotations

import io
import re
import sys
import threading
import time
import types
import zipfile
from dataclasses import fields
from pathlib import Path

import gradio as gr
import pytest
from gradio.data_classes import FileData
from PIL import Image

import app
import vit_core
from vit_core.finetune import FinetuneResult
from webapp.jobs import result_page, trainset
from webapp.jobs.trainer import PRIVATE_PREFIX, Trainer, TrainingBusy
from webapp.jobs.trainset import PUBLIC, Limits, class_of, decode_folder, from_zip
from webapp.jobs.worker import JobResult
from webapp.registry.access import Caller, ModelError, Trained, calling
from webapp.registry.catalog import ROOT
from webapp.registry.options import Options
from webapp.server.admission import Busy, Gate, rss
from webapp.tabs import classify, train
from webapp.ui.endpoints import Context
from webapp.ui.inputs import PathFile

from .test_tabs import architecture_path

SMALL = Limits(max_images=40, max_classes=3, max_minutes=1, max_zip_mb=1)


def _jpeg(colour: tuple[int, int, int], size: int = 40) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "JPEG")
    return buf.getvalue()


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def two_classes(path: Path, per_class: int = 8) -> Path:
    """Reddish and bluish squares, a little different each, in ``red/`` and ``blue/``."""
    members = {f"photos/red/{i}.jpg": _jpeg((200 + 5 * i, 20 * i, 10)) for i in range(per_class)}
    members |= {f"photos/blue/{i}.jpg": _jpeg((10, 20 * i, 200 + 5 * i)) for i in range(per_class)}
    return make_zip(path, members)


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    """A local server's context, whose Train tab writes its run folders to a temporary folder."""
    ctx = app.setup("bundled")
    ctx.trainer = Trainer(ctx.models, tmp_path_factory.mktemp("runs"), ttl=None)
    return ctx


@pytest.fixture(scope="module")
def public_ctx():
    return app.setup("bundled", options=Options(public=True, allow_any=False))


# ------------------------------------------------------------------------------------ the zip


def test_zip_becomes_a_folder_of_reencoded_images_under_our_names(tmp_path):
    members = {
        "photos/ants/a.jpg": _jpeg((255, 0, 0)),
        "photos/ants/b.png": _jpeg((250, 0, 0)),  # a JPEG named .png: decoded by its content
        "../../escape/x.jpg": _jpeg((0, 0, 255)),  # a path out of the archive: only its folder's name counts
        "escape/y.jpg": _jpeg((0, 0, 250)),
        "__MACOSX/photos/ants/._a.jpg": b"junk",
        "top.jpg": _jpeg((0, 255, 0)),  # in no class folder
        "photos/ants/broken.jpg": b"not an image",
        "we<ird>:na|me/z.jpg": _jpeg((9, 9, 9)),
        "we<ird>:na|me/w.jpg": _jpeg((8, 8, 8)),
    }
    found = from_zip(make_zip(tmp_path / "p.zip", members), tmp_path / "data", SMALL)
    assert found.counts == {"ants": 2, "escape": 2, "weirdname": 2}
    assert decode_folder(tmp_path / "data", lambda: False, time.time() + 60).counts == found.counts
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == [
        "data/ants/00000.jpg",
        "data/ants/00001.jpg",
        "data/escape/00000.jpg",
        "data/escape/00001.jpg",
        "data/weirdname/00000.jpg",
        "data/weirdname/00001.jpg",
        "p.zip",
    ]
    assert Image.open(tmp_path / "data/ants/00000.jpg").size == (40, 40)
    assert any("top.jpg" in s for s in found.skipped) and any("broken.jpg" in s for s in found.skipped)
    assert class_of("a/../c.jpg") is None and class_of("a/.hidden/c.jpg") == "hidden"  # a name, never a path


def test_limits_refuse_what_breaks_them(tmp_path):
    with pytest.raises(ValueError, match="at least 2 class"):
        from_zip(make_zip(tmp_path / "one.zip", {"a/1.jpg": _jpeg((1, 1, 1))}), tmp_path / "d1", SMALL)
    with pytest.raises(ValueError, match="at least 2 images"):
        lone = {"a/1.jpg": _jpeg((1, 1, 1)), "a/2.jpg": _jpeg((1, 1, 1)), "b/1.jpg": _jpeg((2, 2, 2))}
        from_zip(make_zip(tmp_path / "lone.zip", lone), tmp_path / "d2", SMALL)
    with pytest.raises(ValueError, match="More than 3 classes"):
        many = {f"c{i}/{j}.jpg": _jpeg((i, j, 0)) for i in range(4) for j in range(2)}
        from_zip(make_zip(tmp_path / "many.zip", many), tmp_path / "d3", SMALL)
    found = from_zip(two_classes(tmp_path / "big.zip", per_class=30), tmp_path / "d4", SMALL)
    assert sum(found.counts.values()) == SMALL.max_images  # the rest is not read
    assert any(f"at most {SMALL.max_images}" in s for s in found.skipped)
    big = make_zip(tmp_path / "mb.zip", {"a/1.jpg": _jpeg((1, 1, 1)), "a/pad.bin": bytes(1 << 20)})
    with pytest.raises(ValueError, match="at most 1 MB"):
        from_zip(big, tmp_path / "d5", SMALL)
    assert "2,000 images" in PUBLIC.text() and "5 minutes" in PUBLIC.text() and "50 MB" in PUBLIC.text()


# ------------------------------------------------------------------------------------ jobs and sessions


def test_one_job_at_a_time_across_the_server(ctx):
    clock = [1000.0]
    trainer = Trainer(ctx.models, None, ttl=None, clock=lambda: clock[0])
    job = trainer.start("visitor-a", minutes=3)
    clock[0] += 60
    with pytest.raises(TrainingBusy, match="try again in 3 min"):
        trainer.start("visitor-b", minutes=1)
    assert not trainer.cancel("visitor-b") and trainer.cancel("visitor-a") and job.stop_file.exists()
    trainer.finish(job)
    trainer.finish(trainer.start("visitor-b", minutes=1))


def test_trained_model_served_to_its_session_in_public_mode_and_deleted_after_an_hour(public_ctx, tmp_path):
    models = public_ctx.models
    clock = [5000.0]
    trainer = Trainer(models, None, ttl=3600, clock=lambda: clock[0])
    job = trainer.start("visitor", minutes=1)
    job.out.mkdir()
    app_model = models.folder_of(models.default)
    for path in app_model.iterdir():
        if path.is_file():
            (job.out / path.name).write_bytes(path.read_bytes())
    with pytest.raises(ModelError):  # public mode loads no local path it is sent
        models.access.resolve(str(job.out))
    trained = trainer.register(job, ["a", "b"])
    trainer.finish(job)
    assert trained.value.startswith(PRIVATE_PREFIX) and str(job.out) not in trained.value
    assert models.get(trained.value, wait=60)[0].config.num_classes == 10
    assert [t.value for t in trainer.of_session("visitor")] == [trained.value] and not trainer.of_session("other")
    clock[0] += 3599
    assert trainer.sweep() == [] and job.out.is_dir()
    clock[0] += 2
    assert trainer.sweep() == [trained.value]
    assert not job.folder.exists() and models.loaded(trained.value) is None
    with pytest.raises(gr.Error):
        models.get(trained.value)


def _on_load(ctx: Context, session: str, kept: dict | None = None) -> gr.Dropdown:
    """The picker as a page of ``session`` that loads now gets it (the page's load event), its browser's storage
    holding ``kept``."""
    (load,) = [fn for fn in app.build_ui(ctx).fns.values() if fn.api_name == "on_load"]
    *_, picker = load.fn(ctx.models.default, kept, request=types.SimpleNamespace(session_hash=session))
    return picker


def _listed_on_load(ctx: Context, session: str) -> list[tuple[str, str]]:
    """The picker's choices as a page of ``session`` that loads now gets them."""
    picker = _on_load(ctx, session)
    return [tuple(c) for c in (picker["choices"] if isinstance(picker, dict) else picker.choices)]


def _trained_copy(trainer: Trainer, models, session: str) -> tuple:
    """A run folder for ``session``: a copy of the app's model, registered as trained on two classes."""
    job = trainer.start(session, minutes=1)
    job.out.mkdir()
    for path in models.folder_of(models.default).iterdir():
        if path.is_file():
            (job.out / path.name).write_bytes(path.read_bytes())
    trained = trainer.register(job, ["ants", "bees"])
    trainer.finish(job)
    return trained


def test_a_page_that_loads_after_training_lists_the_trained_model_by_its_label(ctx, public_ctx):
    """Locally every page that loads after a training lists its model, under a readable label (not its token);
    a public server lists it for the session that trained it only. Recorded once: what the access rules serve,
    the picker lists and the trainer sweeps is the one registry, ``Models.trained``."""
    trained = _trained_copy(ctx.trainer, ctx.models, "trainer's page")
    assert trained.label.startswith("Trained here at ") and trained.label.endswith(": ants, bees")
    assert (trained.label, trained.value) in _listed_on_load(ctx, "a page opened later")
    assert ctx.models.access.resolve(trained.value).label == trained.label
    public = Trainer(public_ctx.models, None, ttl=3600)
    mine = _trained_copy(public, public_ctx.models, "visitor")
    assert (mine.label, mine.value) in _listed_on_load(public_ctx, "visitor")
    assert mine.value not in [v for _, v in _listed_on_load(public_ctx, "someone else")]
    public_ctx.models.forget(mine.value)
    assert public_ctx.models.trained.get(mine.value) is None and not public.of_session("visitor")


def test_the_misclassified_photos_outlive_the_job_as_long_as_the_model(tmp_path):
    """The result page's misclassified photos are what a click opens in Classify after the job has ended (its
    folder swept): they stay while the model is served. Mixed labels (the same colours in both classes) make
    some held-out photos wrong whatever the model learns."""
    members = {f"a/{i}.jpg": _jpeg((40 * i, 90, 200 - 40 * i)) for i in range(5)}
    members |= {f"b/{i}.jpg": _jpeg((40 * i + 5, 90, 195 - 40 * i)) for i in range(5)}
    ctx = app.setup("bundled")  # its own registry of trained models, which the sweep below empties
    ctx.trainer = Trainer(ctx.models, tmp_path / "runs", ttl=None)
    request = types.SimpleNamespace(session_hash="mixed")
    *_, last = train.train(ctx, str(make_zip(tmp_path / "mixed.zip", members)), ctx.models.default, 0.2, False, request)
    shown, details = last[8], last[7]
    assert last[0] == "Done." and details["details"]["misclassified"] and shown, last[0]
    assert all(Path(p).is_file() for p in shown)  # the job's folder is gone; these are not in it
    opened = train.open_photo(ctx, shown, types.SimpleNamespace(index=0))
    assert opened == shown[0] and Image.open(opened).size[0] > 0
    ctx.trainer.ttl, ctx.trainer.clock = 0.0, lambda: time.time() + 1  # the model's hour is over
    ctx.trainer.sweep()
    assert not any(Path(p).exists() for p in shown)  # gone with the model that they explain


def test_a_reload_keeps_the_trained_model_chosen_in_its_browser_only(ctx, public_ctx):
    """The page said "it stays in this browser session only", and a reload lost it on a public server (locally the
    reloaded picker was back on the bundled model): the browser keeps the model's value and the last choice, and
    a page loaded later in it, from the trainer's address, lists the model and is on it. Another address that
    presents the value gets nothing."""
    public = Trainer(public_ctx.models, None, ttl=3600)
    with calling(Caller("first page", "10.0.0.1")):
        mine = _trained_copy(public, public_ctx.models, "first page")
    kept = {"choice": mine.value, "trained": [mine.value]}
    with calling(Caller("after a reload", "10.0.0.1")):
        picker = _on_load(public_ctx, "after a reload", kept)
        assert picker.value == mine.value and (mine.label, mine.value) in [tuple(c) for c in picker.choices]
        assert public_ctx.models.get(mine.value, wait=60)[0] is not None  # it loads for this page
    with calling(Caller("elsewhere", "10.0.0.9")):
        picker = _on_load(public_ctx, "elsewhere", kept)
        assert picker.value != mine.value and mine.value not in [v for _, v in picker.choices]
        with pytest.raises(gr.Error, match="trained in another session"):
            public_ctx.models.get(mine.value)
    local = _trained_copy(ctx.trainer, ctx.models, "a local page")
    with calling(Caller("reloaded", "127.0.0.1")):
        assert _on_load(ctx, "reloaded", {"choice": local.value, "trained": []}).value == local.value
        assert _on_load(ctx, "reloaded", {"choice": "../../etc", "trained": [42, None]}).value != "../../etc"


def test_public_server_refuses_to_push(public_ctx):
    with pytest.raises(gr.Error, match="does not push"):
        train.push(public_ctx, "me/model", "hf_token")


# ------------------------------------------------------------------------------------ a short run


def test_a_short_run_trains_calibrates_and_serves_a_model_of_the_zip_classes(ctx, tmp_path):
    """Six seconds of training from the bundled model on two classes; the last update switches the picker to the
    new model, which Classify then explains with the zip's class names. The request, from the upload component to
    the picker's value, runs code of the app's modules that docs/ARCHITECTURE.md lists for the Train path (at most
    12 with the training process's ``jobs/worker``), every module entered in the server's threads counted."""
    request = types.SimpleNamespace(session_hash="s1")
    updates, names, entered = [], set(), set()

    def profile(frame, event, arg):
        if event == "call" and ROOT / "webapp" in (path := Path(frame.f_code.co_filename)).parents:
            entered.add(path.relative_to(ROOT).as_posix())

    gated = Context(ctx.models, gate=Gate(max_memory=rss() + (16 << 30)), trainer=ctx.trainer)  # as a server runs
    handler = gated.handler(train.train, None)  # the page's and the API's listener (it holds the gate itself)
    payload = FileData(path=str(two_classes(tmp_path / "p.zip")), orig_name="p.zip")
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        photos = PathFile(file_types=[".zip"]).preprocess(payload)
        for update in handler(photos, ctx.models.default, 0.1, False, request):
            updates.append(update)
            if isinstance(update[3], dict) and update[3].get("value"):  # read as Gradio does, before the job ends
                with zipfile.ZipFile(update[3]["value"]) as zf:
                    names = {Path(n).name for n in zf.namelist()}
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    stated = re.findall(r"`(webapp/[\w/]+\.py)`", architecture_path("The Train path"))
    got = entered | {"webapp/jobs/worker.py"}
    assert sorted(got) == sorted(stated) and len(stated) <= 12, (sorted(got - set(stated)), sorted(set(stated) - got))
    line, _, summary, download, picker, matrix, gallery, details, shown = updates[-1]
    assert line == "Done." and "Done" in summary and "red" in summary, updates[-2:]
    assert details["strategy"] in ("full", "lp-ft", "probe") and details["strategy_reason"] in summary
    assert "**How it trained**" in summary and "| red |" in summary and "| blue |" in summary
    assert "**Confidence**" in summary and "None of my classes" in summary
    assert set(details["details"]["accuracy"]) == {"blue", "red"} and "ece" in details["details"]
    assert matrix["visible"] and matrix["value"].size[0] > 200  # the confusion matrix drawn
    wrong = details["details"]["misclassified"]
    assert gallery["visible"] == bool(wrong) and len(shown) == len(gallery["value"]) == len(wrong)
    assert all(" → " in c for _, c in gallery["value"])
    _never_back_to_training(updates)
    value = picker["value"] if isinstance(picker, dict) else picker.value
    assert value.startswith(PRIVATE_PREFIX)
    assert {"model.safetensors", "config.json", "README.md", "ood.safetensors"} <= names
    assert "checkpoint.pt" not in names
    # the job's folder swept: no second copy of the zip, the run folder only what the download offers
    out = ctx.models.trained.get(value).out
    assert not Path(download["value"]).exists() and not any(ctx.trainer.root.glob("*/*.zip"))
    assert {p.name for p in out.iterdir()} >= {"model.safetensors"} and not (out / "checkpoint.pt").exists()
    model, _ = ctx.models.get(value, wait=60)
    assert model.label_names == ["blue", "red"] and model.calibration is not None
    Image.new("RGB", (40, 40), (230, 40, 10)).save(tmp_path / "red.jpg")
    labels, overlay, _, _, explains, _ = classify.classify(ctx, str(tmp_path / "red.jpg"), value)
    assert set(labels) == {"blue", "red"} and overlay is not None
    assert max(labels, key=labels.get) == "red" and "red (the predicted class)" in explains  # it learned colours
    assert any(str(u[0]).startswith("Training") or "Reading" in str(u[0]) for u in updates[1:-1])


def test_the_job_holds_its_estimate_in_the_memory_gate(ctx, tmp_path):
    """A server whose budget cannot hold the training process refuses the job before it starts one, and
    frees the slot for the next."""
    gate = Gate(max_memory=rss() + trainset.WORKER_BYTES // 2, max_wait=0)
    small = Context(ctx.models, gate=gate, trainer=ctx.trainer)
    photos = str(two_classes(tmp_path / "p.zip"))
    _, update = train.train(small, photos, ctx.models.default, 0.1, False, types.SimpleNamespace(session_hash="g"))
    assert update[0].startswith("⚠️ This request needs about") and _unchanged(update)
    assert issubclass(Busy, gr.Error)  # what ``train`` turns into its progress line
    assert train.estimate(ctx, ctx.models.get(ctx.models.default)[0], False, None) > trainset.WORKER_BYTES
    ctx.trainer.finish(ctx.trainer.start("next", 1))


def test_cancel_stops_the_run_and_keeps_the_model_as_it_was(ctx, tmp_path):
    request = types.SimpleNamespace(session_hash="s2")
    updates = []
    for update in train.train(ctx, str(two_classes(tmp_path / "p.zip")), ctx.models.default, 1.0, False, request):
        updates.append(update)
        if str(update[0]).startswith("Training"):
            assert "Cancelling" in train.cancel(ctx, request)
    assert "Cancelled" in updates[-1][2] and "uncalibrated" in updates[-1][2]
    assert train.cancel(ctx, request).startswith("No training job")
    line, _, _, download, picker, *_ = updates[-1]
    assert line.startswith("Cancelled after step") and download["visible"]  # the incomplete run, as a zip
    assert picker == gr.skip() and not ctx.trainer.of_session("s2")  # the model in use stays; none registered
    lines = [str(u[0]) for u in updates]
    assert not any("Finished" in t or "Done" in t or "Calibrating" in t for t in lines), lines
    after = lines[next(i for i, t in enumerate(lines) if t.startswith("Cancelling")) :]
    assert not any(t.startswith("Training") for t in after), lines  # once cancelling, it says so to the end
    _never_back_to_training(updates)


def _never_back_to_training(updates: list[tuple]) -> None:
    """The progress line never says "Training" again once it said "Calibrating" or "Cancelling"."""
    lines = [str(u[0]) for u in updates]
    later = [i for i, t in enumerate(lines) if t.startswith(("Calibrating", "Cancelling"))]
    assert not later or not any(t.startswith("Training") for t in lines[later[0] :]), lines


def test_every_phase_has_its_words_in_the_progress_line():
    """The phases after training ("done", "cancelled"), the plan ("features") and a step while cancelling read
    as what they are, never as a training step."""
    report = dict(step=7, total_steps=9, epoch=1, loss=0.5, val_accuracy=None, elapsed_s=3.0, eta_s=2.0)
    plan = "whole-model fine-tuning affords 9 epochs here"
    assert train._line(report | dict(phase="training")).startswith("Training: step 7 of ~9")
    staged = train._line(report | dict(phase="training", stage="whole model", best_accuracy=80.0, eta_s=12.0))
    assert staged.startswith("Training — whole model: step 7") and "(best so far 80.0%)" in staged
    assert staged.endswith("about 12 s of the budget left")
    assert train._line(report | dict(phase="training"), stopping=True) == "Cancelling: finishing step 7…"
    assert train._line(report | dict(phase="features", strategy=plan)) == f"Plan: {plan}."
    for phase in ("loading", "features", "calibrating", "done", "cancelled"):
        assert not train._line(report | dict(phase=phase)).startswith("Training"), phase


# ------------------------------------------------------------------------------------ problems, the page


def _unchanged(update: tuple) -> bool:
    """Whether ``update`` leaves every output but the progress line as it was."""
    return len(update) == train.OUTPUTS and all(u == gr.skip() for u in update[1:])


def test_a_bad_zip_is_a_line_in_the_progress_and_nothing_else_changes(ctx, tmp_path):
    """One class, a text file only, an empty zip, a file that is no zip, no upload, a budget over the limit:
    each is one update whose progress line says what is wrong, every other output (the picker, the curve,
    the previous result) left as it was, and the job slot free again; nothing raised (a raised error puts an
    error badge over every output)."""
    request = types.SimpleNamespace(session_hash="bad")
    one = make_zip(tmp_path / "one.zip", {f"ants/{i}.jpg": _jpeg((9 * i, 0, 0)) for i in range(4)})
    text = make_zip(tmp_path / "text.zip", {"ants/readme.txt": b"hello"})
    empty = make_zip(tmp_path / "empty.zip", {})
    (tmp_path / "notazip.zip").write_text("just text")
    cases = {
        one: "at least 2 class folders",
        text: "The zip holds 1 file but no photos",  # not "found 0", as for an empty zip
        empty: "The zip is empty",
        tmp_path / "notazip.zip": "This file is not a zip archive",  # said first, not "found 0 class folders"
        None: "Upload a zip of photos",
    }
    for photos, words in cases.items():
        checking, *updates = train.train(ctx, photos and str(photos), ctx.models.default, 0.1, False, request)
        assert checking[0] == "Checking the zip…" and _unchanged(checking)  # the last attempt's warning gone at once
        assert len(updates) == 1 and _unchanged(updates[0]), (photos, updates)
        assert updates[0][0].startswith("⚠️ ") and words in updates[0][0], (photos, updates[0][0])
    _, over = train.train(ctx, str(one), ctx.models.default, 99.0, False, request)
    assert "at most" in over[0] and _unchanged(over)
    ctx.trainer.finish(ctx.trainer.start("after the bad zips", 1))  # the slot is free


def test_the_page_shows_the_result_and_the_progress_without_covering_the_rest(ctx):
    """``/train``'s outputs keep their order (progress, curve, result, zip, model) and add the result page's
    after them; only the progress line shows that it runs (the picker and the curve stay usable); a click on a
    misclassified photo puts it into the page's image, which Classify explains; the loss curve has its axes
    named, starts from 0 and is drawn whole."""
    fns = {fn.api_name: fn for fn in app.build_ui(ctx).fns.values()}
    run = fns["train"]
    ids = [getattr(o, "elem_id", None) for o in run.outputs]
    assert ids[:3] == ["train-progress", "train-curve", "train-result"] and len(ids) == train.OUTPUTS
    assert run.outputs[4] is not None and ids[5:7] == ["train-confusion", "train-misclassified"]
    assert [o.elem_id for o in run.show_progress_on] == ["train-progress"]
    (image,) = fns["train_open"].outputs
    assert image.elem_id == "image"  # the page's image control, laid out by Classify
    curve = run.outputs[1]
    assert curve.x_title and curve.y_title and curve.x_lim[0] == curve.y_lim[0] == 0
    assert curve.height is None  # Gradio 6.31 cuts the x axis's title and labels off a plot of a set height
    update = train._plot([{"step": 1, "loss": 0.7}, {"step": 2, "loss": 0.6}])
    assert update["x_title"] == curve.x_title and update["y_title"] == curve.y_title  # kept as it updates
    assert update["y_lim"][0] == 0 and update["y_lim"][1] > 0.7 and len(update["value"]) == 2


def test_a_click_on_a_misclassified_photo_opens_it_by_its_index_only(tmp_path):
    photos = []
    for i in range(2):
        (tmp_path / f"{i}.jpg").write_bytes(_jpeg((i, i, i)))
        photos.append(str(tmp_path / f"{i}.jpg"))
    click = types.SimpleNamespace
    assert train.open_photo(None, photos, click(index=1)) == photos[1]
    for index in (2, -1, True, "0", None):
        assert train.open_photo(None, photos, click(index=index)) == gr.skip(), index
    assert train.open_photo(None, [], click(index=0)) == gr.skip()
    (tmp_path / "0.jpg").unlink()  # swept with the job's folder
    assert train.open_photo(None, photos, click(index=0)) == gr.skip()


def _result(data: Path) -> dict:
    """A run's result as the training process reports it, for two classes, one photo of each answered wrong."""
    for name in ("ants", "bees"):
        (data / name).mkdir(parents=True)
        for i in range(3):
            (data / name / f"{i:05d}.jpg").write_bytes(_jpeg((10 * i, 0, 0)))
    wrong = [
        dict(file="ants/00001.jpg", label="ants", predicted="bees", confidence=0.71),
        dict(file="bees/00002.jpg", label="bees", predicted="ants", confidence=0.55),
        dict(file="../../etc/passwd", label="bees", predicted="ants", confidence=0.5),  # never followed
    ]
    details = dict(
        accuracy={"ants": 80.0, "bees": 75.0},
        confusion=[[4, 1], [1, 3]],
        misclassified=wrong,
        ece=0.042,
        threshold=812.5,
        temperature_note=None,
        held_out=9,
        held_out_turned_away=1,
        stages=[
            dict(name="linear probe", epochs=1, steps=1, images_seen=48, seconds=3.2, held_out_top1=66.7, kept=False),
            dict(
                name="last 1 of 2 blocks",
                epochs=4,
                steps=8,
                images_seen=96,
                seconds=40.0,
                held_out_top1=77.8,
                kept=True,
            ),
        ],
    )
    reason = "a linear probe first, then the last block for 4 epochs, the best on the held-out photos kept"
    return dict(
        complete=True,
        classes=["ants", "bees"],
        train_images=24,
        val_images=9,
        val_accuracy=77.8,
        temperature=1.3,
        ood_threshold=812.5,
        steps=12,
        strategy="lp-ft",
        strategy_reason=reason,
        details=details,
    )


def test_the_result_page_reads_as_sentences_a_table_a_matrix_and_a_gallery(tmp_path):
    result = _result(tmp_path / "data")
    text = result_page.summary(result, "Trained here at 10:00: ants, bees")
    assert "**Done**: held-out accuracy **77.8%** on 9 photos." in text  # the matrix's: 7 of 9, as the table
    assert "**How it trained**: in stages, a new head first" in text and result["strategy_reason"] in text
    assert "| **last 1 of 2 blocks (kept)** | 4 epochs, 8 steps, 96 images, 40 s | 77.8% |" in text  # kept: marked
    assert "| linear probe | 1 epoch, 1 step, 48 images, 3 s | 66.7% |" in text
    assert "| ants | 5 | 4 | 80.0% |" in text and "| bees | 4 | 3 | 75.0% |" in text
    assert "4.2 points" in text and "812" not in text  # the check in words, never its raw threshold
    assert "than 95% of its held-out photos" in text and "of its own 9 held-out photos it turns away 1" in text
    others = dict(result["details"], kept=0.92, others=10, others_chose=5, others_measured=5, others_turned_away=0.8)
    others |= dict(score="energy")
    text_others = result_page.summary(result | dict(details=others), None)
    assert "than 92% of its held-out photos" in text_others
    assert "5 of 10 photos of other things (`_other`) chose how" in text_others
    assert "it turns away 80% of the 5 that measure it" in text_others
    assert "Trained here at 10:00" in text and "- 3 held-out photos misclassified: click one below" in text
    one = result | dict(details=result["details"] | dict(misclassified=result["details"]["misclassified"][:1]))
    assert "- 1 held-out photo misclassified: click one below" in result_page.summary(one, None)
    assert result_page.confusion_image(result).size[0] > 200
    shown = result_page.keep_misclassified(result, tmp_path / "data", tmp_path / "kept")
    assert [c for _, c in shown] == ["ants → bees (71%)", "bees → ants (55%)"]
    assert all(Path(p).parent == tmp_path / "kept" and Path(p).is_file() for p, _ in shown)
    other = result | dict(val_accuracy=66.7)  # the run's evaluation, by a tie the other way: the table's wins
    assert "**77.8%**" in result_page.summary(other, None)
    none = result | dict(details=result["details"] | dict(threshold=None))
    assert "no check was fitted" in result_page.summary(none, None)
    cancelled = result | dict(complete=False, details={})
    text = result_page.summary(cancelled, None)
    assert text.startswith("**Cancelled** after 12 steps: the model in use is unchanged") and "picker" not in text
    assert result_page.confusion_image(cancelled) is None


def test_classify_offers_its_examples_only_for_a_model_of_their_classes(ctx, tmp_path):
    """The examples are CIFAR-10 photos labelled with their classes: offered for the bundled model and for a model
    with one of them among its classes' words (ImageNet's), not for a model trained on ants and bees (a page that
    loads it, or switches to it, hides them)."""
    cfg = vit_core.ViTConfig(
        img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=2, label_names=("ants", "bees")
    )
    vit_core.save_pretrained(vit_core.create_model(cfg), tmp_path / "ants_bees")
    value = PRIVATE_PREFIX + "examples-test"
    ctx.models.trained.add(Trained(value, "Trained here: ants, bees", tmp_path / "ants_bees", "ex", 0.0))
    (load,) = [fn for fn in app.build_ui(ctx).fns.values() if fn.api_name == "on_load"]
    (at,) = [i for i, o in enumerate(load.outputs) if isinstance(o, gr.Dataset)]
    request = types.SimpleNamespace(session_hash="ex")
    shown = load.fn(ctx.models.default, None, request=request)[at]
    hidden = load.fn(value, None, request=request)[at]
    assert _visible(shown) is True and _visible(hidden) is False
    ctx.models.forget(value)
    # ImageNet's names hold the examples' classes as words: its models keep them (the default with the Hub)
    imagenet = vit_core.create_model(cfg.replace(label_names=("goldfish, Carassius auratus", "tabby, tabby cat")))
    assert classify.examples_fit(imagenet) and not classify.examples_fit(vit_core.create_model(cfg))


def _visible(update: object) -> bool:
    return update["visible"] if isinstance(update, dict) else update.visible


def test_the_result_pages_facts_agree_with_its_sentences(tmp_path):
    """A run whose held-out photos could not set the temperature, kept as a linear probe: the facts under the
    result page say no temperature was fitted (they said "temperature 1.000" under the sentence that T = 1 was
    kept) and do not count its zero steps."""
    result = _result(tmp_path / "data")
    note = "T = 1 kept: the held-out images could not set the temperature (its fit on them ran to the edge)"
    probe = result | dict(steps=0, temperature=1.0, details=result["details"] | dict(temperature_note=note))
    text = result_page.summary(probe, None)
    assert "no temperature fitted (T = 1 kept)" in text and "temperature 1.000" not in text
    assert "24 photos\n" in text + "\n" and "0 steps" not in text


def test_the_training_process_reports_its_result_by_a_dataclass_of_the_librarys_fields():
    """The worker's result line is ``JobResult`` (its own fields, not a hand-kept list), each one a field of the
    library's ``FinetuneResult`` that the result page reads."""
    ours, library = {f.name for f in fields(JobResult)}, {f.name for f in fields(FinetuneResult)}
    assert ours <= library and {"complete", "classes", "details", "steps", "strategy"} <= ours
