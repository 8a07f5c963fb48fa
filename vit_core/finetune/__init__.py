"""Fine-tune a folder of labelled photos: the paper's transfer (sections 3.2 and 4.2) at small scale, as one call.

``finetune_folder(data, init, out, options=FinetuneOptions(minutes=...))`` is the whole loop: the folder's images
(one sub-folder per class) are decoded once into memory, a share of each class is held out
(``data.stratified_split``), the starting checkpoint gets a new head for the folder's classes (optionally a larger
input, its position embeddings interpolated in 2D), and the budget is spent in stages (``finetune.stages``): a
linear probe on cached features within seconds, then the engine on more and more of the model from the best so
far, each stage on what is left of the clock and checked on the held-out photos, the best kept. Then the held-out
images calibrate the temperature and the "none of my classes" detector (``evaluation.calibrate_model``;
``finish_run``) and measure the result (``eval_held-out_flip.json``), and the run folder gets its model card
(``README.md``).
Photos of none of the classes in a folder ``_other`` (``data.other_photos``) are not a class: every other one of
them chooses the detector's score and sets its threshold (``ood.choose_with_others``), the rest measure how many
such photos it turns away (the ``details``' ``others_turned_away``). It is the same code path as
``python -m train --recipe finetune_folder``, whose recipe is ``FINETUNE_RECIPE`` (``finish_run`` does the
calibration and card there).

Progress comes through the ``Monitor``'s ``on_progress`` (``Progress``: phase, stage, step, loss, held-out
accuracy, the best so far, time left), and its ``should_stop`` cancels: training stops after the current step, the
folder keeps the model as it was then, uncalibrated, and its model card says the run is incomplete.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data import build_dataset, other_photos, stratified_split
from ..io.checkpoint import save_pretrained
from ..models.model import VisionTransformer
from ..training import run_folder
from ..training.builders import load_init
from ..training.engine import TrainResult, train
from ..training.recipe import Recipe, RecipeError
from .budget import finish_seconds, training_seconds
from .finish import CARD_NAME, HELD_OUT_SPLIT, OTHERS_KEYS, finish_run
from .lpft import forward_seconds
from .progress import Monitor, Progress, Watch
from .stages import BEST_NAME, PROBE_NAME, Plan, StageRecord, probe, record_of, stage_name, stage_recipe, write_best

__all__ = ["CARD_NAME", "FINETUNE_RECIPE", "HELD_OUT_SPLIT", "OTHERS_KEYS", "PROBE_NAME", "STRATEGIES"]
__all__ += ["FinetuneOptions", "FinetuneResult", "Monitor", "Progress", "finetune_folder", "finetune_recipe"]
__all__ += ["finish_run"]

# What fine-tuning a small folder of photos (2-20 classes, tens to hundreds of images each) takes by default:
# the recipe of `python -m train --recipe finetune_folder` (which adds the bundled model as init).
FINETUNE_RECIPE: dict[str, Any] = dict(
    val_fraction=0.2,
    in_memory=True,
    augment=dict(crop="rrc", scale=(0.35, 1.0), hflip=True),
    label_smoothing=0.1,
    epochs=100,  # the most it may run; the budget usually ends it first
    batch_size=32,
    opt="sgd",  # as the paper fine-tunes: SGD with momentum, no weight decay, gradients clipped at norm 1
    momentum=0.9,
    lr=0.01,
    weight_decay=0.0,
    grad_clip=1.0,
    warmup_epochs=3,  # 3% of the schedule
    min_lr=1e-5,
    budget_minutes=3.0,
    cpu_precision="bf16",
    channels_last=True,
)
# "auto": the stages (``finetune.stages``); the others force one way: the whole model from a zero head as the recipe
# says, the probe then every block (LP-FT), or the probe alone
STRATEGIES = ("auto", "full", "lp-ft", "probe")
_RESULT_FILES = ("README.md", "ood.safetensors", f"*_{HELD_OUT_SPLIT}*", "stages", PROBE_NAME)  # globs


@dataclass
class FinetuneResult:
    """What ``finetune_folder`` returns."""

    out: Path  # the run folder: vit_core.from_pretrained(out) loads it
    model: VisionTransformer  # as saved there, calibrated unless cancelled, in eval mode
    complete: bool  # False: cancelled (``Monitor.should_stop``); the folder holds the model as it was, uncalibrated
    classes: list[str]
    train_images: int
    val_images: int
    val_accuracy: float | None  # top-1 (%) on the held-out images, as predict() answers (calibrated views)
    temperature: float | None
    ood_threshold: float | None  # the raw threshold, for programs: people get ``details``' words
    steps: int  # every stage's optimizer steps
    train_seconds: float  # from the call to the end of the training: loading, the probe's features included
    history: list[dict[str, Any]]  # every stage's epochs, each row naming its ``stage``
    strategy: str  # the kept stage's kind: "full", "lp-ft" or "probe"
    strategy_reason: str  # what ran, one sentence: each stage, its epochs and held-out accuracy
    details: dict[str, Any]  # for a result page (``finish.finish_run``: held-out results, ``stages``); {} if cancelled


@dataclass(frozen=True)
class FinetuneOptions:
    """How ``finetune_folder`` fine-tunes, as one value: the callers (the Train tab, the command line, the
    benchmarks) each state their choice once, and an option added here reaches them without a new parameter on
    every function between. The defaults are the Train tab's recipe (``FINETUNE_RECIPE``) within 3 minutes."""

    minutes: float | None = 3.0  # the training's budget; None: the recipe's epochs (``overrides``, 100 by default)
    # ``minutes`` covers the whole call, calibration and writing included (``finetune.budget``: training stops when
    # what is left is what they are estimated to take; ``BudgetTooShort`` before training when that is nothing)
    within_budget: bool = False
    # the input size to fine-tune at (None: the checkpoint's); a larger one keeps the patch size, so the sequence
    # grows and the position embeddings are interpolated (paper section 3.2)
    image_size: int | None = None
    # the share of each class held out: the validation accuracy, the choice of stage and the calibration
    val_fraction: float = 0.2
    # "auto" runs the stages (``finetune.stages``: the probe, then more of the model while the budget lasts, the
    # best kept; without a budget, the whole model for the recipe's epochs, as "full"); "full", "lp-ft" and "probe"
    # force one way (LP-FT then fine-tunes every block)
    strategy: str = "auto"
    overrides: dict[str, Any] | None = None  # other recipe keys (``vit_core.training.recipe.Recipe``), applied last
    overwrite: bool = False  # write into a run folder that is not empty (an earlier run's results removed)
    # every stage's model stays in ``out/stages/<n>`` (the probe's is in ``out/linear_probe`` in any case), for a
    # benchmark to measure each
    keep_stages: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:  # refused where it is chosen, before any photo is read
            raise RecipeError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")


