"""The Train tab's training process: ``python -m webapp.jobs.worker JOB.json`` runs
``vit_core.finetune.finetune_folder`` on the job's folder and prints one JSON line per progress report (the
``Progress`` fields), then a ``{"result": ...}`` line (``FinetuneResult``'s fields: the strategy and why, and the
held-out ``details``: per-class accuracy, confusion matrix, misclassified files, ECE, threshold). It stops after
the current step once the job's stop file exists (the Cancel button). Everything else it prints goes to its log
(stderr).

The job's budget covers everything it does from the process's start: first it decodes the photos the server only
checked (``webapp.jobs.trainset.decode_folder``; the stop file and the deadline are checked before each image), then
what is left goes to ``finetune_folder(..., within_budget=True)``, which keeps the time its calibration and writing
will take (``vit_core.finetune.budget``) and trains for the rest. A job that cannot train (cancelled or out of time
while decoding, too few photos left that decode, a budget too short for calibrating the photos) prints
``{"error": sentence}`` and exits with ``REFUSED``; the server shows the sentence. The result's line also says the
process's peak RSS (``peak_bytes``), which the Train tab's memory estimate bounds (``webapp.inference.estimates``).

A process of its own rather than a thread of the server (``webapp.jobs.trainer``): torch's thread count is
process-wide (``torch.set_num_threads`` in a thread would slow every other visitor's Classify), a process's
memory goes back to the system when it ends, and a crash or a kill takes the job only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

from vit_core.finetune import Progress, finetune_folder
from vit_core.finetune.budget import BudgetTooShort
from webapp.jobs.trainset import Stopped, decode_folder
from webapp.resources import release_memory

REFUSED = 3  # the exit status of a job refused with a sentence (its ``{"error": ...}`` line)
MIN_TRAIN_S = 1.0  # less than this left of the budget after decoding: nothing worth training


def main(job_file: str) -> None:
    reports = os.fdopen(os.dup(1), "w")  # the reports' own pipe; whatever else is printed goes to the log
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def _emit(record: dict) -> None:
        reports.write(json.dumps(record) + "\n")
        reports.flush()

    job = json.loads(Path(job_file).read_text())
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
    release_memory()  # decoding's freed pages go back before the model comes: their peaks do not add up
    try:
        result = finetune_folder(
            job["data"],
            job["init"],
            job["out"],
            minutes=(deadline - time.time()) / 60,
            image_size=job["image_size"],
            strategy=job.get("strategy", "auto"),  # "auto" from the server; benchmarks force the others
            on_progress=lambda p: _emit(dataclasses.asdict(p)),
            should_stop=stop.exists,
            overrides=job.get("overrides"),
            within_budget=True,
        )
    except BudgetTooShort as e:
        refuse(e)
    fields = ("complete", "classes", "train_images", "val_images", "val_accuracy", "temperature", "ood_threshold")
    fields += ("steps", "strategy", "strategy_reason", "details")  # details: for the result page (held_out.py)
    _emit({"result": {name: getattr(result, name) for name in fields}, "peak_bytes": peak_bytes()})
    _exit(0)


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


if __name__ == "__main__":
    main(sys.argv[1])
