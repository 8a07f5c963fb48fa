"""The Train tab's jobs on a public server (issue #57): a zip's decoding is costed from its headers and done inside
the job's budget where Cancel reaches it, the smallest training set trains, a job's folders are swept however it
ends (and a dead process's at start), what training holds on disk is capped, a trained model and its job are their
caller's (session and address), and "try again in N min" counts what jobs here ran past their budget."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import gradio as gr
import httpx
import pytest
from PIL import Image

from tests.test_train_tab import ctx, make_zip, public_ctx, two_classes  # noqa: F401 (fixtures)
from webapp.jobs.trainer import GRACE_S, Trainer, TrainingBusy, zip_run
from webapp.jobs.trainset import Limits, Stopped, decode_folder, from_zip
from webapp.registry.access import NOT_YOURS, Caller, ModelError, Trained, caller, calling
from webapp.registry.catalog import ROOT
from webapp.server import tempfiles
from webapp.server.sessions import Sessions
from webapp.tabs import batch, train
from webapp.ui.endpoints import Context


def _png(side: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (side, side), (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue()


def _left_in(trainer: Trainer) -> list[str]:
    """What the trainer's folder holds besides its lock."""
    return sorted(p.name for p in trainer.root.iterdir() if p.name != ".in-use")


# ------------------------------------------------------------------------------------ decoding


def test_a_zip_too_costly_to_decode_is_refused_from_its_headers(tmp_path):
    """40 one-colour 3,000 x 3,000 PNGs: a zip of under a megabyte that takes seconds to decode. Refused from the
    headers in milliseconds, without decoding one."""
    png = _png(3000)
    members = {f"c{i % 2}/{i}.png": png for i in range(40)}
    limits = Limits(max_images=100, max_classes=3, max_minutes=1, max_zip_mb=5, max_decode_mp=100)
    t = time.perf_counter()
    with pytest.raises(ValueError, match="too large to decode"):
        from_zip(make_zip(tmp_path / "big.zip", members), tmp_path / "data", limits)
    assert time.perf_counter() - t < 5  # decoding 40 of them takes ~5 s here; the headers ~10 ms


def test_decoding_stops_at_the_stop_flag_and_the_deadline(tmp_path):
    members = {f"c{i % 2}/{i}.png": _png(300) for i in range(6)}
    found = from_zip(make_zip(tmp_path / "p.zip", members), tmp_path / "d", Limits(10, 3, 1, 1))
    assert found.counts == {"c0": 3, "c1": 3} and not list((tmp_path / "d").rglob("*.jpg"))  # undecoded yet
    calls = []
    with pytest.raises(Stopped):
        decode_folder(tmp_path / "d", lambda: calls.append(1) or len(calls) > 2, time.time() + 60)
    assert len(list((tmp_path / "d").rglob("*.jpg"))) == 2  # stopped before the third
    with pytest.raises(ValueError, match="whole time budget"):
        decode_folder(tmp_path / "d", lambda: False, deadline=100.0, clock=lambda: 101.0)


def test_a_folder_of_other_things_is_no_class_and_not_counted_as_one(tmp_path):
    """``_other`` (any case) holds photos of none of the classes: kept apart, outside the class limit and the
    two-class minimum, said in the summary line, and decoded with the classes."""
    members = {f"c{i % 2}/{i}.png": _png(40) for i in range(4)} | {f"_Other/{i}.png": _png(40) for i in range(3)}
    found = from_zip(make_zip(tmp_path / "p.zip", members), tmp_path / "d", Limits(10, 2, 1, 1))
    assert found.counts == {"c0": 2, "c1": 2} and found.others == 3 and found.images == 7
    assert "4 images in 2 classes" in found.text() and "3 photos of other things (_other)" in found.text()
    decoded = decode_folder(tmp_path / "d", lambda: False, time.time() + 60)
    assert decoded.others == 3 and len(list((tmp_path / "d" / "_other").glob("*.jpg"))) == 3
    alone = {"c0/1.png": _png(40), "c0/2.png": _png(40)} | {f"_other/{i}.png": _png(40) for i in range(3)}
    with pytest.raises(ValueError, match="at least 2 class folders"):
        from_zip(make_zip(tmp_path / "q.zip", alone), tmp_path / "e", Limits(10, 2, 1, 1))
    # issue 66: only photos of other things: told it needs two classes, not "no photos ... every one was skipped"
    only = {f"_other/{i}.png": _png(40) for i in range(12)}
    with pytest.raises(ValueError, match=r"at least 2 class folders .* found 0; the 12 photos in _other") as e:
        from_zip(make_zip(tmp_path / "o.zip", only), tmp_path / "f", Limits(20, 2, 1, 1))
    assert "skipped" not in str(e.value)


