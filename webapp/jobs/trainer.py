"""Training jobs of the Train tab: one at a time across the server, each in a process of its own
(``webapp.jobs.worker``: its own torch threads, its own memory), and the models they trained, served to the
session that trained them and, on a public server, deleted after an hour.

``Trainer.start`` takes the server's one job slot, or refuses with when to try again; ``run`` streams the
process's progress reports; ``register`` records the run folder under a value of its own in the server's one
registry of trained models (``webapp.registry.access``, which the model registry owns), a value that on a public server
only the training session is told, so that it (which loads no local path it is sent) loads it for that visitor
and no one else; ``sweep`` deletes what is older than ``ttl`` (the clock is injectable for tests). The server's
``Trainer`` is its context's (``Context.trainer``, made by ``Trainer.for_server``).

**Whose.** A job and the model it trains belong to the caller that started it (``trained.Caller``: session hash
and address); only that caller cancels it, and on a public server only that caller loads the model.

**Disk.** Every job's folder is swept when the job ends, however it ends (``finish``): the photos, the job's files,
the download's zip (Gradio has its own copy by then) and the run folder's ``checkpoint.pt`` go; the run folder
itself stays only when its model was registered (and in a temporary folder only until its ``ttl``). The jobs'
folders live in a ``train-*`` folder of this process's own (``tempfiles.process_folder``); a server removes those
of dead processes at start. Before a job starts, the disk must keep ``MIN_FREE_DISK`` free after ``JOB_RESERVE``
(what one job may write), and on a public server what training holds (the run folders served and the job's) must
stay under ``MAX_HELD_BYTES`` in all and ``MAX_HELD_PER_ADDRESS`` per address, with ``JOB_RESERVE`` to spare.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import gradio as gr

from vit_core.io.files import CHECKPOINT_NAME
from vit_core.training.run_folder import is_complete

from ..errors import log
from ..registry.access import PRIVATE_PREFIX, Trained, caller
from ..registry.catalog import ROOT
from ..registry.models import Models
from ..resources import MIN_FREE_DISK
from ..server.tempfiles import UNLOCKED_STALE_S, process_folder
from .worker import REFUSED, SILENT_S, Process

TTL_S = 3600.0  # a public server keeps a visitor's trained model this long
GRACE_S = 180.0  # beyond its budget, a job may take this long before it is killed (its budget covers all it does)
SWEEP_EVERY_S = 300.0
ZIP_SKIPPED = {CHECKPOINT_NAME}  # the optimizer's state: twice the model, and of no use to a download
# what "try again in N min" counts after a job's budget: its process's start (the budget runs from there) and what
# the estimate of its calibration missed; 30 s until this server has seen a job end, then the longest it measured
OVERRUN_S = 30.0
FOLDER_PREFIX = "train-"
RUN_PREFIX = "app-"  # a run folder the app trained: ``app-<date>-<time>-<job>``
GB = 1 << 30
# What training may hold on a public server's disk: the run folders it serves (an hour each) and the running job's
# folder. One job writes at most ``JOB_RESERVE`` (a ViT-B/16 run folder is about 350 MB, the photos at most 250).
MAX_HELD_BYTES = 8 * GB
MAX_HELD_PER_ADDRESS = 2 * GB
JOB_RESERVE = 1 * GB


class TrainingBusy(Exception):
    """Another training job holds the server's slot; ``str(e)`` says when to try again."""


@dataclass
class Job:
    """A training job: its session, its folder (the uploaded images as written, the run folder, the stop file,
    the process's log) and its budget."""

    session: str
    folder: Path
    minutes: float
    started: float
    out: Path
    address: str | None = None  # the starting caller's (None: started from Python)
    registered: bool = False  # its model is served: its run folder outlives the job
    stop_file: Path = field(init=False)
    lock: IO[str] | None = None  # held while the job writes its run folder under runs/ (``sweep_crashed``)

    def __post_init__(self) -> None:
        self.stop_file = self.folder / "stop"

    @property
    def data(self) -> Path:
        return self.folder / "data"

    def cancel(self) -> None:
        """Ask the process to stop after its current step (it saves and writes the folder, uncalibrated)."""
        self.stop_file.touch()