def finetune_recipe(data: str | Path, init: str | Path | None, options: FinetuneOptions | None = None) -> Recipe:
    """``FINETUNE_RECIPE`` for ``data`` from ``init`` (a run folder, Hub id or timm:<name>; None: from scratch,
    the architecture in the options' ``overrides``) with the ``options``' budget, input size and held-out share,
    their ``overrides`` (recipe keys) last; the batch is made no larger than the training images the split leaves."""
    options = options or FinetuneOptions()
    overrides = options.overrides or {}
    d = FINETUNE_RECIPE | dict(data=str(data), init=None if init is None else str(init))
    d |= dict(budget_minutes=options.minutes, val_fraction=options.val_fraction)
    if options.image_size is not None:
        d["model_args"] = {"img_size": options.image_size}
    d |= overrides
    if "warmup_epochs" not in overrides:  # the same share of a run with other epochs
        d["warmup_epochs"] = FINETUNE_RECIPE["warmup_epochs"] * d["epochs"] / FINETUNE_RECIPE["epochs"]
    targets = build_dataset(d["data"], "train").targets
    kept, _ = stratified_split(targets, d["val_fraction"])
    if not kept.numel():
        raise RecipeError(f"{data}: too few images to hold any out; give every class at least two")
    d["batch_size"] = min(d["batch_size"], len(kept))
    return Recipe.from_dict(d)


