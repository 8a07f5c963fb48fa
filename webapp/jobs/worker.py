"""The Train tab's training process: ``python -m webapp.jobs.worker JOB.json`` runs
``vit_core.finetune.finetune_folder`` on the job's folder and prints one JSON line per progress report (the
``Progress`` fields), then a ``{"result": ...}`` line (``FinetuneResult``'s fields: the strategy and why, and the
held-out ``details``: per-class accuracy, confusion matrix, misclassified files, ECE, threshold). It stops after
the current step once the job's stop file exists (the Cancel button). Everything else it prints goes to its log
(stderr).

The job's budget covers everything it does from the process's start: first it decodes the photos the server only
checked (``webapp.jobs.trainset.decode_folder``; the stop file and the deadline are checked before each image), then
what is left goes to ``finetune_folder`` (``within_budget``), which keeps the time its calibration and writing
will take (``vit_core.finetune.budget``) and trains for the rest. A job that cannot train (cancelled or out of time
while decoding, too few photos left that decode, a budget too short for calibrating the photos) prints
``{"error": sentence}`` and exits with ``REFUSED``; the server shows the sentence. The result's line also says the
process's peak RSS (``peak_bytes``), which the Train tab's memory estimate bounds (``webapp.inference.estimates``).

A process of its own rather than a thread of the server (``webapp.jobs.trainer``): torch's thread count is
process-wide (``torch.set_num_threads`` in a thread would slow every other visitor's Classify), a process's
memory goes back to the system when it ends, and a crash or a kill takes the job only.

**Tied to its server** (``Process``, the server's side): the process is killed with its server, however the server
dies (Linux's parent-death signal, ``PR_SET_PDEATHSIG``, set between fork and exec; it fires when the thread that
started the process ends, so a thread of ``Process`` starts it and lives as long as it does), so that no job runs on
after a restart beside the next one, nor writes into folders the restart swept (an orphan ran 73-100 s before, up to
its budget). It reports at least every ``heartbeat_s`` (a thread of its own, even while a step takes long); the
server ends one silent for ``SILENT_S`` (a stopped or hung process: trusted for 192 s before) and says so.
A full disk is told as such (``DiskFull``), not as a failure.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from vit_core.finetune import FinetuneOptions, Monitor, Progress, finetune_folder
from vit_core.finetune.budget import BudgetTooShort
from vit_core.training.run_folder import DiskFullError
from webapp.jobs.trainset import Stopped, decode_folder
from webapp.resources import release_memory

REFUSED = 3  # the exit status of a job refused with a sentence (its ``{"error": ...}`` line)
MIN_TRAIN_S = 1.0  # less than this left of the budget after decoding: nothing worth training
HEARTBEAT_S = 5.0  # the process reports at least this often
SILENT_S = 20.0  # a process silent this long after a report is ended (a stopped or hung one)
START_S = 120.0  # ... and before its first report (its interpreter and torch start within it)
DISK_FULL = "The server's disk filled up while training, so nothing was kept; try again later."


def main(job_file: str) -> None:
    reports = os.fdopen(os.dup(1), "w")  # the reports' own pipe; whatever else is printed goes to the log
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    lock = threading.Lock()

    def _emit(record: dict) -> None:
        with lock:
            reports.write(json.dumps(record) + "\n")
            reports.flush()

    job = json.loads(Path(job_file).read_text())
    beat = job.get("heartbeat_s", HEARTBEAT_S)
    threading.Thread(target=_heartbeat, args=(_emit, beat), daemon=True, name="heartbeat").start()
    torch.set_num_threads(job["threads"])
    stop = Path(job["stop_file"])
    deadline = time.time() + 60 * job["minutes"]  # the budget from here: decoding, training, calibration, writing
    _emit(dataclasses.asdict(Progress("loading")))

    def refuse(e: Exception) -> None:
        _emit({"error": str(e)})
        _exit(REFUSED)

    try:
        decode_folder(Path(job["data"]), stop.exists, deadline, job.get("min_per_class", 2))
        if deadline - time.time() < MIN_TRAIN_S:
            raise ValueError("Reading the photos took the whole time budget: send smaller photos, or fewer.")
    except (Stopped, ValueError) as e:
        refuse(e)
    except OSError as e:
        refuse(DiskFull(DISK_FULL) if _disk_full(e) else e)
    release_memory()  # decoding's freed pages go back before the model comes: their peaks do not add up
    try:
        options = FinetuneOptions(
            minutes=(deadline - time.time()) / 60,
            within_budget=True,
            image_size=job["image_size"],
            strategy=job.get("strategy", "auto"),  # "auto" from the server; benchmarks force the others
            overrides=job.get("overrides"),
        )
        monitor = Monitor(on_progress=lambda p: _emit(dataclasses.asdict(p)), should_stop=stop.exists)
        result = finetune_folder(job["data"], job["init"], job["out"], options=options, monitor=monitor)
    except BudgetTooShort as e:
        refuse(e)
    except OSError as e:  # the run folder's own (``DiskFullError``), or any other write that found no room
        if not _disk_full(e):
            raise
        refuse(DiskFull(DISK_FULL))
    _emit({"result": dataclasses.asdict(JobResult.of(result)), "peak_bytes": peak_bytes()})
    _exit(0)


@dataclass(frozen=True)
class JobResult:
    """What the training process reports of its run, in its ``{"result": ...}`` line: ``FinetuneResult``'s fields
    that the server's result page and registry read (not the model), by this class's own fields."""

    complete: bool
    classes: list[str]
    train_images: int
    val_images: int
    val_accuracy: float
    temperature: float | None
    ood_threshold: float | None
    steps: int
    strategy: str
    strategy_reason: str
    details: dict  # for the result page (``vit_core.finetune.held_out``)

    @classmethod
    def of(cls, result: object) -> JobResult:
        return cls(**{f.name: getattr(result, f.name) for f in dataclasses.fields(cls)})


class DiskFull(Exception):
    """The disk filled up during the job: the sentence the visitor is shown (the log has the file's path)."""


def _disk_full(e: OSError) -> bool:
    return isinstance(e, DiskFullError) or e.errno in (errno.ENOSPC, errno.EDQUOT)


def _heartbeat(emit: Callable[[dict], None], every: float) -> None:
    """Report that the process lives every ``every`` seconds (a long step reports nothing meanwhile)."""
    while True:
        time.sleep(every)
        emit({"alive": True})


def _exit(status: int) -> None:
    """End now, everything written (the run folder's files are committed, the reports flushed): the interpreter's
    teardown of torch's modules took about 3 s here, inside the job's budget."""
    sys.stderr.flush()
    os._exit(status)


def peak_bytes() -> int:
    """This program's peak resident memory so far: ``VmHWM`` of ``/proc/self/status`` (kB), the high-water mark
    of its own address space. Not ``ru_maxrss``: Linux carries that across ``exec``, so it starts at the RSS of the
    forked copy of the parent (a 4.5 GB test process read as a 4.5 GB training job); ``ru_maxrss`` only where
    there is no ``/proc``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------------- the server's side


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None  # prctl(2)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with(parent: int) -> None:
    """In the child, between fork and exec: be killed when the thread that started it ends (its server died)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the server died before the signal was asked for
        os._exit(1)


class Process:
    """The training process, as its server runs it: started by a thread of its own that lives as long as it does
    (the parent-death signal's), which also ends it when it is silent for ``silent`` seconds after a report
    (``START_S`` before the first) or runs past ``deadline`` (``time.monotonic``). ``reports()`` yields its
    lines parsed, the heartbeats left out; ``silenced`` says whether it was ended for its silence."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict, log: Path, silent: float, deadline: float) -> None:
        self.silent, self.deadline, self.silenced = silent, deadline, False
        self.last: float | None = None  # when it last reported
        self._started = threading.Event()
        self._error: BaseException | None = None
        args = (command, cwd, env, log)
        threading.Thread(target=self._own, args=args, daemon=True, name="training-process").start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _own(self, command: list[str], cwd: Path, env: dict, log: Path) -> None:
        try:
            with log.open("wb") as stderr:
                die = functools.partial(_die_with, os.getpid()) if _PRCTL is not None else None
                self.proc = subprocess.Popen(
                    command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=die
                )
        except BaseException as e:  # handed to the caller's thread
            self._error = e
            return
        finally:
            self._started.set()
        started = time.monotonic()
        while self.proc.poll() is None:
            now = time.monotonic()
            quiet = now - (self.last or started)
            if quiet > (self.silent if self.last is not None else START_S) or now > self.deadline:
                self.silenced = now <= self.deadline
                self.proc.kill()  # SIGKILL: a stopped process too
            time.sleep(min(1.0, self.silent / 4))

    def reports(self) -> Iterator[dict]:
        for line in self.proc.stdout:
            self.last = time.monotonic()
            report = json.loads(line)
            if "alive" not in report:
                yield report

    def end(self) -> None:
        """Kill it if it still runs, and close its pipe."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()


if __name__ == "__main__":
    main(sys.argv[1])
