"""Fine-tune a folder of labelled photos: the paper's transfer (sections 3.2 and 4.2) at small scale, as one call.

``finetune_folder(data, init, out, minutes=...)`` is the whole loop: the folder's images (one sub-folder per
class) are decoded once into memory, a share of each class is held out (``data.stratified_split``), the
starting checkpoint gets a new zero-initialised head for the folder's classes (optionally a larger input, its
position embeddings interpolated in 2D), ``engine.train`` trains it within a wall-clock budget (the schedule
runs on the clock), then the held-out images calibrate the temperature and the "none of my classes" detector
(``evaluation.calibrate_model``) and measure the result (``eval_held-out_flip.json``), and the run folder gets its
model card (``README.md``). Photos of none of the classes in a folder ``_other`` (``data.other_photos``) are not a
class: every other one of them chooses the detector's score and sets its threshold (``ood.choose_with_others``),
the rest measure how many such photos it turns away (the ``details``' ``others_turned_away``). It is the same code path
as ``python -m train --recipe finetune_folder``, whose recipe is ``FINETUNE_RECIPE`` (``finish_run`` does the
calibration and card there).

Progress comes through ``on_progress`` (``Progress``: phase, step, loss, held-out accuracy, time left), and
``should_stop`` cancels: training stops after the current step, the folder keeps the model as it was then,
uncalibrated, and its model card says the run is incomplete.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..calibration import at_search_edge
from ..data import Batches, build_dataset, build_transform, other_photos, stratified_split, with_transform
from ..figures import training_curves_figure
from ..io.calibration_file import write_calibration
from ..io.checkpoint import save_pretrained
from ..io.files import RECIPE_NAME
from ..io.model_card import prepare_upload
from ..models.model import VisionTransformer
from ..training import run_folder
from ..training.builders import build_datasets, build_network, load_init
from ..training.engine import TrainResult, train
from ..training.evaluation import calibrate_model, evaluate, write_eval
from ..training.recipe import Recipe, RecipeError
from ..training.run_folder import commit
from .budget import finish_seconds, training_seconds
from .held_out import card_section, held_out_details, held_out_files
from .lpft import FeatureNet, FeaturePairs, Strategy, cache_features, choose_strategy, fit_probe, measure_speed
from .progress import Progress, Watch

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
STRATEGIES = ("auto", "full", "lp-ft", "probe")  # vit_core.finetune.lpft.Strategy's names, and "auto" to choose
# the details of an ``_other`` folder's use (``ood.OthersChoice``)
OTHERS_KEYS = ("others", "others_chose", "others_measured", "others_turned_away", "others_auroc", "score")
PROBE_NAME = "linear_probe"  # LP-FT's first stage in the run folder: the model with the probe's head
HELD_OUT_SPLIT = "held-out"  # eval_held-out_flip.json: the held-out images evaluated as predict() answers
CARD_NAME = "README.md"
_RESULT_FILES = ("README.md", "ood.safetensors", f"*_{HELD_OUT_SPLIT}*")  # globs


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
    train_seconds: float  # from the call to the end of the training: loading, the probe's features included
    history: list[dict[str, Any]]
    strategy: str  # "full", "lp-ft" or "probe" (vit_core.finetune.lpft.Strategy)
    strategy_reason: str  # why, one sentence
    details: dict[str, Any]  # for a result page (held_out.held_out_details, ece, threshold); {} if cancelled


@dataclass
class ProbeFeatures:
    """A probe's run, whose cached features stand in for the frozen model in ``finish_run`` (``lpft.FeatureNet``):
    the held-out and training images' (plain, mirror) feature pairs, the views to calibrate for, the run, and the
    photos of other things' pairs (None without an ``_other`` folder)."""

    net: FeatureNet
    held_out: FeaturePairs
    fit: FeaturePairs
    tta: str | None
    result: TrainResult
    others: FeaturePairs | None = None


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
    strategy: str = "auto",
    on_progress: Callable[[Progress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    overrides: dict[str, Any] | None = None,
    overwrite: bool = False,
    progress_bar: bool = False,
    within_budget: bool = False,
) -> FinetuneResult:
    """Fine-tune ``init`` on the folder ``data`` (``data/<class>/<images>``) within ``minutes`` of training
    (None: ``epochs`` of ``overrides``, 100 by default), writing the run folder ``out``; see the module's docstring.

    ``strategy``: "auto" measures the model's speed here and picks "full", "lp-ft" or "probe" for the budget
    (``vit_core.finetune.lpft.choose_strategy``; "full" without a budget); the others force one (LP-FT then fine-tunes
    every block). ``image_size``: the input size to fine-tune at (None: the checkpoint's); a larger one keeps
    the patch size, so the sequence grows and the position embeddings are interpolated (paper section 3.2).
    ``val_fraction``: the share of each class held out for the validation accuracy and the calibration.
    ``overrides``: other recipe keys (``vit_core.training.recipe.Recipe``). ``overwrite``: write into a folder that is
    not empty. ``on_progress`` and ``should_stop`` are called in this thread, from the training loop.
    ``within_budget``: ``minutes`` covers the whole call, calibration and writing included (``finetune.budget``:
    training gets what their estimate leaves; ``BudgetTooShort`` before training when that is nothing)."""
    if strategy not in STRATEGIES:
        raise RecipeError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    t0 = time.time()
    out = Path(out)
    report = on_progress or (lambda p: None)
    report(Progress("loading"))
    recipe = finetune_recipe(
        data, init, minutes=minutes, image_size=image_size, val_fraction=val_fraction, overrides=overrides
    )
    run_folder.check_out(out, resume=False, overwrite=overwrite)
    if overwrite:
        for pattern in _RESULT_FILES:  # an earlier run's results must not be taken for this one's
            for path in out.glob(pattern):
                path.unlink()
    plan, features = Strategy("full", 0, 0, "no time budget: the recipe's epochs fine-tune the whole model", 0), None
    timed = recipe.budget_minutes is not None
    if (within_budget and timed) or (strategy != "full" and (timed or strategy != "auto")):
        plan, recipe, features = _probe_first(recipe, out, strategy, t0, report, within_budget and timed)
    watch = Watch(report, t0, recipe, plan)
    if plan.name == "probe":
        result = features.result
    else:
        result = train(recipe, out, progress=progress_bar, overwrite=True, hooks=watch.hooks(should_stop))
        features = None
    trained_s = time.time() - t0  # loading, timing, the probe's features and the training
    complete = result.stopped != "asked"
    if complete:
        report(watch.progress("calibrating", 0.0))
    strategy_text = f"{plan.name}: {plan.reason}"
    measured = finish_run(
        out, recipe, result, calibrate=complete, progress=progress_bar, features=features, strategy=strategy_text
    )
    model = result.model.eval()
    report(
        dataclasses.replace(watch.progress("done" if complete else "cancelled", 0.0), val_accuracy=measured.get("top1"))
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
        train_seconds=trained_s,
        history=result.history,
        strategy=plan.name,
        strategy_reason=plan.reason,
        details=measured.get("details", {}),
    )


def _probe_first(
    recipe: Recipe, out: Path, strategy: str, t0: float, report: Callable[[Progress], None], whole: bool = False
) -> tuple[Strategy, Recipe, ProbeFeatures | None]:
    """Measure, choose, and for "lp-ft" and "probe" fit the linear probe on cached features (Kumar et al. 2022).
    Returns the strategy, the recipe the engine then runs ("lp-ft": from the probe's checkpoint, its head kept,
    the first blocks frozen, on what is left of the budget) and, for "probe", what ``finish_run`` calibrates
    from (``ProbeFeatures``). ``whole``: the budget covers what follows the training too (``finetune.budget``)."""
    model = load_init(recipe.init, **recipe.model_args)
    depth, budget = len(model.blocks), 60 * (recipe.budget_minutes or 0.0)
    kept, held = stratified_split(build_dataset(recipe.data, "train").targets, recipe.val_fraction)
    speed = measure_speed(model, model.config.img_hw) if strategy == "auto" or whole else None
    others = other_photos(recipe.data)  # an ``_other`` folder's photos (None without), read at the eval transform
    if whole:  # training ends when what follows it must start (timed before any photo is decoded)
        params, n_others = sum(p.numel() for p in model.parameters()), 0 if others is None else len(others)
        after = finish_seconds(speed.forward_s, len(kept), len(held), params, n_others)
        budget = time.time() - t0 + training_seconds(budget - (time.time() - t0), after)
    if strategy == "auto":  # "full" leaves the decoding to the engine
        left = budget - (time.time() - t0)
        plan = choose_strategy(speed, len(kept), len(held), depth, left, recipe.batch_size)
    else:  # forced: LP-FT fine-tunes every block after the probe
        plan = Strategy(strategy, depth if strategy == "lp-ft" else 0, 2, f"{strategy} was asked for", 0)
    report(Progress("features", total_steps=plan.steps, elapsed_s=time.time() - t0, strategy=plan.reason))
    if plan.name == "full":  # within the whole budget: what is left (the engine's decoding is in ``after``)
        left = max(budget - (time.time() - t0), 1.0) / 60
        return plan, Recipe.from_dict(recipe.to_dict() | dict(budget_minutes=left)) if whole else recipe, None
    train_set, held_out = build_datasets(recipe, model.config.pretrained_cfg())
    net = build_network(recipe, model, list(train_set.classes), train_set)
    plain_tf = build_transform(net.pretrained_cfg)
    plain = with_transform(train_set, plain_tf)
    views = [cache_features(net, plain, desc="features")]
    views += [cache_features(net, plain, mirror=True, desc="mirrored")] if plan.copies > 1 else []
    views += [cache_features(net, train_set, desc=f"augmented copy {i}") for i in range(2, plan.copies)]
    held_plain = cache_features(net, held_out, desc="held-out")
    held_mirror = cache_features(net, held_out, mirror=True, desc="held-out mirrored") if plan.tta else held_plain
    held = FeaturePairs(held_plain, held_mirror, held_out.targets)
    other_pairs = None
    if others is not None:
        others.transform = plain_tf
        other_plain = cache_features(net, others, desc="other photos")
        other_mirror = cache_features(net, others, mirror=True, desc="other photos mirrored") if plan.tta else None
        other_pairs = FeaturePairs(other_plain, other_plain if other_mirror is None else other_mirror, others.targets)
    labels = train_set.targets
    x, y = torch.cat(views), labels.repeat(len(views))
    weight, bias = fit_probe(x, y, len(train_set.classes))
    logits = torch.nn.functional.linear(x, weight, bias)
    row = dict(epoch=1, train_loss=torch.nn.functional.cross_entropy(logits, y).item(), copies=len(views))
    row["train_top1"] = 100 * (logits.argmax(-1) == y).float().mean().item()
    with torch.no_grad():
        net.head.weight.copy_(weight)
        net.head.bias.copy_(bias)
    if plan.name == "lp-ft":
        save_pretrained(net, out / PROBE_NAME)
        frozen = ["patch_embed", *[f"blocks.{i}" for i in range(depth - plan.blocks)]]
        left = None if recipe.budget_minutes is None else max(budget - (time.time() - t0), 1.0) / 60  # a step
        ft = recipe.to_dict() | dict(init=str(out / PROBE_NAME), keep_head=True, freeze=frozen, budget_minutes=left)
        return plan, Recipe.from_dict(ft), None
    fit = FeaturePairs(views[0], views[1] if len(views) > 1 else views[0], labels)
    history = [row | dict(elapsed_s=time.time() - t0, stopped=None)]
    _write_probe_run(out, recipe, net, history)
    result = TrainResult(net.eval(), history, train_set, held_out)
    return plan, recipe, ProbeFeatures(FeatureNet(net), held, fit, plan.tta, result, other_pairs)


def _write_probe_run(out: Path, recipe: Recipe, net: VisionTransformer, history: list[dict[str, Any]]) -> None:
    """The run folder of a probe: its recipe, the model and its metrics, as a run of the engine writes them."""
    run_folder.prepare(out, fresh=True)
    run_folder.write_json(out / RECIPE_NAME, recipe.to_dict())
    run_folder.commit_epoch(out, 1, None, net, history, training_curves_figure(history))


def finish_run(
    out: Path,
    recipe: Recipe,
    result: TrainResult,
    *,
    calibrate: bool = True,
    progress: bool = True,
    features: ProbeFeatures | None = None,
    strategy: str = "full: the recipe as given",
) -> dict[str, Any]:
    """After a run with ``val_fraction``: with ``calibrate``, fit the model's temperature (image and mirror) and
    its Mahalanobis "none of my classes" detector on the held-out images (the statistics from the training
    images, without augmentation), store them (``calibration_file.write_calibration``) and evaluate the held-out images
    as ``predict`` answers (``eval_held-out_flip.json``); then write the model card ``README.md``. A temperature
    at the edge of its search (``calibration.at_search_edge``) is not kept: T = 1, and the calibration says the
    held-out images could not set it. ``features``: a probe's cached features stand in for the model
    (``_probe_first``); ``strategy``: what the card says of it. Returns the held-out ``top1``, ``temperature``,
    OOD ``threshold`` and the result page's ``details`` (``held_out_details``); empty without ``calibrate``."""
    model, measured = result.model, {}
    if calibrate:
        name = Path(recipe.data).name
        net, held, fit, tta = model, result.test_set, None, "flip"
        others = other_photos(recipe.data, build_transform(model.pretrained_cfg))
        if features is not None:
            net, held, fit, tta, others = features.net, features.held_out, features.fit, features.tta, features.others
        fit = fit or with_transform(result.train_set, build_transform(model.pretrained_cfg))
        calibration, fitted = calibrate_model(
            net,
            held,
            fit,
            tta=tta,
            held_out_name=f"the {len(result.test_set)} images held out of {name} (val_fraction {recipe.val_fraction})",
            fit_name=f"the {len(result.train_set)} training images of {name}",
            progress=progress,
            others=others,
        )
        note = None
        if at_search_edge(calibration.temperature):
            note = (
                f"T = 1 kept: the held-out images could not set the temperature (its fit on them ran to the edge "
                f"of its range, T = {calibration.temperature:.3g})"
            )
            calibration = dataclasses.replace(
                calibration, temperature=1.0, fitted_on=f"{note}; {calibration.fitted_on}"
            )
        write_calibration(out, calibration)
        model.calibration = net.calibration = calibration
        batches = Batches(held, recipe.eval_batch_size, next(net.parameters()).device, train=False)
        classes = list(result.train_set.classes)
        ev = evaluate(net, batches, len(classes), tta=calibration.tta)
        what = {
            "labels": classes,
            "model": str(out),
            "data": recipe.data,
            "split": HELD_OUT_SPLIT,
            "tta": calibration.tta,
        }
        write_eval(ev | what, out)
        files = held_out_files(recipe.data, recipe.val_fraction)
        details = held_out_details(net, batches, files, classes)
        details |= {"ece": ev["ece"], "threshold": fitted.get("threshold"), "temperature_note": note}
        details |= {key: fitted[key] for key in ("kept", *OTHERS_KEYS) if key in fitted}
        measured = {"top1": ev["top1"], "temperature": calibration.temperature, "threshold": fitted.get("threshold")}
        measured["details"] = details
    _, card = prepare_upload(out, out.name)
    if measured:
        card += card_section(measured["details"], strategy)
    commit(out, {CARD_NAME: lambda f: f.write(card.encode())})
    return measured
