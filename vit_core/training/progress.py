"""How a training run reports while it runs: the progress line it prints, and the hooks a caller (the app's
Train tab, ``vit_core.finetune``) passes to ``engine.train`` to follow each step and to stop the run."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm


@dataclass(frozen=True)
class StepInfo:
    """What ``Hooks.on_step`` is told after each optimizer step."""

    epoch: int  # 0-based
    step: int  # optimizer steps done in the run, this one included
    steps_per_epoch: int
    total_steps: int  # the steps ``epochs`` allows (a run with a time budget may stop before)
    loss: float  # this batch's training loss
    lr: float  # the learning rate this step took
    elapsed_s: float  # since the run started (evaluations included; a resumed run counts its earlier epochs)
    budget_s: float | None  # the recipe's budget_minutes, in seconds


@dataclass
class Hooks:
    """Callbacks of a training run, all optional and called on the first process only, in the training loop's
    thread. ``on_step``: after each optimizer step (it costs one wait for the device per step, which only an
    observer pays). ``on_epoch``: with each epoch's metrics row once it is evaluated and saved.
    ``should_stop``: asked after each step (after ``on_step``); True ends the epoch there, and the run after that
    epoch is evaluated and saved (its row says ``"stopped": "asked"``)."""

    on_step: Callable[[StepInfo], None] | None = None
    on_epoch: Callable[[dict[str, Any]], None] | None = None
    should_stop: Callable[[], bool] | None = None


class ProgressLine:
    """One progress line for the whole run: epoch, step, loss, learning rate and the time left.

    On a terminal it is a tqdm bar redrawn in place. Otherwise (a log file, CI) it is a plain line four
    times an epoch, so that a log shows how far the run is and when it will end, without the
    carriage-return noise of a bar. Under a time budget (``budget_s``, the recipe's ``budget_minutes``) the run
    ends when the budget is spent, so the time left is the budget's when that comes first."""

    def __init__(
        self, start_epoch: int, epochs: int, steps: int, *, enabled: bool, budget_s: float | None = None
    ) -> None:
        self.epochs, self.steps, self.enabled, self.budget_s = epochs, steps, enabled, budget_s
        self.done = self.first = start_epoch * steps  # steps of the run done, and done before this process
        self.total = epochs * steps
        self.t0 = time.time()
        self.every = math.ceil(steps / 4)
        terminal = enabled and sys.stderr.isatty()
        self.bar = tqdm(total=self.total, initial=self.done, unit="step", dynamic_ncols=True, disable=not terminal)

    def step(self, epoch: int, i: int, loss: torch.Tensor, lr: float) -> None:
        self.done += 1
        if not self.enabled:
            return
        if not self.bar.disable:
            self.bar.update()
            if i % 20 == 0:  # loss.item() waits for the device: not every step
                self.bar.set_description(f"epoch {epoch + 1}/{self.epochs}", refresh=False)
                self.bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}")
        elif (i + 1) % self.every == 0 or i + 1 == self.steps:
            seconds = time.time() - self.t0
            left = seconds / (self.done - self.first) * (self.total - self.done)
            if self.budget_s is not None:
                left = min(left, max(self.budget_s - seconds, 0.0))
            print(
                f"epoch {epoch + 1}/{self.epochs} step {i + 1}/{self.steps} ({100 * self.done / self.total:.0f}%) "
                f"loss {loss.item():.4f} lr {lr:.2e} elapsed {_clock(seconds)} ETA {_clock(left)}",
                file=sys.stderr,
                flush=True,
            )

    def write(self, line: str) -> None:
        """Print ``line`` to stdout without breaking the bar."""
        if self.bar.disable:
            print(line, flush=True)
        else:
            self.bar.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
