"""The Train tab's training processes tied to their server (issue 66): a server killed mid-job takes its worker
with it, a worker that stops reporting is ended and its visitor told, and only complete runs are offered, what a
crashed job left swept at the next start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from bench.hostile.server import training_workers
from tests.test_train_jobs import _png, registered
from tests.test_train_tab import ctx, make_zip, public_ctx, two_classes  # noqa: F401 (fixtures)
from webapp.jobs import trainer as trainer_module
from webapp.jobs import worker
from webapp.jobs.trainer import Trainer, TrainingBusy, sweep_crashed
from webapp.jobs.trainset import Limits, from_zip
from webapp.registry import catalog
from webapp.registry.access import Caller, calling
from webapp.registry.catalog import ROOT

LIMITS = Limits(max_images=100, max_classes=3, max_minutes=5, max_zip_mb=10)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run_folder(out: Path, *, calibrated: bool, card: bool) -> Path:
    """A run folder as the worker writes it: weights and config every epoch; calibration and card at the end."""
    out.mkdir(parents=True)
    save_file({"w": torch.zeros(1)}, out / "model.safetensors")
    config = {"architecture": "vit"} | ({"calibration": {"temperature": 1.0}} if calibrated else {})
    (out / "config.json").write_text(json.dumps(config))
    (out / "checkpoint.pt").write_bytes(b"x")
    if card:
        (out / "README.md").write_text("card")
    return out


def test_only_complete_runs_are_offered_and_a_crashed_jobs_run_is_swept(tmp_path, monkeypatch):
    """A job killed mid-way left ``runs/app-...`` with weights, config and checkpoint (no card, no calibration):
    the picker offered it and nothing removed it. Now only complete runs are listed, and the start-up sweep removes
    an incomplete one whose job no live server holds, keeping a live job's and every complete run."""
    monkeypatch.setattr(catalog, "ROOT", tmp_path)
    runs = tmp_path / "runs"
    _run_folder(runs / "app-20260101-000000-dead", calibrated=False, card=False)
    _run_folder(runs / "app-20260101-000001-done", calibrated=True, card=True)
    _run_folder(runs / "app-20260101-000002-uncarded", calibrated=True, card=False)
    _run_folder(runs / "cli-run", calibrated=False, card=False)  # not the app's: never removed
    assert catalog.run_folders() == ["runs/app-20260101-000001-done"]
    (runs / ".app-20260101-000000-dead.in-use").touch()  # its server died: nobody holds the lock
    live = runs / "app-20260101-000003-live"
    held = trainer_module._hold(live)  # a live server's job, its folder being written
    _run_folder(live, calibrated=False, card=False)
    try:
        assert sweep_crashed(runs) == ["app-20260101-000000-dead"]
    finally:
        held.close()
    left = sorted(p.name for p in runs.iterdir())
    assert left == [
        ".app-20260101-000003-live.in-use",
        "app-20260101-000001-done",
        "app-20260101-000002-uncarded",  # no lock file (an older version's): removed only after a day
        "app-20260101-000003-live",
        "cli-run",
    ]


SERVER = """
import sys
from pathlib import Path
import app
from webapp.jobs.trainer import Trainer
from webapp.jobs.trainset import Limits, from_zip
ctx = app.setup("bundled")
trainer = Trainer(ctx.models, Path(sys.argv[2]), ttl=None, threads=1)
job = trainer.start("s", 1.0)
from_zip(sys.argv[1], job.data, Limits(300, 3, 5, 10))
for report in trainer.run(job, ctx.models.access.resolve(ctx.models.default).source, None):
    print("report", report.get("phase"), flush=True)
"""


def test_a_server_killed_mid_job_takes_its_worker_with_it(tmp_path):
    """A server killed with SIGKILL while its job ran left the worker running on (73-100 s, up to its budget),
    beside the next server's job. Now the worker is killed with its server (its parent-death signal): gone
    within 10 s of the kill, and the next start removes the half-written run it left."""
    # 240 one-colour 3,000 x 3,000 PNGs: ~35 s of decoding here, during which the worker writes nothing but its
    # heartbeat, from a thread of its own (which the dead server's pipe ends): without the parent-death signal it
    # ran on until its next report, after the decoding (which the kill makes free: this takes a second now)
    png = _png(3000)
    photos = make_zip(tmp_path / "slow.zip", {f"c{i % 2}/{i}.png": png for i in range(240)})
    runs = tmp_path / "runs"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(photos), str(runs)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout.readline().startswith("report"), "the job never reported"
        (worker,) = training_workers(server.pid)
        server.send_signal(signal.SIGKILL)
        server.wait()
        killed = time.monotonic()
        while _alive(worker) and time.monotonic() - killed < 30:
            time.sleep(0.1)
        gone_after = time.monotonic() - killed
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    assert not _alive(worker) and gone_after < 10, gone_after
    sweep_crashed(runs)
    assert [p.name for p in runs.iterdir() if not p.name.startswith(".")] == []