def test_cancel_stops_a_job_while_it_decodes(ctx, tmp_path):  # noqa: F811
    """80 one-colour 3,000 x 3,000 PNGs take the training process ~12 s to decode here: Cancel, sent as soon as it
    reads them, ends the job within seconds with a sentence, and frees the slot and the job's folder."""
    png = _png(3000)
    members = {f"c{i % 2}/{i}.png": png for i in range(80)}
    photos = str(make_zip(tmp_path / "slow.zip", members))
    request = types.SimpleNamespace(session_hash="slow")
    updates, cancelled = [], None
    for update in train.train(ctx, photos, ctx.models.default, 1.0, False, request):
        updates.append(update)
        if "Reading the photos" in str(update[0]) and cancelled is None:
            cancelled = time.perf_counter()
            assert "Cancelling" in train.cancel(ctx, request)
    assert "Cancelled while reading the photos" in updates[-1][0], updates[-1]  # in the tab's own status line
    assert cancelled is not None and time.perf_counter() - cancelled < 10, updates
    assert _left_in(ctx.trainer) == []
    ctx.trainer.finish(ctx.trainer.start("next", 1))  # the slot is free


def test_the_smallest_training_set_trains(ctx, tmp_path):  # noqa: F811
    """2 classes of 2 photos: one a class to train on and one held out (the Mahalanobis fit on one image a class
    raised ``linalg.inv``'s error in the training process)."""
    request = types.SimpleNamespace(session_hash="tiny")
    photos = str(two_classes(tmp_path / "p.zip", per_class=2))
    updates = list(train.train(ctx, photos, ctx.models.default, 0.1, False, request))  # the page's least
    assert "Done" in updates[-1][2] and "None of my classes" in updates[-1][2], updates[-1]


# ------------------------------------------------------------------------------------ disk


def test_every_folder_of_a_job_goes_when_it_ends_however_it_ends(public_ctx, tmp_path):  # noqa: F811
    trainer = Trainer(public_ctx.models, None, ttl=3600)
    failed = trainer.start("a", 1)
    for name in ("data/c/00000.img", "job.json", "log.txt", "stop", f"{failed.out.name}/checkpoint.pt"):
        (failed.folder / name).parent.mkdir(parents=True, exist_ok=True)
        (failed.folder / name).write_bytes(b"x")
    trainer.finish(failed)  # failed or cancelled before a model: nothing left
    assert _left_in(trainer) == []
    done = trainer.start("a", 1)
    done.out.mkdir()
    for path in public_ctx.models.folder_of(public_ctx.models.default).iterdir():
        if path.is_file():
            (done.out / path.name).write_bytes(path.read_bytes())
    (done.out / "checkpoint.pt").write_bytes(bytes(1000))
    (done.folder / "job.json").write_text("{}")
    zip_run(done.out, done.folder / f"{done.out.name}.zip")
    trainer.register(done, ["a", "b"])
    trainer.finish(done)  # served: its run folder only, without the optimizer's state
    assert [p.relative_to(trainer.root).as_posix() for p in trainer.root.glob("*/*")] == [
        f"{done.folder.name}/{done.out.name}"
    ]
    assert not (done.out / "checkpoint.pt").exists() and (done.out / "model.safetensors").exists()
    # a zip refused by the tab leaves nothing either
    bad = str(make_zip(tmp_path / "one.zip", {"a/1.jpg": b"not an image"}))
    refused = Trainer(public_ctx.models, None, ttl=3600)
    _, refusal = train.train(Context(public_ctx.models, trainer=refused), bad, public_ctx.models.default, 0.1)
    assert "at least 2 class" in refusal[0]  # in the tab's own status line
    assert _left_in(refused) == []


