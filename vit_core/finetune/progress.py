"""What ``finetune_folder`` tells its caller as it runs: ``Progress`` reports, made from the engine's hooks by
``Watch`` across the stages (``finetune.stages``), with a time left that counts down the budget; and, for the
command line, the same as a line on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..training.progress import Hooks, StepInfo


@dataclass(frozen=True)
class Progress:
    """What ``Monitor.on_progress`` is told: after each training step, each epoch, each stage, and at each change of
    phase."""

    phase: str  # "loading", "features" (the probe's features next), "training", "calibrating", "done" or "cancelled"
    step: int = 0  # optimizer steps done, every stage's
    total_steps: int | None = None  # the steps the budget is expected to allow at the current rate
    epoch: int = 0  # epochs finished, every stage's
    loss: float | None = None  # the last batch's training loss
    val_accuracy: float | None = None  # top-1 (%) on the held-out images after the last finished epoch or stage
    elapsed_s: float = 0.0  # since finetune_folder was called
    eta_s: float | None = None  # time left until the run folder is written: what is left of the budget
    strategy: str | None = None  # the plan in words, revised as the stages run
    stage: str | None = None  # the stage running ("linear probe", "last 3 of 6 blocks", "whole model")
    best_accuracy: float | None = None  # the best stage's held-out top-1 (%) so far: the model the run keeps


@dataclass(frozen=True)
class Monitor:
    """How the caller follows a ``finetune_folder`` run and stops it: the three travel together from the Train
    tab's worker and the command line down to the training loop, which calls them in the caller's thread."""

    on_progress: Callable[[Progress], None] | None = None  # told a ``Progress`` at each step, epoch, stage and phase
    # asked after each step: True ends the training there, the folder keeping the model as it was, uncalibrated
    should_stop: Callable[[], bool] | None = None
    progress_bar: bool = False  # also a line on stderr per epoch and stage (the command line's)

    def report(self, progress: Progress) -> None:
        """Tell the caller ``progress`` (nothing without ``on_progress``)."""
        if self.on_progress is not None:
            self.on_progress(progress)


class Watch:
    """Turns the engine's hooks into ``Progress`` reports to the ``monitor`` across the stages. The time left is
    what is left of the budget (``budget_s`` from ``t0``: the stages spend it all); without one, the current
    stage's rate."""

    def __init__(self, monitor: Monitor, t0: float, budget_s: float | None):
        self.monitor, self.t0, self.budget_s = monitor, t0, budget_s
        self.step = self.epoch = self.offset = self.epoch_offset = 0
        self.loss = self.val = self.best = self.total = self.plan = self.stage = None
        self.rate = 0.0
        self.stage_start, self.last_line = time.time(), 0.0

    def hooks(self) -> Hooks:
        """The engine's hooks for a stage: its steps and epochs reported, the monitor's ``should_stop`` asked."""
        return Hooks(on_step=self.on_step, on_epoch=self.on_epoch, should_stop=self.monitor.should_stop)

    def begin(self, stage: str, plan: str | None = None) -> None:
        """A stage starts: its steps and epochs count on from the stages before."""
        self.offset, self.epoch_offset, self.stage, self.stage_start = self.step, self.epoch, stage, time.time()
        self.plan = plan or self.plan

    def finished(self, stage: str, accuracy: float | None, best: float | None, epochs: int = 1) -> None:
        self.stage, self.val, self.best, self.epoch = stage, accuracy, best, self.epoch_offset + epochs
        self.emit("training")

    def stage_steps(self) -> int:
        return self.step - self.offset

    def on_step(self, info: StepInfo) -> None:
        self.step, self.loss = self.offset + info.step, info.loss
        self.rate = (time.time() - self.stage_start) / max(info.step, 1)  # seconds per step in this stage
        steps = info.total_steps - info.step if self.budget_s is None else round(self.left() / self.rate)
        self.total = self.step + steps
        self.emit("training", quiet=True)

    def on_epoch(self, row: dict[str, Any]) -> None:
        self.epoch, self.val = self.epoch_offset + row["epoch"], row.get("test_top1")
        self.emit("training")

    def left(self) -> float | None:
        """What is left of the budget; without one, the current stage's steps left at its rate (None before)."""
        if self.budget_s is None:
            return None if self.total is None else self.rate * (self.total - self.step)
        return max(self.budget_s - (time.time() - self.t0), 0.0)

    def progress(self, phase: str) -> Progress:
        total = self.total if phase == "training" else self.step
        left = 0.0 if phase in ("done", "cancelled") else self.left()
        return Progress(phase, self.step, total, self.epoch, self.loss, self.val, time.time() - self.t0, left,
                        self.plan, self.stage, self.best)  # fmt: skip

    def emit(self, phase: str, quiet: bool = False) -> None:
        p = self.progress(phase)
        self.monitor.report(p)
        if self.monitor.progress_bar and (not quiet or time.time() - self.last_line > 10):
            self.last_line = time.time()
            print(line(p, self.budget_s), file=sys.stderr, flush=True)


def line(p: Progress, budget_s: float | None) -> str:
    """A report as the command line prints it: the stage, its progress, and the budget's time used and left."""
    parts = [p.stage or p.phase, f"epoch {p.epoch}", f"step {p.step}"]
    parts += [f"loss {p.loss:.4f}"] if p.loss is not None else []
    parts += [f"held-out {p.val_accuracy:.1f}%"] if p.val_accuracy is not None else []
    parts += [f"best {p.best_accuracy:.1f}%"] if p.best_accuracy is not None else []
    used = f"{_clock(p.elapsed_s)} used" + (f" of {_clock(budget_s)}" if budget_s is not None else "")
    left = f", {_clock(p.eta_s)} left" if p.eta_s is not None else ""
    return ", ".join(parts) + f"; {used}{left}"


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60}:{s % 60:02d}"
