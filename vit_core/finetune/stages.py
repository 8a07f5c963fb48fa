"""Anytime fine-tuning: a usable model within seconds, then the rest of the budget spent improving it in stages.

The first stage is the linear probe (``lpft.fit_probe``) on features cached once per photo and its mirror: a few
forward passes whatever the model, and a model that answers. Each later stage is a run of the engine from the best
model so far, its head kept (LP-FT, Kumar et al., ICLR 2022: the head first, then the body), with more blocks
unfrozen as the budget allows (gradual unfreezing, Howard & Ruder, ACL 2018): the last half of the blocks, then
the whole model, each on the clock (``budget_minutes``: its learning rate decays by its end however fast its steps
run). Each stage is checked on the held-out photos and the best is kept. What a stage may spend is what is left of
the budget when it starts, so that a machine slowed by other work gets fewer epochs, never an unused budget: the
plan (which blocks a stage trains, how long) is an estimate from the probe's measured forward speed, revised after
every stage from the epochs it actually ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data import build_transform, other_photos, with_transform
from ..figures import training_curves_figure
from ..io.checkpoint import save_pretrained
from ..io.files import CHECKPOINT_NAME, RECIPE_NAME
from ..models.model import VisionTransformer
from ..training import run_folder
from ..training.builders import build_datasets, build_network
from ..training.engine import TrainResult
from ..training.recipe import Recipe
from .budget import DECODE_S
from .lpft import FeatureNet, FeaturePairs, cache_features, fit_probe

PROBE_NAME = "linear_probe"  # the probe's model in the run folder: the first stage, and where LP-FT starts from
BEST_NAME = "best_stage"  # the best model so far, which the next stage starts from (removed at the end)
MIN_EPOCHS = 2  # a stage runs only where what is left affords this many of its epochs
FIRST_SHARE = 1 / 3  # the last blocks' share of what the probe leaves, where the whole model can have the rest
TRAIN_COST = 3.0  # a training step's cost of an image, in forward passes of it, where every block trains


@dataclass
class StageRecord:
    """One stage as it ran: what trained, for how long, and how it did on the held-out photos (single view)."""

    name: str  # in words: "linear probe", "last 3 of 6 blocks", "whole model"
    kind: str  # "probe", "lp-ft" (some blocks) or "full" (every block): the result's ``strategy``
    blocks: int  # blocks trained (0: the head alone)
    epochs: int
    steps: int
    images_seen: int  # training images (or cached views) the stage's steps went through
    seconds: float
    held_out_top1: float | None
    stopped: str | None = None  # "budget", "asked" or None, as the engine says
    kept: bool = False  # the best stage: the model the run folder holds

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    forward_s: float = 0.0  # seconds per image of a forward pass, measured over every photo's features


@dataclass
class Plan:
    """What the stages are estimated to cost here: a forward pass of an image (``forward_s``), the photos, the
    blocks, and ``scale``: the last stage's measured epoch time over its estimate (1 before any)."""

    forward_s: float
    train_images: int
    held_out: int
    depth: int
    scale: float = 1.0
    records: list[StageRecord] = field(default_factory=list)
    setup: float | None = None  # a stage's start, measured

    def epoch_s(self, blocks: int) -> float:
        """An epoch training the last ``blocks`` blocks and the head, then its held-out evaluation."""
        f = self.forward_s
        return self.scale * (self.train_images * f * (1 + (TRAIN_COST - 1) * blocks / self.depth) + self.held_out * f)

    def setup_s(self) -> float:
        """A stage's start: the engine decodes the photos again (measured once one has run)."""
        return (self.train_images + self.held_out) * DECODE_S if self.setup is None else self.setup

    def next_stage(self, left_s: float) -> tuple[int, float] | None:
        """(blocks, seconds) of the next stage for ``left_s`` seconds left, or None: nothing affords
        ``MIN_EPOCHS`` epochs. After the probe: the last half of the blocks for ``FIRST_SHARE`` of the time where
        the whole model affords its epochs in the rest, else all of it to the most blocks that afford theirs;
        after that the whole model where it affords them, else the blocks of the stage before (more epochs)."""
        usable = left_s - self.setup_s()
        trained = [r for r in self.records if r.kind != "probe"]
        if not trained:
            half = max(self.depth // 2, 1)
            if half < self.depth and usable * (1 - FIRST_SHARE) >= MIN_EPOCHS * self.epoch_s(self.depth):
                return half, left_s * FIRST_SHARE
            for k in range(half, 0, -1):
                if usable >= MIN_EPOCHS * self.epoch_s(k):
                    return k, left_s
            return None
        for k in (self.depth, trained[-1].blocks):
            if usable >= MIN_EPOCHS * self.epoch_s(k):
                return k, left_s
        return None

    def measured(self, record: StageRecord, setup_s: float | None = None) -> None:
        """Revise the estimates with a stage that ran: its seconds per epoch against the estimate, and the
        ``setup_s`` seconds before its first step."""
        self.records.append(record)
        if record.kind != "probe" and record.epochs:
            self.setup = self.setup if setup_s is None else setup_s
            self.scale *= (record.seconds - (setup_s or 0)) / record.epochs / self.epoch_s(record.blocks)


def stage_name(blocks: int, depth: int) -> str:
    return "whole model" if blocks >= depth else f"last {blocks} of {depth} blocks"


def stage_recipe(recipe: Recipe, init: Path, blocks: int, depth: int, seconds: float | None) -> Recipe:
    """The engine's recipe for a stage: from ``init`` with its head, on ``seconds`` of the clock (None: the
    recipe's); where only the last ``blocks`` blocks train, the stem and the blocks before them are frozen, as the
    probe saw them; the whole model's stage trains the stem too (frozen, a hybrid's stem cost the bundled model 17
    points on ants and bees' held-out photos: bench/results/finetune.md's sweep)."""
    frozen = [] if blocks >= depth else ["patch_embed", *[f"blocks.{i}" for i in range(depth - blocks)]]
    budget = recipe.budget_minutes if seconds is None else max(seconds, 1.0) / 60
    return Recipe.from_dict(
        recipe.to_dict() | dict(init=str(init), keep_head=True, freeze=frozen, budget_minutes=budget)
    )


def held_out_top1(history: list[dict[str, Any]]) -> float | None:
    return history[-1].get("test_top1") if history else None


def record_of(result: TrainResult, blocks: int, depth: int, steps: int, batch: int, seconds: float) -> StageRecord:
    """A finished engine stage's record (``steps``: counted by the caller's hooks)."""
    kind = "full" if blocks >= depth else "lp-ft"
    epochs = len(result.history)
    top1 = held_out_top1(result.history)
    return StageRecord(stage_name(blocks, depth), kind, blocks, epochs, steps, steps * batch, seconds, top1,
                       result.stopped)  # fmt: skip


def probe(
    recipe: Recipe, model: VisionTransformer, out: Path, t0: float, *, tta: bool = True
) -> tuple[ProbeFeatures, StageRecord]:
    """The first stage: the linear probe on the frozen ``model``'s cached features (the image and its mirror),
    saved to ``out / PROBE_NAME`` and written as ``out``'s run (``write_probe_run``) so that a usable model is on
    disk within seconds. ``tta``: cache the held-out mirrors too (the calibration's flip views)."""
    start = time.time()
    train_set, held_out = build_datasets(recipe, model.config.pretrained_cfg())
    net = build_network(recipe, model, list(train_set.classes), train_set)
    plain_tf = build_transform(net.pretrained_cfg)
    plain = with_transform(train_set, plain_tf)
    timed = time.time()
    views = [cache_features(net, plain, desc="features"), cache_features(net, plain, mirror=True, desc="mirrored")]
    forward_s = (time.time() - timed) / (2 * max(len(plain), 1))
    held_plain = cache_features(net, held_out, desc="held-out")
    held_mirror = cache_features(net, held_out, mirror=True, desc="held-out mirrored") if tta else held_plain
    held = FeaturePairs(held_plain, held_mirror, held_out.targets)
    others, other_pairs = other_photos(recipe.data), None  # an ``_other`` folder's photos (None without)
    if others is not None:
        others.transform = plain_tf
        other_plain = cache_features(net, others, desc="other photos")
        other_mirror = cache_features(net, others, mirror=True, desc="other photos mirrored") if tta else other_plain
        other_pairs = FeaturePairs(other_plain, other_mirror, others.targets)
    labels = train_set.targets
    x, y = torch.cat(views), labels.repeat(len(views))
    weight, bias = fit_probe(x, y, len(train_set.classes))
    logits = torch.nn.functional.linear(x, weight, bias)
    with torch.no_grad():
        net.head.weight.copy_(weight)
        net.head.bias.copy_(bias)
    top1 = 100 * (net.head(held_plain).argmax(-1) == held_out.targets).float().mean().item()
    row = dict(epoch=1, train_loss=torch.nn.functional.cross_entropy(logits, y).item(), copies=len(views))
    row |= dict(
        train_top1=100 * (logits.argmax(-1) == y).float().mean().item(), test_top1=top1, stage="linear probe", stage_n=0
    )
    history = [row | dict(elapsed_s=time.time() - t0, stopped=None)]
    save_pretrained(net, out / PROBE_NAME)
    write_probe_run(out, recipe, net, history)
    fit = FeaturePairs(views[0], views[1], labels)
    result = TrainResult(net.eval(), history, train_set, held_out)
    features = ProbeFeatures(FeatureNet(net), held, fit, "flip" if tta else None, result, other_pairs, forward_s)
    record = StageRecord("linear probe", "probe", 0, 1, 1, len(x), time.time() - start, top1)
    return features, record


def write_probe_run(out: Path, recipe: Recipe, net: VisionTransformer, history: list[dict[str, Any]]) -> None:
    """The run folder of a probe: its recipe, the model and its metrics, as a run of the engine writes them."""
    run_folder.prepare(out, fresh=True)
    run_folder.write_json(out / RECIPE_NAME, recipe.to_dict())
    run_folder.commit_epoch(out, 1, None, net, history, training_curves_figure(history))


def write_best(out: Path, recipe: Recipe, model: VisionTransformer, history: list[dict[str, Any]]) -> None:
    """``out`` holding the kept stage's model and recipe with every stage's metrics (epochs counted across the
    stages, each row naming its stage). The last stage's training state goes: it resumes nothing."""
    (out / CHECKPOINT_NAME).unlink(missing_ok=True)
    run_folder.write_json(out / RECIPE_NAME, recipe.to_dict())
    run_folder.commit_epoch(out, len(history), None, model, history, training_curves_figure(history))