def test_a_server_removes_the_training_folders_of_dead_processes_at_start(tmp_path):
    live = tempfiles.own_folder("vit-test-train-")  # this process's: held
    dead = Path(tempfiles.tempfile.mkdtemp(prefix="vit-test-train-"))
    (dead / "job" / "data").mkdir(parents=True)
    (dead / ".in-use").touch()  # a lock file no process holds
    os.utime(dead, (time.time() - 60, time.time() - 60))
    os.utime(live, (time.time() - 60, time.time() - 60))
    unlocked = Path(tempfiles.tempfile.mkdtemp(prefix="vit-test-train-"))  # an older version's, maybe live
    os.utime(unlocked, (time.time() - 60, time.time() - 60))
    assert tempfiles.sweep_dead_folders("vit-test-train-") >= 1
    assert not dead.exists() and live.is_dir() and unlocked.is_dir()
    os.utime(unlocked, (time.time() - 2 * tempfiles.UNLOCKED_STALE_S,) * 2)
    tempfiles.sweep_dead_folders("vit-test-train-")
    assert not unlocked.exists()


def registered(trainer: Trainer, who: Caller, nbytes: int = 3000) -> Trained:
    """A model of ``nbytes`` trained here by ``who`` (a job started, its weights written, registered, finished)."""
    with calling(who):
        job = trainer.start(who.session, 1)
        job.out.mkdir()
        (job.out / "model.safetensors").write_bytes(bytes(nbytes))
        trained = trainer.register(job, ["a", "b"])
        trainer.finish(job)
    return trained


def test_what_training_holds_is_capped_per_address_and_in_all(public_ctx, monkeypatch):  # noqa: F811
    models = public_ctx.models
    trainer = Trainer(models, None, ttl=3600)
    trained = registered(trainer, Caller("s1", "10.0.0.1"))
    monkeypatch.setattr("webapp.jobs.trainer.JOB_RESERVE", 1000)
    monkeypatch.setattr("webapp.jobs.trainer.MAX_HELD_PER_ADDRESS", 3500)
    with calling(Caller("s2", "10.0.0.1")), pytest.raises(TrainingBusy, match="room one visitor has"):
        trainer.start("s2", 1)
    with calling(Caller("s3", "10.0.0.2")):
        trainer.finish(trainer.start("s3", 1))  # another address has room
    monkeypatch.setattr("webapp.jobs.trainer.MAX_HELD_BYTES", 3500)
    with calling(Caller("s3", "10.0.0.2")), pytest.raises(TrainingBusy, match="as many trained models"):
        trainer.start("s3", 1)
    monkeypatch.setattr("webapp.jobs.trainer.MAX_HELD_BYTES", 10**12)
    monkeypatch.setattr("webapp.jobs.trainer.MIN_FREE_DISK", 1 << 60)  # the disk: checked before every job
    with pytest.raises(TrainingBusy, match="disk is nearly full"):
        trainer.start("s4", 1)
    models.forget(trained.value)


OTHER_SERVER = """
import os, sys, time
from webapp.server import tempfiles
csv = tempfiles.process_folder() / "batch" / "x" / "predictions.csv"
csv.parent.mkdir(parents=True)
csv.write_text("file")
old = time.time() - 7200
for path in (csv.parent, csv):
    os.utime(path, (old, old))
print(csv, flush=True)
sys.stdin.read()
"""


def test_each_server_sweeps_only_its_own_folders():
    """Issue 66: every public server swept the shared ``<tmp>/vit_core_app``, so a second one deleted a live one's
    Batch CSVs. Now each keeps its files in its own folder: another live server's start-up sweep and its Batch
    sweep (CSVs over ``CSV_TTL_S``) leave them, and they go only once that server is dead."""
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_SERVER], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        theirs = Path(other.stdout.readline().strip())
        assert theirs.is_file()
        tempfiles.sweep_dead_folders(tempfiles.PROCESS_PREFIX)  # this server's start
        mine = batch.write_csv([], ["a", "b"], 1)  # this server's Batch, sweeping its old CSVs
        assert theirs.is_file() and mine.parents[2] == tempfiles.process_folder() != theirs.parents[2]
    finally:
        other.stdin.close()
        other.wait()
        other.stdout.close()
    assert not theirs.exists()  # it exited normally: its folder went with it


