"""What ``finetune_folder`` tells its caller as it runs: ``Progress`` reports, made from the engine's hooks by
``Watch``, with a time-left estimate that never runs past the budget."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..training.progress import Hooks, StepInfo
from ..training.recipe import Recipe
from .lpft import Strategy


@dataclass(frozen=True)
class Progress:
    """What ``on_progress`` is told: after each training step, each epoch, and at each change of phase."""

    phase: str  # "loading", "features" (measured; the probe's features next), "training", "calibrating", "done"
    # or "cancelled"
    step: int = 0  # optimizer steps done
    total_steps: int | None = None  # the steps the budget is expected to allow (a rough guess before the first)
    epoch: int = 0  # epochs finished
    loss: float | None = None  # the last batch's training loss
    val_accuracy: float | None = None  # top-1 (%) on the held-out images after the last finished epoch
    elapsed_s: float = 0.0  # since finetune_folder was called
    eta_s: float | None = None  # time left until the run folder is written, estimated
    strategy: str | None = None  # the strategy chosen and why, one sentence (once chosen)


class Watch:
    """Turns the engine's hooks into ``Progress`` reports, with a time-left estimate: the steps' rate, but never
    past what is left of the budget."""

    def __init__(self, report: Callable[[Progress], None], t0: float, recipe: Recipe, plan: Strategy) -> None:
        self.report, self.t0, self.plan = report, t0, plan
        self.budget_s = None if recipe.budget_minutes is None else 60 * recipe.budget_minutes
        self.step, self.loss, self.val, self.epoch, self.total, self.start = 0, None, None, 0, None, time.time()

    def hooks(self, should_stop: Callable[[], bool] | None) -> Hooks:
        return Hooks(on_step=self.on_step, on_epoch=self.on_epoch, should_stop=should_stop)

    def on_step(self, info: StepInfo) -> None:
        self.step, self.loss = info.step, info.loss
        rate = info.elapsed_s / info.step  # seconds per step so far, evaluations included
        total = info.total_steps if info.budget_s is None else min(info.total_steps, round(info.budget_s / rate))
        self.total = max(total, info.step)
        self.report(self.progress("training", rate * (self.total - info.step)))

    def on_epoch(self, row: dict[str, Any]) -> None:
        self.epoch, self.val = row["epoch"], row.get("test_top1")
        rate = (time.time() - self.start) / max(self.step, 1)
        self.report(self.progress("training", None if self.total is None else rate * (self.total - self.step)))

    def progress(self, phase: str, left: float | None) -> Progress:
        if left is not None and self.budget_s is not None:
            left = min(left, max(self.budget_s - (time.time() - self.start), 0.0))
        total = self.step if phase != "training" else self.total
        elapsed = time.time() - self.t0
        p = Progress(phase, self.step, total, self.epoch, self.loss, self.val, elapsed, left, self.plan.reason)
        return p
