"""The CIFAR-10 speedrun on one GPU (issue #67): a recipe (``cifar10_speedrun_gpu``) trained from CIFAR-10 on the
device to its last step, timed, with its single-view top-1 on the test images, for several seeds.

    python -m bench.speedrun [--seeds 0 1 2] [--recipe cifar10_speedrun_gpu] [--deadline 400] [--set key=value ...]

Target (one H100/H200): 94% single view (no test-time views) in at most 60 s, the mean of 3 seeds at least 94%.
The time is the engine's training loops summed over the epochs (``epoch_time_s``: from the batches, which
``vit_core.data.Batches`` cuts from CIFAR-10 held on the device, to each epoch's last step, waited for), the first
epoch's compilation included and its time printed apart; the evaluation and the run folder's files between epochs
are not counted. The accuracy is the last epoch's evaluation (the recipe evaluates all 10,000 test images). No seed
starts that would end past ``--deadline`` seconds (taking as long as the longest so far). Each seed's run folder
is ``--out``/seed<N>.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from train import apply_overrides, load_recipe
from vit_core.training.engine import train

TARGET_TOP1, TARGET_SECONDS = 94.0, 60.0


@dataclass(frozen=True)
class SeedRun:
    """One seed's run: its training seconds (compilation included), its first epoch's, its single-view top-1 on
    ``test_images`` test images, and the epochs it ran."""

    seed: int
    seconds: float
    first_epoch_s: float
    top1: float
    test_images: int
    epochs: int


def run_seed(recipe: dict, seed: int, out: Path) -> SeedRun:
    """Train ``recipe`` with ``seed`` into ``out`` and read what the run measured."""
    result = train(recipe | {"seed": seed}, out, overwrite=True, progress=False)
    history = result.history
    seconds = sum(row["epoch_time_s"] for row in history)
    return SeedRun(
        seed, seconds, history[0]["epoch_time_s"], history[-1]["test_top1"], len(result.test_set), len(history)
    )


def table(runs: list[SeedRun]) -> str:
    """The speedrun's table (one line per seed) and the mean, against the targets."""
    lines = [
        "| seed | epochs | training s (compile included) | first epoch s | single-view top-1 | test images |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.seed} | {r.epochs} | {r.seconds:.1f} | {r.first_epoch_s:.1f} | {r.top1:.2f}% | {r.test_images} |"
        for r in runs
    ]
    if runs:
        top1, seconds = statistics.mean(r.top1 for r in runs), statistics.mean(r.seconds for r in runs)
        met = top1 >= TARGET_TOP1 and seconds <= TARGET_SECONDS and len(runs) >= 3
        lines.append(
            f"| mean of {len(runs)} | | {seconds:.1f} | | {top1:.2f}% | | target: {TARGET_TOP1:g}% in "
            f"{TARGET_SECONDS:g} s over 3 seeds: {'met' if met else 'not met'}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="cifar10_speedrun_gpu")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--deadline", type=float, default=float("inf"), help="seconds by which the last seed must end")
    p.add_argument("--out", default="runs/speedrun")
    p.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    recipe = apply_overrides(load_recipe(args.recipe), args.assignments)
    start, runs, longest = time.time(), [], 0.0
    for seed in args.seeds:
        if time.time() - start + longest > args.deadline:  # a seed that would end past it does not start
            print(f"seed {seed}: skipped, it would end past the deadline ({args.deadline:g} s)", flush=True)
            continue
        t0 = time.time()
        runs.append(run_seed(recipe, seed, Path(args.out) / f"seed{seed}"))
        longest = max(longest, time.time() - t0)
        print(f"seed {seed}: {runs[-1].seconds:.1f} s, {runs[-1].top1:.2f}% single view", flush=True)
    print(f"{args.recipe} {' '.join(args.assignments)}\n{table(runs)}", flush=True)


if __name__ == "__main__":
    main()
