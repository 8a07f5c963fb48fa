"""The GPU speedrun's recipe (``cifar10_speedrun_gpu``) and ``bench.speedrun`` on a CPU: the recipe is the bundle's
hybrid set up for one GPU, it trains a few steps on CIFAR-10 here, and the bench's reported single-view accuracy is
what an independent evaluation of the saved run folder measures."""

from __future__ import annotations

import sys

import pytest

from bench import speedrun
from train import load_recipe
from vit_core.data import default_data_root
from vit_core.training.evaluation import evaluate_checkpoint
from vit_core.training.recipe import Recipe

needs_cifar10 = pytest.mark.skipif(
    not (default_data_root() / "cifar10").is_dir(),
    reason=f"CIFAR-10 not found under {default_data_root()} (set VIT_DATA)",
)

# a few steps on a CPU: 128 training images in batches of 64 (passes of 32), 64 test images, no compilation
FEW_STEPS = [
    "device=cpu",
    "compile=false",
    "train_subset=128",
    "eval_subset=64",
    "batch_size=64",
    "micro_batch=32",
    "epochs=2",
    "warmup_epochs=0.5",
]


def test_recipe_is_the_bundles_hybrid_for_one_gpu():
    gpu, bundle = (
        Recipe.from_dict(load_recipe("cifar10_speedrun_gpu")),
        Recipe.from_dict(load_recipe("cifar10_speedrun_bf16")),
    )
    assert gpu.model_args == bundle.model_args and gpu.stem_optimizer == bundle.stem_optimizer
    assert gpu.precision == "bf16" and gpu.compile and gpu.channels_last
    assert gpu.train_subset is None and gpu.eval_subset is None  # all 50,000 images; all 10,000 test images
    assert gpu.warmup_epochs == pytest.approx(0.23 * gpu.epochs, abs=0.01)


def test_table_mean_and_target():
    runs = [speedrun.SeedRun(s, 50.0 + s, 20.0, 94.0 + s / 10, 10000, 40) for s in range(3)]
    out = speedrun.table(runs)
    assert "| mean of 3 | | 51.0 | | 94.10% |" in out and "met" in out and "not met" not in out
    assert "not met" in speedrun.table(runs[:2])  # 3 seeds are the target's


@needs_cifar10
def test_speedrun_runs_a_few_steps_on_cpu(tmp_path, monkeypatch, capsys):
    sets = [a for s in FEW_STEPS for a in ("--set", s)]
    argv = ["bench.speedrun", "--seeds", "3", "--out", str(tmp_path), *sets]
    monkeypatch.setattr(sys, "argv", argv)
    speedrun.main()
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if row.startswith("| 3 | 2 |"))
    reported = float(line.split("|")[5].strip().rstrip("%"))
    measured = evaluate_checkpoint(tmp_path / "seed3", "cifar10", subset=64, device="cpu", progress=False)
    assert reported == pytest.approx(measured["top1"], abs=0.005)  # printed to 2 decimals