def finetune_folder(
    data: str | Path,
    init: str | Path | None,
    out: str | Path,
    *,
    options: FinetuneOptions | None = None,
    monitor: Monitor | None = None,
) -> FinetuneResult:
    """Fine-tune ``init`` on the folder ``data`` (``data/<class>/<images>``) as the ``options`` say (by default,
    the Train tab's recipe within 3 minutes of training), writing the run folder ``out``; see the module's
    docstring. ``monitor``: the caller's progress reports, cancellation and progress line (none by default)."""
    options, monitor = options or FinetuneOptions(), monitor or Monitor()
    t0 = time.time()
    out = Path(out)
    monitor.report(Progress("loading"))
    recipe = finetune_recipe(data, init, options)
    run_folder.check_out(out, resume=False, overwrite=options.overwrite)
    if options.overwrite:
        for pattern in _RESULT_FILES:  # an earlier run's results must not be taken for this one's
            for path in out.glob(pattern):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    budget_s = None if recipe.budget_minutes is None else 60 * recipe.budget_minutes
    watch = Watch(monitor, t0, budget_s)
    model = load_init(recipe.init, **recipe.model_args)
    targets = build_dataset(recipe.data, "train").targets
    n_train, n_held = (len(s) for s in stratified_split(targets, recipe.val_fraction))
    others = other_photos(recipe.data)
    sizes = (n_train, n_held, sum(p.numel() for p in model.parameters()), 0 if others is None else len(others))
    reserve = 0.0  # what finishing keeps of the budget: only where the budget covers the whole call
    if options.within_budget and budget_s is not None:  # timed before any photo is decoded; revised after the probe's
        reserve = finish_seconds(forward_seconds(model, model.config.img_hw), *sizes)
        training_seconds(budget_s - (time.time() - t0), reserve)  # BudgetTooShort when nothing is left
    strategy = options.strategy
    if strategy == "full" or (strategy == "auto" and budget_s is None):
        left = None if budget_s is None or not reserve else max(budget_s - reserve - (time.time() - t0), 1.0)
        run = recipe if left is None else Recipe.from_dict(recipe.to_dict() | dict(budget_minutes=left / 60))
        watch.begin("whole model", "the whole model from a new head, as the recipe says")
        start = time.time()
        result = train(run, out, progress=False, overwrite=True, hooks=watch.hooks())
        records = [record_of(result, 1, 1, watch.step, run.batch_size, time.time() - start)]
        records[0].kept, features, best_recipe = True, None, run
    else:
        deadline = None if budget_s is None else t0 + budget_s
        result, records, features, best_recipe = _stages(
            recipe, model, out, strategy, watch, deadline=deadline, sizes=sizes if reserve else None,
            keep=options.keep_stages,
        )  # fmt: skip
    trained_s = time.time() - t0  # loading, the probe's features and the training
    complete = result.stopped != "asked"
    if complete:
        watch.emit("calibrating")
    kept = next(r for r in records if r.kept)
    reason = _what_ran(records, trained_s)
    measured = finish_run(
        out, best_recipe, result, calibrate=complete, progress=monitor.progress_bar, features=features, strategy=reason,
        stages=[r.as_dict() for r in records],
    )  # fmt: skip
    model = result.model.eval()
    watch.val = measured.get("top1")
    watch.emit("done" if complete else "cancelled")
    return FinetuneResult(
        out=out,
        model=model,
        complete=complete,
        classes=list(result.train_set.classes),
        train_images=len(result.train_set),
        val_images=len(result.test_set),
        val_accuracy=measured.get("top1"),
        temperature=measured.get("temperature"),
        ood_threshold=measured.get("threshold"),
        steps=watch.step,
        train_seconds=trained_s,
        history=result.history,
        strategy=kept.kind,
        strategy_reason=reason,
        details=measured.get("details", {}),
    )