# ------------------------------------------------------------------------------------ whose


def test_a_trained_model_and_its_job_are_their_callers(public_ctx):  # noqa: F811
    """On a public server another session, or the same session hash sent from another address (a REST body may
    name any), is refused the model in a sentence and cannot cancel the job."""
    models = public_ctx.models
    trainer = Trainer(models, None, ttl=3600)
    owner = Caller("s1", "10.0.0.1")
    with calling(owner):
        job = trainer.start("s1", 1)
    for other in (Caller("s2", "10.0.0.1"), Caller("s1", "10.0.0.9")):
        with calling(other):
            assert not trainer.cancel(other.session) and not job.stop_file.exists()
    with calling(owner):
        assert trainer.cancel("s1") and job.stop_file.exists()
    job.out.mkdir()
    for path in models.folder_of(models.default).iterdir():
        if path.is_file():
            (job.out / path.name).write_bytes(path.read_bytes())
    trained = trainer.register(job, ["a", "b"])
    trainer.finish(job)
    for other in (Caller("s2", "10.0.0.1"), Caller("s1", "10.0.0.9")):
        with calling(other):
            with pytest.raises(ModelError, match="trained in another session"):
                models.access.resolve(trained.value)
            with pytest.raises(gr.Error, match="trained in another session"):
                models.get(trained.value)
            assert models.label_of(trained.value) == trained.value and not models.trained.shown_to("s1", True)
    with calling(owner):
        assert models.get(trained.value, wait=60)[0] is not None
    assert "another session" in NOT_YOURS
    models.forget(trained.value)


def test_the_caller_reaches_the_handlers_from_gradios_request():
    """``Sessions`` runs every request as its caller: the session hash Gradio was sent and the address."""
    with gr.Blocks() as demo:
        out = gr.Textbox()
        gr.Button().click(lambda: repr(caller()), None, out, api_name="who")
    demo.queue().launch(prevent_thread_lock=True, server_name="127.0.0.1")
    try:
        Sessions().install(demo)
        base = f"http://127.0.0.1:{demo.server_port}/gradio_api"
        event = httpx.post(f"{base}/call/who", json={"data": [], "session_hash": "abc"}).json()["event_id"]
        text = httpx.get(f"{base}/call/who/{event}", timeout=30).text
        assert "Caller(session='abc', address='127.0.0.1')" in text, text
    finally:
        demo.close()


# ------------------------------------------------------------------------------------ try again in N min


def test_try_again_counts_the_overrun_this_server_measured(public_ctx):  # noqa: F811
    """A job's budget covers all it does, so "try again in N min" is the budget left and then the longest a job here
    ran past its budget (its process's start, what the calibration's estimate missed): ``OVERRUN_S`` at first."""
    clock = [1000.0]
    trainer = Trainer(public_ctx.models, None, ttl=None, clock=lambda: clock[0])
    first = trainer.start("a", 1)
    clock[0] += 10  # 50 s of budget left, then 30 s: 80 s
    with pytest.raises(TrainingBusy, match="try again in 2 min"):
        trainer.start("b", 1)
    clock[0] += 50 + 100  # it ends 100 s past its budget
    trainer.finish(first)
    assert trainer.overrun_s == 100
    second = trainer.start("c", 1)
    clock[0] += 45  # 15 s of budget left, then 100 s: 115 s
    with pytest.raises(TrainingBusy, match="try again in 2 min"):
        trainer.start("d", 1)
    clock[0] += 15 + 300  # past its kill (budget + GRACE_S): at most a minute
    with pytest.raises(TrainingBusy, match="try again in 1 min"):
        trainer.start("d", 1)
    trainer.finish(second)
    assert trainer.overrun_s == GRACE_S  # a killed job's overrun: never counted past the kill