class Trainer:
    """The server's training slot and its trained models (see the module's docstring). ``runs``: where run
    folders go (None: a temporary folder, deleted with the model); ``ttl``: seconds a trained model is served
    and kept (None: for good)."""

    def __init__(
        self,
        models: Models,
        runs: Path | None,
        ttl: float | None,
        clock: Callable[[], float] = time.time,
        threads: int | None = None,
    ) -> None:
        self.models, self.runs, self.ttl, self.clock = models, runs, ttl, clock
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)  # half the cores: others' requests go on
        self._lock = threading.Lock()
        self._job: Job | None = None
        self._sweeper: threading.Thread | None = None
        self.capped = ttl is not None  # what training holds is capped (a public server's)
        self.overrun_s = OVERRUN_S
        self.root = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=process_folder()))  # the jobs' folders
        self.silent_s = SILENT_S  # a training process silent this long is ended (``worker.Process``)
        # whether a session's page is alive (its state kept): the server's ``Sessions.live``; every one by default
        self.live: Callable[[str], bool] = lambda session: True

    @classmethod
    def for_server(cls, models: Models) -> Trainer:
        """A server's trainer: run folders in the project's ``runs/``, kept, locally; on a public server in a
        temporary folder, deleted after ``TTL_S``."""
        public = models.options.public
        if not public:
            sweep_crashed(ROOT / "runs")
        return cls(models, None if public else ROOT / "runs", TTL_S if public else None)

    # ------------------------------------------------------------------------ the one job slot

    def start(self, session: str, minutes: float) -> Job:
        """Take the server's training slot for ``session`` (``TrainingBusy`` while another job has it, or when
        the disk or what training holds has no room for one more)."""
        who = caller()
        address = who.address if who is not None else None
        with self._lock:
            job = self._job
            if job is not None:
                minutes = max(1, math.ceil(self.left(job) / 60))
                raise TrainingBusy(f"A training job is running on this server; try again in {minutes} min.")
            self._check_room(address)
            folder = self.root / secrets.token_hex(8)
            folder.mkdir()
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.clock()))
            out = (self.runs or folder) / f"{RUN_PREFIX}{stamp}-{folder.name[:4]}"
            self._job = Job(
                session, folder, minutes, self.clock(), out, address, lock=_hold(out) if self.runs else None
            )
            return self._job

    def left(self, job: Job) -> float:
        """Seconds until ``job`` is expected to end: its budget, which covers all it does (reading the photos,
        training, calibrating, writing), then the longest a job overran its budget here (``overrun_s``: its
        process's start, the estimate's error), never past the kill at ``GRACE_S``."""
        now, end = self.clock(), job.started + 60 * job.minutes
        return min(max(end, now) + self.overrun_s, end + GRACE_S) - now

    def _check_room(self, address: str | None) -> None:
        """Room for one more job: on the disk, and on a public server in what training holds. A model none of
        whose pages is alive any more (``live``: its sessions' state expired, a REST call's at once) counts
        against no address, and is the first deleted when the server's total needs room (a reload within the
        hour, which brings a page back, finds it while room allows)."""
        free = shutil.disk_usage(self.root).free
        if free - JOB_RESERVE < MIN_FREE_DISK:
            raise TrainingBusy("The server's disk is nearly full; try again later.")
        if not self.capped:
            return
        held = self.models.trained.created_before(math.inf)  # oldest first
        sizes = {t.value: _bytes(t.out) for t in held}
        reachable = {t.value for t in held if any(self.live(s) for s in t.reloads | {t.session})}
        total = sum(sizes.values())
        for t in held:
            if total + JOB_RESERVE <= MAX_HELD_BYTES:
                break
            if t.value not in reachable:
                self._delete(t)
                total -= sizes[t.value]
        mine = sum(sizes[t.value] for t in held if t.address == address and t.value in reachable)
        if total + JOB_RESERVE > MAX_HELD_BYTES:
            raise TrainingBusy("This server holds as many trained models as it can; try again later.")
        if mine + JOB_RESERVE > MAX_HELD_PER_ADDRESS:
            raise TrainingBusy(
                "Your trained models take all the room one visitor has here; try again when the oldest is deleted "
                "(an hour after it was trained)."
            )

    def finish(self, job: Job) -> None:
        """Give the slot back and sweep the job's folders, however it ended: the photos, the job's own files
        and the download's zip go, and the run folder's ``checkpoint.pt``; the run folder stays only when its
        model is served (``register``). How long it ran past its budget is measured for ``left``."""
        overrun = self.clock() - (job.started + 60 * job.minutes)
        self.overrun_s = min(max(self.overrun_s, overrun), GRACE_S)
        keep = job.out.resolve() if job.registered else None
        if keep is not None:
            (job.out / CHECKPOINT_NAME).unlink(missing_ok=True)
        if keep is None and self.runs is not None:
            shutil.rmtree(job.out, ignore_errors=True)  # a failed run's partial folder under runs/
        if keep is None or keep.parent != job.folder.resolve():
            shutil.rmtree(job.folder, ignore_errors=True)
        else:
            for path in job.folder.iterdir():
                if path.resolve() != keep:
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        if job.lock is not None:
            _lock_file(job.out).unlink(missing_ok=True)
            job.lock.close()
        with self._lock:
            if self._job is job:
                self._job = None

    def cancel(self, session: str) -> bool:
        """Cancel ``session``'s running job, if it has one and the caller is the one that started it (the same
        session from the same address: a session hash is the client's to send)."""
        who = caller()
        with self._lock:
            job = self._job
            if job is None or job.session != session or (who is not None and who.address != job.address):
                job = None
        if job is not None:
            job.cancel()
        return job is not None

    def run(self, job: Job, init: str, image_size: int | None, strategy: str = "auto") -> Iterator[dict]:
        """Train in a process of its own, yielding its reports (``Progress`` fields, then ``{"result": ...}``);
        ``strategy``: ``finetune_folder``'s (the app's is "auto"; a benchmark forces the others).
        A process that outlives its budget and ``GRACE_S`` is killed; so is one silent for ``silent_s`` (stopped,
        hung: told in the ``RuntimeError``), one whose reader stops (the page closed: the generator is closed), and
        one whose server dies (``worker.Process``). ``RuntimeError`` when it fails (its log goes to
        the server's)."""
        spec = dict(
            data=str(job.data),
            init=init,
            out=str(job.out),
            minutes=job.minutes,
            image_size=image_size,
            threads=self.threads,
            stop_file=str(job.stop_file),
            strategy=strategy,
        )
        (job.folder / "job.json").write_text(json.dumps(spec | {"heartbeat_s": self.silent_s / 4}))
        env = os.environ | {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        command = [sys.executable, "-m", "webapp.jobs.worker", str(job.folder / "job.json")]
        deadline = time.monotonic() + 60 * job.minutes + GRACE_S
        proc = Process(command, cwd=ROOT, env=env, log=job.folder / "log.txt", silent=self.silent_s, deadline=deadline)
        refusal = None
        try:
            for report in proc.reports():
                if "peak_bytes" in report:
                    log.info("training job: the process's peak RSS %.0f MB", report["peak_bytes"] / 2**20)
                if "error" in report:
                    refusal = str(report["error"])
                    continue
                yield report
            if proc.proc.wait() == REFUSED and refusal is not None:
                log.info("training job refused: %s", refusal)
                raise RuntimeError(refusal)
            if proc.silenced:
                log.error("training job: its process was silent for %.0f s, and was ended", self.silent_s)
                raise RuntimeError(
                    f"The training process stopped answering for {self.silent_s:.0f} s and was ended; nothing of "
                    "it was kept. Try again."
                )
            if proc.proc.returncode != 0:
                tail = (job.folder / "log.txt").read_text(errors="replace")[-4000:]
                log.error("training job failed (exit %s):\n%s", proc.proc.returncode, tail)
                raise RuntimeError("training failed (logged on the server)")
        finally:
            proc.end()

    # ------------------------------------------------------------------------ the trained models

    def register(self, job: Job, classes: list[str]) -> Trained:
        """Serve ``job``'s run folder under a new private value, with a readable label."""
        self.sweep()
        when = time.strftime("%H:%M", time.localtime(self.clock()))
        label = f"Trained here at {when}: {', '.join(classes)}"[:120]
        value = PRIVATE_PREFIX + secrets.token_urlsafe(12)
        trained = Trained(value, label, job.out, job.session, self.clock(), job.address)
        self.models.trained.add(trained)
        job.registered = True
        self._start_sweeper()
        return trained

    def shown_folder(self, out: Path) -> Path:
        """Where the result page of the run ``out`` keeps what it shows after the job's folder is gone (the
        misclassified photos, which a click opens in Classify): in this process's folder, for as long as the
        run's model is served (``sweep`` removes it with the model)."""
        return self.root / "shown" / out.name

    def of_session(self, session: str) -> list[Trained]:
        """``session``'s trained models still served, oldest first."""
        self.sweep()
        return self.models.trained.shown_to(session, public=True)

    def sweep(self) -> list[str]:
        """Delete the trained models older than ``ttl`` (unserved, unloaded, their folders removed); their
        values."""
        if self.ttl is None:
            return []
        old = self.models.trained.created_before(self.clock() - self.ttl)
        for t in old:
            self._delete(t)
        return [t.value for t in old]

    def _delete(self, t: Trained) -> None:
        """Serve ``t`` no longer, unload it and remove its folders."""
        self.models.forget(t.value)
        shutil.rmtree(t.out.parent if t.out.parent.parent == self.root else t.out, ignore_errors=True)
        shutil.rmtree(self.shown_folder(t.out), ignore_errors=True)

    def _start_sweeper(self) -> None:
        if self.ttl is None or self._sweeper is not None:
            return

        def loop() -> None:
            while True:
                time.sleep(SWEEP_EVERY_S)
                self.sweep()

        self._sweeper = threading.Thread(target=loop, name="trained-sweeper", daemon=True)
        self._sweeper.start()


def zip_run(out: Path, dest: Path) -> Path:
    """The run folder ``out`` as the zip ``dest`` (written to a temporary name, then renamed), without the
    optimizer's state; ``gr.Error`` when it would leave less than ``MIN_FREE_DISK`` free."""
    if shutil.disk_usage(dest.parent).free - _bytes(out) < MIN_FREE_DISK:
        raise gr.Error("The server's disk is nearly full: the run folder cannot be zipped for download.")
    part = dest.with_suffix(".part")
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(out.iterdir()):
            if path.is_file() and path.name not in ZIP_SKIPPED:
                zf.write(path, f"{out.name}/{path.name}")
    part.replace(dest)
    return dest


def _lock_file(out: Path) -> Path:
    return out.with_name(f".{out.name}.in-use")


def _hold(out: Path) -> IO[str]:
    """Under runs/: a shared lock beside the run folder ``out``, held while its job runs (the kernel drops it when
    the server dies), so that a later server's ``sweep_crashed`` tells a live job's folder from a dead one's."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = _lock_file(out).open("a")
    fcntl.flock(lock, fcntl.LOCK_SH)
    return lock


def sweep_crashed(runs: Path) -> list[str]:
    """At a local server's start: remove the run folders of the app's jobs (``app-*`` under ``runs``) that are
    not complete (``run_folder.is_complete``) and whose job's lock no live server holds: what a server killed
    mid-job left (the picker never lists them either). A folder without its lock (an older version's) is
    removed when untouched for ``UNLOCKED_STALE_S``. Returns the names removed."""
    removed = []
    for out in sorted(runs.glob(f"{RUN_PREFIX}*")) if runs.is_dir() else []:
        lock = _lock_file(out)
        try:
            if not out.is_dir() or out.is_symlink() or is_complete(out):
                continue
            if not lock.exists():
                if out.stat().st_mtime < time.time() - UNLOCKED_STALE_S:
                    shutil.rmtree(out)
                    removed.append(out.name)
                continue
            with lock.open("r") as held:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a live server's job
                shutil.rmtree(out)
                lock.unlink()
            removed.append(out.name)
        except OSError:
            continue
    if removed:
        log.info("removed %d half-written runs that crashed jobs left: %s", len(removed), ", ".join(removed))
    return removed


def _bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (0 when it is gone)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