def _stages(
    recipe: Recipe,
    model: VisionTransformer,
    out: Path,
    strategy: str,
    watch: Watch,
    *,
    deadline: float | None = None,
    sizes: tuple[int, int, int, int] | None = None,
    keep: bool = False,
) -> tuple[TrainResult, list[StageRecord], Any, Recipe]:
    """The probe, then (``strategy`` "auto") stages while the budget affords them, or ("lp-ft") every block once;
    training ends at ``deadline`` less what finishing is estimated to take (``sizes``: the photos and parameters
    it is estimated for; None: nothing kept). Returns the kept stage's result (every stage's rows in its
    history), the records, the probe's features when the probe is kept, and the kept stage's recipe."""
    depth = len(model.blocks)
    watch.begin("linear probe", "a linear probe on cached features first, then more of the model while time lasts")
    watch.emit("features")
    features, record = probe(recipe, model, out, watch.t0)
    record.kept, history = True, list(features.result.history)
    end = deadline
    if deadline is not None and sizes is not None:  # the forward speed measured over every photo
        end = deadline - finish_seconds(features.forward_s, *sizes)
    plan = Plan(features.forward_s, sizes[0] if sizes else len(features.fit), len(features.held_out), depth)
    plan.measured(record)
    watch.finished(record.name, record.held_out_top1, record.held_out_top1)
    best = (record, features.result, recipe, out / PROBE_NAME)
    result = features.result
    while strategy != "probe" and not (strategy == "lp-ft" and len(plan.records) > 1):
        left = float("inf") if end is None else end - time.time()
        step = (depth, None if end is None else left) if strategy == "lp-ft" else plan.next_stage(left)
        if step is None or left <= 0:
            break
        blocks, seconds = step
        if best[3] == out:  # the best so far is the stage before, whose folder this one overwrites
            save_pretrained(best[1].model, out / BEST_NAME)
            best = (*best[:3], out / BEST_NAME)
        run = stage_recipe(recipe, best[3], blocks, depth, None if seconds is None else seconds - plan.setup_s())
        watch.begin(stage_name(blocks, depth))
        start = time.time()
        result = train(run, out, progress=False, overwrite=True, hooks=watch.hooks())
        record = record_of(result, blocks, depth, watch.stage_steps(), run.batch_size, time.time() - start)
        if keep:
            save_pretrained(result.model, out / "stages" / str(len(plan.records)))
        plan.measured(record, setup_s=record.seconds - (result.history[-1]["elapsed_s"] if result.history else 0))
        n = len(history)
        since = start - watch.t0  # rows count their epochs and seconds from the call, across the stages
        tag = dict(stage=record.name, stage_n=len(plan.records) - 1)  # the stage's name and its place in the run
        history += [r | tag | dict(epoch=n + r["epoch"], elapsed_s=since + r["elapsed_s"]) for r in result.history]
        if record.stopped != "asked" and (record.held_out_top1 or 0) >= (best[0].held_out_top1 or 0):
            best[0].kept, record.kept = False, True
            best = (record, result, run, out)
        watch.finished(record.name, record.held_out_top1, best[0].held_out_top1, record.epochs)
        if record.stopped == "asked":
            record.kept = True
            return (
                TrainResult(result.model, history, result.train_set, result.test_set, "asked"),
                plan.records,
                None,
                run,
            )
    kept, kept_result, kept_recipe, _ = best
    write_best(out, kept_recipe, kept_result.model, history)
    shutil.rmtree(out / BEST_NAME, ignore_errors=True)
    kept_result = TrainResult(kept_result.model, history, kept_result.train_set, kept_result.test_set,
                              kept_result.stopped)  # fmt: skip
    return kept_result, plan.records, features if kept.kind == "probe" else None, kept_recipe


def _what_ran(records: list[StageRecord], seconds: float) -> str:
    """The stages in one sentence: each one's epochs and held-out accuracy, and which was kept."""
    parts = []
    for r in records:
        top1 = "" if r.held_out_top1 is None else f", {r.held_out_top1:.1f}% held-out"
        epochs = "" if r.kind == "probe" else f" for {r.epochs} epoch{'s' * (r.epochs != 1)} ({r.steps} steps)"
        parts.append(f"{r.name}{epochs}{top1}" + (" (kept)" if r.kept else ""))
    return f"{len(records)} stage{'s' * (len(records) != 1)} in {seconds:.0f} s: " + "; then ".join(parts)