def test_a_stopped_worker_is_ended_and_its_visitor_told(ctx, tmp_path):  # noqa: F811
    """A worker stopped with SIGSTOP was trusted for 192.7 s ("about 7 s left"), then "training failed"; others were
    told "try again in 1 min" the whole time. Now a worker silent for ``silent_s`` after a report is ended, its
    visitor told so in words, the slot freed, and the wait told to others was at least the real one."""
    trainer = Trainer(ctx.models, tmp_path / "runs", ttl=None, threads=1)
    trainer.silent_s = 4.0  # the server's default is 20 s; the mechanism is the same
    job = trainer.start("stopped", 1.0)
    from_zip(two_classes(tmp_path / "photos.zip"), job.data, LIMITS)
    stopped = told = None
    try:
        with pytest.raises(RuntimeError, match=r"stopped answering for 4 s and was ended; nothing of it was kept"):
            for _ in trainer.run(job, ctx.models.access.resolve(ctx.models.default).source, None):
                if stopped is None:
                    (worker,) = training_workers(os.getpid())
                    os.kill(worker, signal.SIGSTOP)
                    stopped, told = time.monotonic(), trainer.left(job)
        ended = time.monotonic() - stopped
    finally:
        trainer.finish(job)
    assert ended < 4 + 5, ended  # its silence, then the watchdog's next look
    assert told >= ended  # "try again in" was true
    assert not _alive(worker)
    trainer.finish(trainer.start("next", 1.0))  # the slot is free


def test_a_model_no_page_can_reach_counts_against_no_address(public_ctx, monkeypatch):  # noqa: F811
    """A visitor's model whose pages are all gone (its sessions' state expired; a REST call's at once) counted
    against its address for its hour: five reload-and-retrain rounds of ViT-B/16 locked an address out. Now it
    counts only while a page of it lives, and is the first deleted when the server's total needs room."""
    models = public_ctx.models
    trainer = Trainer(models, None, ttl=3600)
    alive = {"s1"}
    trainer.live = alive.__contains__
    trained = registered(trainer, Caller("s1", "10.0.0.1"))
    monkeypatch.setattr("webapp.jobs.trainer.JOB_RESERVE", 1000)
    monkeypatch.setattr("webapp.jobs.trainer.MAX_HELD_PER_ADDRESS", 3500)
    with calling(Caller("s2", "10.0.0.1")), pytest.raises(TrainingBusy, match="room one visitor has"):
        trainer.start("s2", 1)  # its page lives: it counts
    alive.clear()  # the page closed and its session expired
    with calling(Caller("s2", "10.0.0.1")):
        trainer.finish(trainer.start("s2", 1))
    assert models.trained.get(trained.value) is not None  # kept while room allows (a reload may come back)
    monkeypatch.setattr("webapp.jobs.trainer.MAX_HELD_BYTES", 3500)
    with calling(Caller("s3", "10.0.0.2")):
        trainer.finish(trainer.start("s3", 1))  # the total needed room: the unreachable model went
    assert models.trained.get(trained.value) is None and not trained.out.exists()


FULL_DISK = """
import errno, sys
from webapp.jobs import worker
def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", "/srv/runs/app-x/model.safetensors")
worker.finetune_folder = full
worker.main(sys.argv[1])
"""


def test_a_full_disk_is_told_to_the_visitor(tmp_path):
    """The worker's own "the disk is full" went to the log and the visitor read "training failed". Now the job is
    refused with a sentence that says so, without the server's path."""
    data = tmp_path / "data"
    from_zip(two_classes(tmp_path / "photos.zip"), data, LIMITS)
    job = tmp_path / "job.json"
    spec = dict(data=str(data), init="x", out=str(tmp_path / "out"), minutes=1, image_size=None, threads=1)
    job.write_text(json.dumps(spec | {"stop_file": str(tmp_path / "stop"), "strategy": "auto"}))
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(job)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    reports = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == worker.REFUSED and reports[-1] == {"error": worker.DISK_FULL}, done.stderr[-2000:]
    assert "/srv" not in worker.DISK_FULL and "disk filled up" in worker.DISK_FULL
