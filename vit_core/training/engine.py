"""Training: the loop behind ``python -m train``.

A run is described by a :class:`Recipe` (``vit_core.training.recipe``: plain data, what the files in
``train/recipes/`` hold), built from timm's ingredients (``vit_core.training.builders``) and writes one folder, on
the first process only (``vit_core.training.run_folder``: recipe.json, model.safetensors + config.json, metrics.jsonl,
curves.png, checkpoint.pt). Each epoch's files are committed together, so that a kill at any moment
leaves a folder a resume can trust.

Several processes (``torchrun --nproc_per_node N``) train data-parallel (DDP: NCCL on GPUs, gloo on CPU).
``batch_size`` is the global batch: each process takes ``batch_size / N`` images of every step's batch from
one seeded permutation per epoch (``DistributedSampler``, seed + epoch), so N processes see the same
batches as one process would.

Resuming restores the model, optimizer, scheduler, EMA, grad scaler and every process's RNG states (torch,
CUDA, numpy, python; the data order is a function of seed and epoch) from the end of the last finished
epoch, so a run that is stopped and resumed ends with the same weights as one that never stopped.
"""

from __future__ import annotations

import copy
import json
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ..data import Batches
from ..figures import training_curves_figure
from ..io.files import CHECKPOINT_NAME, RECIPE_NAME
from ..models.model import VisionTransformer
from . import run_folder
from .builders import (
    build_datasets,
    build_ema,
    build_lookahead,
    build_loss,
    build_network,
    build_optimizer,
    build_scheduler,
    frozen_modules,
    load_init,
    main_groups,
)
from .distillation import frozen_copy
from .distributed import Processes, rng_state, seed_all, set_rng_state, setup_processes
from .evaluation import evaluate, evaluate_checkpoint, evaluate_mpp
from .progress import Hooks, ProgressLine, StepInfo
from .recipe import Recipe, RecipeError, recipe_diff

__all__ = ["Hooks", "Recipe", "RecipeError", "StepInfo", "TrainResult", "evaluate_checkpoint", "train"]


@dataclass
class TrainResult:
    """What :func:`train` returns: the trained model (the EMA weights when ``ema_decay`` is set; for
    ``task='mpp'`` the bare ViT), as saved in the run folder, the per-epoch metrics, the datasets it trained and
    evaluated on, and why it stopped before ``epochs``: "budget" (``budget_minutes`` spent), "asked"
    (``Hooks.should_stop``), or None."""

    model: nn.Module  # a VisionTransformer, or a CNN baseline (vit_core.models.cnn)
    history: list[dict[str, Any]]
    train_set: Dataset
    test_set: Dataset
    stopped: str | None = None


