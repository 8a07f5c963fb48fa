"""Training jobs of the Train tab: one at a time across the server, each in a process of its own
(``webapp.finetune_worker``: its own torch threads, its own memory), and the models they trained, served to the
session that trained them and, on a public server, deleted after an hour.

``Trainer.start`` takes the server's one job slot, or refuses with when to try again; ``run`` streams the
process's progress reports; ``register`` records the run folder under a value of its own in the server's one
registry of trained models (``webapp.trained``, which the model registry owns), a value that on a public server
only the training session is told, so that it (which loads no local path it is sent) loads it for that visitor
and no one else; ``sweep`` deletes what is older than ``ttl`` (the clock is injectable for tests). The server's
``Trainer`` is its context's (``Context.trainer``, made by ``Trainer.for_server``).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from .catalog import ROOT
from .errors import log
from .models import Models
from .trained import PRIVATE_PREFIX, Trained

TTL_S = 3600.0  # a public server keeps a visitor's trained model this long
GRACE_S = 180.0  # beyond its budget, a job may take this long (start, decoding, calibration) before it is killed
SWEEP_EVERY_S = 300.0
ZIP_SKIPPED = {"checkpoint.pt"}  # the optimizer's state: twice the model, and of no use to a download


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
    stop_file: Path = field(init=False)

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

    @classmethod
    def for_server(cls, models: Models) -> Trainer:
        """A server's trainer: run folders in the project's ``runs/``, kept, locally; on a public server in a
        temporary folder, deleted after ``TTL_S``."""
        public = models.options.public
        return cls(models, None if public else ROOT / "runs", TTL_S if public else None)

    @cached_property
    def root(self) -> Path:
        """The jobs' folders (made at the first job)."""
        return Path(tempfile.mkdtemp(prefix="vit-train-"))

    # ------------------------------------------------------------------------ the one job slot

    def start(self, session: str, minutes: float) -> Job:
        """Take the server's training slot for ``session`` (``TrainingBusy`` while another job has it)."""
        with self._lock:
            job = self._job
            if job is not None:
                left = job.started + 60 * job.minutes + 60 - self.clock()  # its budget, and a minute to finish
                raise TrainingBusy(
                    f"A training job is running on this server; try again in {max(1, math.ceil(left / 60))} min."
                )
            folder = self.root / secrets.token_hex(8)
            folder.mkdir()
            stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.clock()))
            out = (self.runs or folder) / f"app-{stamp}-{folder.name[:4]}"
            self._job = Job(session, folder, minutes, self.clock(), out)
            return self._job

    def finish(self, job: Job) -> None:
        """Give the slot back; the uploaded images go (the run folder stays)."""
        shutil.rmtree(job.data, ignore_errors=True)
        with self._lock:
            if self._job is job:
                self._job = None

    def cancel(self, session: str) -> bool:
        """Cancel ``session``'s running job, if it has one."""
        with self._lock:
            job = self._job if self._job is not None and self._job.session == session else None
        if job is not None:
            job.cancel()
        return job is not None

    def run(self, job: Job, init: str, image_size: int | None) -> Iterator[dict]:
        """Train in a process of its own, yielding its reports (``Progress`` fields, then ``{"result": ...}``).
        A process that outlives its budget and ``GRACE_S`` is killed; so is one whose reader stops (the page
        closed: the generator is closed). ``RuntimeError`` when it fails (its log goes to the server's)."""
        spec = dict(
            data=str(job.data),
            init=init,
            out=str(job.out),
            minutes=job.minutes,
            image_size=image_size,
            threads=self.threads,
            stop_file=str(job.stop_file),
        )
        (job.folder / "job.json").write_text(json.dumps(spec))
        env = os.environ | {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        command = [sys.executable, "-m", "webapp.finetune_worker", str(job.folder / "job.json")]
        with (job.folder / "log.txt").open("wb") as stderr:
            proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        timer = threading.Timer(60 * job.minutes + GRACE_S, proc.kill)
        timer.start()
        try:
            for line in proc.stdout:
                yield json.loads(line)
            if proc.wait() != 0:
                tail = (job.folder / "log.txt").read_text(errors="replace")[-4000:]
                log.error("training job failed (exit %s):\n%s", proc.returncode, tail)
                raise RuntimeError("training failed (logged on the server)")
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()

    # ------------------------------------------------------------------------ the trained models

    def register(self, job: Job, classes: list[str]) -> Trained:
        """Serve ``job``'s run folder under a new private value, with a readable label."""
        self.sweep()
        when = time.strftime("%H:%M", time.localtime(self.clock()))
        label = f"Trained here at {when}: {', '.join(classes)}"[:120]
        trained = Trained(PRIVATE_PREFIX + secrets.token_urlsafe(12), label, job.out, job.session, self.clock())
        self.models.trained.add(trained)
        self._start_sweeper()
        return trained

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
            self.models.forget(t.value)
            shutil.rmtree(t.out.parent if t.out.parent.parent == self.root else t.out, ignore_errors=True)
        return [t.value for t in old]

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
    optimizer's state."""
    part = dest.with_suffix(".part")
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(out.iterdir()):
            if path.is_file() and path.name not in ZIP_SKIPPED:
                zf.write(path, f"{out.name}/{path.name}")
    part.replace(dest)
    return dest
