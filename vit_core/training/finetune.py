"""Fine-tune a folder of labelled photos: the paper's transfer (sections 3.2 and 4.2) at small scale, as one call.

``finetune_folder(data, init, out, minutes=...)`` is the whole loop: the folder's images (one sub-folder per
class) are decoded once into memory, a share of each class is held out (``data.stratified_split``), the
starting checkpoint gets a new zero-initialised head for the folder's classes (optionally a larger input, its
position embeddings interpolated in 2D), ``engine.train`` trains it within a wall-clock budget (the schedule
runs on the clock), then the held-out images calibrate the temperature and the "none of my classes" detector
(``evaluation.calibrate_model``) and measure the result (``eval_held-out_flip.json``), and the run folder gets its
model card (``README.md``). It is the same code path as ``python -m train --recipe finetune_folder``, whose
recipe is ``FINETUNE_RECIPE`` (``finish_run`` does the calibration and card there).

Progress comes through ``on_progress`` (``Progress``: phase, step, loss, held-out accuracy, time left), and
``should_stop`` cancels: training stops after the current step, the folder keeps the model as it was then,
uncalibrated, and its model card says the run is incomplete.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data import Batches, build_dataset, build_transform, stratified_split, with_transform
from ..io.calibration_file import write_calibration
from ..io.model_card import prepare_upload
from ..models.model import VisionTransformer
from .engine import TrainResult, train
from .evaluation import calibrate_model, evaluate, write_eval
from .progress import Hooks, StepInfo
from .recipe import Recipe, RecipeError
from .run_folder import commit

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
HELD_OUT_SPLIT = "held-out"  # eval_held-out_flip.json: the held-out images evaluated as predict() answers
CARD_NAME = "README.md"
_RESULT_FILES = ("README.md", "ood.safetensors", f"*_{HELD_OUT_SPLIT}*")  # globs


@dataclass(frozen=True)
class Progress:
    """What ``on_progress`` is told: after each training step, each epoch, and at each change of phase."""

    phase: str  # "loading", "training", "calibrating", "done" or "cancelled"
    step: int = 0  # optimizer steps done
    total_steps: int | None = None  # the steps the budget is expected to allow (a rough guess before the first)
    epoch: int = 0  # epochs finished
    loss: float | None = None  # the last batch's training loss
    val_accuracy: float | None = None  # top-1 (%) on the held-out images after the last finished epoch
    elapsed_s: float = 0.0  # since finetune_folder was called
    eta_s: float | None = None  # time left until the run folder is written, estimated


@dataclass
class FinetuneResult:
    """What ``finetune_folder`` returns."""

    out: Path  # the run folder: vit_core.from_pretrained(out) loads it
    model: VisionTransformer  # as saved there, calibrated unless cancelled, in eval mode
    complete: bool  # False: cancelled (``should_stop``); the folder holds the model as it was then, uncalibrated
    classes: list[str]
    train_images: int
    val_images: int
    val_accuracy: float | None  # top-1 (%) on the held-out images, as predict() answers (calibrated views)
    temperature: float | None
    ood_threshold: float | None
    steps: int
    train_seconds: float
    history: list[dict[str, Any]]


def finetune_recipe(
    data: str | Path,
    init: str | Path | None,
    *,
    minutes: float | None = 3.0,
    image_size: int | None = None,
    val_fraction: float = 0.2,
    overrides: dict[str, Any] | None = None,
) -> Recipe:
    """``FINETUNE_RECIPE`` for ``data`` from ``init`` (a run folder, Hub id or timm:<name>; None: from scratch,
    the architecture in ``overrides``), with ``overrides`` (recipe keys) last; the batch is made no larger than
    the training images the split leaves."""
    d = FINETUNE_RECIPE | dict(data=str(data), init=None if init is None else str(init))
    d |= dict(budget_minutes=minutes, val_fraction=val_fraction)
    if image_size is not None:
        d["model_args"] = {"img_size": image_size}
    d |= overrides or {}
    if "warmup_epochs" not in (overrides or {}):  # the same share of a run with other epochs
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
    minutes: float | None = 3.0,
    image_size: int | None = None,
    val_fraction: float = 0.2,
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    overrides: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress_bar: bool = False,
) -> FinetuneResult:
    """Fine-tune ``init`` on the folder ``data`` (``data/<class>/<images>``) within ``minutes`` of training
    (None: ``epochs`` of ``overrides``, 100 by default), writing the run folder ``out``; see the module's docstring.

    ``image_size``: the input size to fine-tune at (None: the checkpoint's); a larger one keeps the patch size,
    so the sequence grows and the position embeddings are interpolated (paper section 3.2). ``val_fraction``:
    the share of each class held out for the validation accuracy and the calibration. ``overrides``: other
    recipe keys (``vit_core.training.recipe.Recipe``). ``overwrite``: write into a folder that is not empty.
    ``on_progress`` and ``should_stop`` are called in this thread, from the training loop."""
    t0 = time.time()
    out = Path(out)
    report = on_progress or (lambda p: None)
    report(Progress("loading"))
    recipe = finetune_recipe(
        data, init, minutes=minutes, image_size=image_size, val_fraction=val_fraction, overrides=overrides
    )
    if overwrite:
        for pattern in _RESULT_FILES:  # an earlier run's results must not be taken for this one's
            for path in out.glob(pattern):
                path.unlink()
    watch = _Watch(report, t0, recipe)
    result = train(recipe, out, progress=progress_bar, overwrite=overwrite, hooks=watch.hooks(should_stop))
    complete = result.stopped != "asked"
    if complete:
        report(Progress("calibrating", watch.step, watch.step, len(result.history), elapsed_s=time.time() - t0))
    measured = finish_run(out, recipe, result, calibrate=complete, progress=progress_bar)
    model = result.model.eval()
    report(
        Progress(
            "done" if complete else "cancelled",
            watch.step,
            watch.step,
            len(result.history),
            watch.loss,
            measured.get("top1"),
            time.time() - t0,
            0.0,
        )
    )
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
        train_seconds=result.history[-1]["elapsed_s"],
        history=result.history,
    )


def finish_run(
    out: Path, recipe: Recipe, result: TrainResult, *, calibrate: bool = True, progress: bool = True
) -> dict[str, Any]:
    """After a run with ``val_fraction``: with ``calibrate``, fit the model's temperature (image and mirror) and
    its Mahalanobis "none of my classes" detector on the held-out images (the statistics from the training
    images, without augmentation), store them (``calibration_file.write_calibration``) and evaluate the held-out images
    as ``predict`` answers (``eval_held-out_flip.json``); then write the model card ``README.md``. Returns the held-out
    ``top1``, ``temperature`` and OOD ``threshold`` (empty without ``calibrate``)."""
    model, measured = result.model, {}
    if calibrate:
        name = Path(recipe.data).name
        calibration, fit = calibrate_model(
            model,
            result.test_set,
            with_transform(result.train_set, build_transform(model.pretrained_cfg)),
            held_out_name=f"the {len(result.test_set)} images held out of {name} (val_fraction {recipe.val_fraction})",
            fit_name=f"the {len(result.train_set)} training images of {name}",
            progress=progress,
        )
        write_calibration(out, calibration)
        model.calibration = calibration
        batches = Batches(result.test_set, recipe.eval_batch_size, next(model.parameters()).device, train=False)
        classes = list(result.train_set.classes)
        ev = evaluate(model, batches, len(classes), tta=calibration.tta)
        what = {
            "labels": classes,
            "model": str(out),
            "data": recipe.data,
            "split": HELD_OUT_SPLIT,
            "tta": calibration.tta,
        }
        write_eval(ev | what, out)
        measured = {"top1": ev["top1"], "temperature": calibration.temperature, "threshold": fit.get("threshold")}
    _, card = prepare_upload(out, out.name)
    commit(out, {CARD_NAME: lambda f: f.write(card.encode())})
    return measured


class _Watch:
    """Turns the engine's hooks into ``Progress`` reports, with a time-left estimate."""

    def __init__(self, report: Callable[[Progress], None], t0: float, recipe: Recipe) -> None:
        self.report, self.t0, self.recipe = report, t0, recipe
        self.step, self.loss, self.val, self.epoch, self.total = 0, None, None, 0, None

    def hooks(self, should_stop: Callable[[], bool] | None) -> Hooks:
        return Hooks(on_step=self.on_step, on_epoch=self.on_epoch, should_stop=should_stop)

    def on_step(self, info: StepInfo) -> None:
        self.step, self.loss = info.step, info.loss
        rate = info.elapsed_s / info.step  # seconds per step so far, evaluations included
        total = info.total_steps if info.budget_s is None else min(info.total_steps, round(info.budget_s / rate))
        self.total = max(total, info.step)
        left = rate * (self.total - info.step)
        self.report(self._progress(left))

    def on_epoch(self, row: dict[str, Any]) -> None:
        self.epoch, self.val = row["epoch"], row.get("test_top1")
        left = None if self.total is None else (time.time() - self.t0) / max(self.step, 1) * (self.total - self.step)
        self.report(self._progress(left))

    def _progress(self, left: float | None) -> Progress:
        elapsed = time.time() - self.t0
        return Progress("training", self.step, self.total, self.epoch, self.loss, self.val, elapsed, left)