def train(
    recipe: Recipe | dict[str, Any],
    out: str | Path,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    hooks: Hooks | None = None,
) -> TrainResult:
    """Train as ``recipe`` says, writing the run folder ``out`` (on the first process).

    ``resume``: continue the run in ``out`` from its last checkpoint (the recipe must match the run's,
    except ``RUNTIME_KEYS``). ``stop_after``: stop once this many epochs are done (the schedule still spans
    ``recipe.epochs``), e.g. to train in slices. ``overwrite``: start a new run in a folder that holds one,
    or other files (those are kept; ``run_folder.check_out``). ``hooks``: callbacks to follow and stop the run
    (``vit_core.training.progress.Hooks``). Under torchrun, call this in every process.
    """
    recipe = recipe if isinstance(recipe, Recipe) else Recipe.from_dict(recipe)
    out = Path(out)
    run_folder.check_out(out, resume=resume, overwrite=overwrite)
    procs = setup_processes(recipe.device)
    try:
        hooks = hooks if hooks is not None else Hooks()
        run = _Run(recipe, out, procs, resume)
        last = recipe.epochs if stop_after is None else min(recipe.epochs, stop_after)
        left, on = None if run.budget_s is None else run.budget_s - (time.time() - run.t_start), progress and procs.main
        bar = ProgressLine(run.start_epoch, last, len(run.train_batches), enabled=on, budget_s=left)
        stopped = None
        for epoch in range(run.start_epoch, last):
            row = run.train_epoch(epoch, bar, hooks) | run.evaluate()
            row["elapsed_s"] = time.time() - run.t_start
            run.history.append(row)
            run.save(epoch + 1)
            if procs.main:
                bar.write(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
            if hooks.on_epoch is not None and procs.main:
                hooks.on_epoch(row)
            stopped = row.get("stopped")
            if stopped:
                break
        bar.close()
        return TrainResult(run.exported(), run.history, run.train_set, run.test_set, stopped)
    finally:
        procs.close()


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 units (AVX-512 BF16 or AMX), without which bf16 is emulated, far slower."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def autocast_dtype(recipe: Recipe, device: torch.device) -> torch.dtype | None:
    """The dtype the forward and backward passes autocast to (None: fp32): ``precision`` on CUDA,
    ``cpu_precision`` on a CPU, where bf16 needs the CPU's bf16 units (emulated, it would be far slower)."""
    if device.type == "cuda":
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(recipe.precision)
    if recipe.cpu_precision != "bf16":
        return None
    if cpu_has_bf16():
        return torch.bfloat16
    print("cpu_precision bf16: this CPU has no bf16 units (AVX-512 BF16 or AMX), so the run trains in fp32", flush=True)
    return None


class _Run:
    """The state of one training run on one process: data, model, optimizer, schedule, EMA."""

    def __init__(self, recipe: Recipe, out: Path, procs: Processes, resume: bool) -> None:
        self.recipe, self.out, self.procs = recipe, out, procs
        state = self._load_state() if resume else None
        if recipe.batch_size % procs.world:
            raise RecipeError(f"batch_size {recipe.batch_size} does not split over {procs.world} processes")
        per_rank = recipe.batch_size // procs.world
        self.mpp = recipe.task == "mpp"

        # The model's config gives the preprocessing; the data's classes give the head.
        init = load_init(recipe.init, **recipe.model_args) if recipe.init is not None else None
        # WiSE-FT's other end: the checkpoint's weights as loaded
        self.init_state = None if recipe.wise_ft is None else {k: v.clone() for k, v in init.state_dict().items()}
        config = init.config if init is not None else recipe.scratch_config(None)
        self.train_set, self.test_set = train_set, test_set = build_datasets(recipe, config.pretrained_cfg())
        self.classes = None if self.mpp else list(train_set.classes)
        self.net = build_network(recipe, init, self.classes, train_set).to(procs.device)
        self.model: nn.Module = self.net.vit if self.mpp else self.net
        self.frozen = frozen_modules(self.model, recipe.freeze)
        self.teacher = None if recipe.distill is None else frozen_copy(self.net)  # before any step, or a resume
        self.budget_s = None if recipe.budget_minutes is None else 60 * recipe.budget_minutes
        if recipe.channels_last:  # convolutions then run in NHWC whatever the input's layout
            self.net = self.net.to(memory_format=torch.channels_last)
        seed_all(recipe.seed + procs.rank)  # the same weights everywhere; one augmentation stream per process

        where = dict(rank=procs.rank, world=procs.world, workers=recipe.workers)
        self.train_batches = Batches(train_set, per_rank, procs.device, train=True, seed=recipe.seed, **where)
        self.test_batches = Batches(test_set, recipe.eval_batch_size, procs.device, train=False, **where)
        self.optimizer = build_optimizer(self.net, recipe)
        self.scheduler = build_scheduler(self.optimizer, recipe, len(self.train_batches))
        self.ema = build_ema(self.net, recipe)
        self.lookahead = build_lookahead(self.net, recipe, len(self.train_batches))
        self.amp_dtype = autocast_dtype(recipe, procs.device)
        self.scaler = torch.amp.GradScaler(procs.device.type, enabled=self.amp_dtype == torch.float16)
        labelled = train_set.targets[train_set.targets >= 0]  # outliers (-1) are of no class
        counts = None if self.classes is None else torch.bincount(labelled, minlength=len(self.classes))
        self.mixup, self.criterion = build_loss(recipe, self.classes, counts)
        self.micro_batch = recipe.micro_batch or per_rank
        if per_rank % self.micro_batch:
            raise RecipeError(f"micro_batch {recipe.micro_batch} does not split the batch of {per_rank} per process")
        if self.mixup is not None and per_rank % 2:
            raise RecipeError(f"mixup/cutmix need an even batch per process, got {per_rank}")

        self.start_epoch, self.history = 0, []
        if state is not None:
            self._restore(state)
        self.t_start = time.time() - (self.history[-1]["elapsed_s"] if self.history else 0.0)
        self.forward: nn.Module = self.net
        if procs.distributed:
            self.forward = nn.parallel.DistributedDataParallel(
                self.net, device_ids=[procs.device.index] if procs.device.type == "cuda" else None
            )
        if recipe.compile:
            self.forward = torch.compile(self.forward)
        if procs.main:
            self._prepare_folder(resume)
            params = sum(p.numel() for p in self.model.parameters())
            print(
                f"{recipe.task} {recipe.data}: {len(train_set)} train / {len(test_set)} test images, "
                f"{params:,} parameters, {procs.world} process(es) on {procs.device}"
                + (f" (DDP over {dist.get_backend()})" if procs.distributed else ""),
                flush=True,
            )

    def _load_state(self) -> dict[str, Any]:
        """The checkpoint to resume from, after checking that it belongs to this recipe."""
        state = torch.load(self.out / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
        diff = recipe_diff(Recipe.from_dict(state["recipe"]), self.recipe)
        if diff:
            raise RecipeError(f"{self.out} was trained with another recipe ({'; '.join(diff)}); use a new --out")
        if state["epoch"] >= self.recipe.epochs:
            raise RecipeError(f"{self.out}: all {self.recipe.epochs} epochs are done already; nothing to resume")
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None:
            self.ema.module.load_state_dict(state["ema"])
        if self.lookahead is not None:
            self.lookahead.load_state_dict(state["lookahead"])
        if state["scaler"]:  # empty (or None, before) when it was off
            self.scaler.load_state_dict(state["scaler"])
        self.start_epoch, self.history = state["epoch"], state["history"]
        if len(state["rng"]) == self.procs.world:
            set_rng_state(state["rng"][self.procs.rank])
        else:  # another number of processes: the same data order, other augmentation draws
            seed_all(self.recipe.seed + self.procs.rank + 1000 * self.start_epoch)

    def _prepare_folder(self, resume: bool) -> None:
        """Clean up after a killed run; on resume, rewrite the files a kill left behind the checkpoint."""
        run_folder.prepare(self.out, fresh=not resume)
        run_folder.write_json(self.out / RECIPE_NAME, self.recipe.to_dict())
        weights = isinstance(self.model, VisionTransformer)  # a CNN baseline's are in the checkpoint only
        stale = run_folder.stale_files(self.out, self.start_epoch, weights=weights) if resume else []
        if stale:
            print(
                f"{self.out}: {', '.join(stale)} did not hold epoch {self.start_epoch} of {CHECKPOINT_NAME} "
                "(a kill while saving, or an older version); rewritten from it",
                flush=True,
            )
            self._commit(self.start_epoch, state=None)

    def autocast(self) -> AbstractContextManager:
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.procs.device.type, dtype=self.amp_dtype)

    def train_epoch(self, epoch: int, bar: ProgressLine, hooks: Hooks) -> dict[str, Any]:
        recipe, net, optimizer = self.recipe, self.net, self.optimizer
        self.train_batches.set_epoch(epoch)
        steps = len(self.train_batches)
        net.train()
        for m in self.frozen:  # frozen BatchNorm layers keep their statistics
            m.eval()
        stopped = None
        sums = torch.zeros(4, dtype=torch.float64, device=self.procs.device)  # loss * n, correct, n, labelled n
        t0 = time.time()
        for i, (x, y) in enumerate(self.train_batches):
            target = y
            if self.mixup is not None:
                x, target = self.mixup(x, y)
            optimizer.zero_grad(set_to_none=True)
            batch_loss = torch.zeros((), device=x.device)
            for start in range(0, len(x), self.micro_batch):
                part = slice(start, start + self.micro_batch)
                with self.autocast():
                    if self.mpp:  # predictions for the corrupted patches and their colours
                        logits, truth = self.forward(x[part])
                        loss = F.cross_entropy(logits.float(), truth)
                    else:
                        logits, truth = self.forward(x[part]), y[part]
                        held = () if self.teacher is None else (self.teacher(x[part]).float(),)
                        loss = self.criterion(logits.float(), target[part], *held)
                # each micro-batch's mean loss weighted by its share of the batch: the gradients sum to the batch's
                share = len(x[part]) / len(x)
                self.scaler.scale(loss * share).backward()
                batch_loss += loss.detach() * share
                with torch.no_grad():
                    sums[0] += loss.detach().double() * len(truth)
                    sums[1] += (logits.argmax(-1) == truth).sum() if self.mixup is None else 0
                    sums[2] += len(truth)
                    sums[3] += (truth >= 0).sum()  # outliers (target -1) are never right nor wrong
            if recipe.grad_clip is not None:
                self.scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(net.parameters(), recipe.grad_clip)
            self.scaler.step(optimizer)
            self.scaler.update()
            step = epoch * steps + i + 1
            if hooks.on_step is not None and self.procs.main:  # the learning rate this step took
                lr, total, elapsed = optimizer.param_groups[0]["lr"], recipe.epochs * steps, time.time() - self.t_start
                hooks.on_step(StepInfo(epoch, step, steps, total, batch_loss.item(), lr, elapsed, self.budget_s))
            elapsed, stopped = self._clock(hooks)
            self.scheduler.step_update(num_updates=self._schedule_step(step, elapsed))
            if self.lookahead is not None:
                self.lookahead.update(net, step)
            if self.ema is not None:
                self.ema.update(net, step=step)
            bar.step(epoch, i, batch_loss, optimizer.param_groups[0]["lr"])
            if stopped:
                break
        self.procs.all_sum(sums)
        row = {"epoch": epoch + 1, "train_loss": sums[0].item() / sums[2].item()}  # waits for the device's last step
        seconds = time.time() - t0  # so that the epoch's time is its steps' on a GPU too
        if not math.isfinite(row["train_loss"]):
            raise FloatingPointError(f"the training loss became {row['train_loss']} in epoch {epoch + 1}; lower lr")
        if self.mixup is None:  # mixed targets have no single correct class
            row["train_acc" if self.mpp else "train_top1"] = 100 * sums[1].item() / max(sums[3].item(), 1)
        done = i + 1
        return (
            row
            | {
                "lr": max(g["lr"] for g in main_groups(optimizer)),
                "images_per_s": done * recipe.batch_size / seconds,
                "epoch_time_s": seconds,
            }
            | ({"stopped": stopped, "steps": done} if stopped else {})
        )

    def _clock(self, hooks: Hooks) -> tuple[float, str | None]:
        """(seconds since the run started, why it stops now: "budget", "asked" or None), the first process's
        word for every process, so that all take the same learning rate and stop at the same step (under
        torchrun every process must be given a ``should_stop``, or none)."""
        elapsed = time.time() - self.t_start
        if self.budget_s is None and hooks.should_stop is None:
            return elapsed, None
        asked = self.procs.main and hooks.should_stop is not None and hooks.should_stop()
        word = torch.tensor([elapsed, float(asked)], dtype=torch.float64, device=self.procs.device)
        if not self.procs.main:
            word.zero_()
        elapsed, asked = self.procs.all_sum(word).tolist()
        if asked:
            return elapsed, "asked"
        return elapsed, "budget" if self.budget_s is not None and elapsed >= self.budget_s else None

    def _schedule_step(self, step: int, elapsed: float) -> int:
        """Where the schedule stands after ``step``: the step itself, or under a time budget as far as the steps
        done or the share of the budget spent say, whichever is further (so that the learning rate has decayed
        when the budget is spent, however fast the steps ran)."""
        if self.budget_s is None:
            return step
        total = self.recipe.epochs * len(self.train_batches)
        return min(total, max(step, round(total * elapsed / self.budget_s)))

    def evaluate(self) -> dict[str, Any]:
        if self.mpp:
            ev = evaluate_mpp(self.net, self.test_batches, autocast=self.autocast)
            return {"test_loss": ev["loss"], "test_acc": ev["acc"]}
        ev = evaluate(self.net, self.test_batches, len(self.classes), autocast=self.autocast)
        row = {"test_loss": ev["loss"], "test_top1": ev["top1"], "test_top5": ev["top5"]}
        if self.ema is not None:
            ev = evaluate(self.ema.module, self.test_batches, len(self.classes), autocast=self.autocast)
            row |= {"ema_test_loss": ev["loss"], "ema_test_top1": ev["top1"], "ema_test_top5": ev["top5"]}
        return row

    def exported(self) -> nn.Module:
        """The model the run folder holds: the EMA weights if any; for mpp, the ViT without the wrapper; with
        ``wise_ft`` w, a copy holding (1 - w) init + w trained floating-point tensors (integer buffers: trained)."""
        net = self.ema.module if self.ema is not None else self.net
        net = net.vit if self.mpp else net
        if self.init_state is None:
            return net
        w, mixed = self.recipe.wise_ft, copy.deepcopy(net)
        with torch.no_grad():
            for k, v in mixed.state_dict().items():
                if v.is_floating_point():
                    v.copy_((1 - w) * self.init_state[k].to(v) + w * v)
        return mixed

    def save(self, epochs_done: int) -> None:
        """Commit the epoch's files with everything needed to resume (every process's RNG states included).
        A collective call under DDP; only the first process writes."""
        rngs = [rng_state()]
        if self.procs.distributed:
            rngs = [None] * self.procs.world
            dist.all_gather_object(rngs, rng_state())
        if not self.procs.main:
            return
        state = {
            "epoch": epochs_done,
            "recipe": self.recipe.to_dict(),
            "model": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.ema.module.state_dict() if self.ema is not None else None,
            "lookahead": self.lookahead.state_dict() if self.lookahead is not None else None,
            "scaler": self.scaler.state_dict(),
            "rng": rngs,
            "history": self.history,
        }
        self._commit(epochs_done, state)

    def _commit(self, epochs_done: int, state: dict[str, Any] | None) -> None:
        curves = training_curves_figure(self.history)
        model = self.exported()
        model = model if isinstance(model, VisionTransformer) else None  # a CNN baseline: no files for the app
        run_folder.commit_epoch(self.out, epochs_done, state, model, self.history, curves)
