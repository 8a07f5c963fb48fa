"""The paper's figure 5 at small scale: CIFAR-10 test accuracy against training CPU-minutes for a pure ViT, the
hybrid and a ResNet, each trained by the same engine and data pipeline (``python -m train``) at three budgets.

    OMP_NUM_THREADS=2 python -m bench.figure5              # trains what is missing (hours), then plots
    python -m bench.figure5 --plot-only                     # the plot and the table from the recorded points

Dosovitskiy et al. (section 4.2) find that at small compute hybrids beat both pure ViTs and ResNets, and that the
margin closes as compute grows. Here each family is one recipe: ``cifar10_vit_cpu`` (ViT, 4x4 patches),
``cifar10_speedrun`` (the hybrid: airbench's CNN under 2 transformer blocks) and ``cifar10_resnet18`` (timm's
ResNet-18 made for 32 px, ``vit_core.models.cnn``); a budget is a number of epochs, the recipe's schedule fitted to it
(its warmup keeps its share of the run), on training images 0-44,999, the whole test set evaluated after every
epoch. A point's minutes are its training time (the sum of the epochs' ``epoch_time_s``, evaluation excluded: the
paper's x axis is training compute), its accuracy the last epoch's top-1 on the 10,000 test images.

Each run writes ``runs/figure5/<recipe>_<epochs>ep`` (kill it and run again: it resumes) and its point is added
to ``bench/results/figure5.json`` (committed). Printed: the points, and at each of the hybrid's points the ratio
of its accuracy to the best other family's at the same minutes (linear interpolation in log-minutes between that
family's points; no ratio outside their range). The plot: ``docs/figure5.png``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from train import load_recipe, override
from vit_core import figures
from vit_core.io.files import atomic_write
from vit_core.training import engine
from vit_core.training.recipe import Recipe
from webapp.registry.catalog import ROOT

# family -> (recipe, epochs at each budget): about 5, 10 and 20 training minutes each on the 2-core CPU
FAMILIES = {
    "ViT": ("cifar10_vit_cpu", (8, 16, 32)),  # 39 s an epoch: the same minutes as the others
    "hybrid": ("cifar10_speedrun", (1, 2, 4)),
    "ResNet": ("cifar10_resnet18", (1, 2, 4)),
}
RESULTS = ROOT / "bench" / "results" / "figure5.json"
PLOT = ROOT / "docs" / "figure5.png"
RUNS = ROOT / "runs" / "figure5"


def budget_recipe(name: str, epochs: int) -> dict:
    """``name``'s recipe shortened to ``epochs``: its warmup scaled with it, images 0-44,999, every test image,
    in fp32 (a CPU-minute is then the same compute for every family, whatever bf16 units the CPU has)."""
    base = load_recipe(name)
    defaults = Recipe.from_dict(base)  # the recipe's epochs and warmup, or Recipe's defaults for them
    share = defaults.warmup_epochs / defaults.epochs
    changes = dict(epochs=epochs, warmup_epochs=round(share * epochs, 4), train_subset=[0, 45000], eval_subset=None)
    return override(base, changes | {"cpu_precision": "fp32"})


def point(family: str, name: str, epochs: int, history: list[dict]) -> dict:
    """A figure point from a finished run's ``metrics.jsonl`` rows."""
    return {
        "family": family,
        "recipe": name,
        "epochs": epochs,
        "minutes": sum(row["epoch_time_s"] for row in history) / 60,
        "top1": history[-1]["test_top1"],
    }


def run_point(family: str, name: str, epochs: int) -> dict:
    """Train (or resume, or read) the run of ``name`` at ``epochs`` and return its point."""
    out = RUNS / f"{name}_{epochs}ep"
    metrics = out / "metrics.jsonl"
    history = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    if len(history) < epochs:
        # the folder is this bench's own: a run killed before its first epoch ended starts again
        resume = (out / "checkpoint.pt").is_file()
        history = engine.train(budget_recipe(name, epochs), out, resume=resume, overwrite=not resume).history
    return point(family, name, epochs, history)


def accuracy_at(points: list[dict], minutes: float) -> float | None:
    """A family's accuracy at ``minutes``: linear in log-minutes between its two nearest points; None outside."""
    pts = sorted((p["minutes"], p["top1"]) for p in points)
    xs = [math.log(m) for m, _ in pts]
    x = math.log(minutes)
    if not pts or x < xs[0] or x > xs[-1]:
        return None
    return float(np.interp(x, xs, [a for _, a in pts]))


def ratios(points: list[dict], family: str = "hybrid") -> list[dict]:
    """At each of ``family``'s points: its accuracy over the best other family's at the same minutes."""
    rows = []
    for p in sorted((p for p in points if p["family"] == family), key=lambda p: p["minutes"]):
        others = {
            f: accuracy_at([q for q in points if q["family"] == f], p["minutes"])
            for f in sorted({q["family"] for q in points} - {family})
        }
        others = {f: a for f, a in others.items() if a is not None}
        best = max(others, key=others.get) if others else None
        rows.append(p | {"best_other": best, "ratio": None if best is None else p["top1"] / others[best]})
    return rows


def table(points: list[dict]) -> str:
    lines = ["| family | recipe | epochs | training minutes | test top-1 |", "|---|---|---:|---:|---:|"]
    for p in sorted(points, key=lambda p: (p["family"], p["minutes"])):
        lines.append(f"| {p['family']} | `{p['recipe']}` | {p['epochs']} | {p['minutes']:.1f} | {p['top1']:.2f}% |")
    lines += ["", "| hybrid's minutes | hybrid top-1 | best other family there | ratio |", "|---:|---:|---|---:|"]
    for r in ratios(points):
        other = "none in range" if r["best_other"] is None else r["best_other"]
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
        lines.append(f"| {r['minutes']:.1f} | {r['top1']:.2f}% | {other} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot-only", action="store_true", help="no training: plot the points recorded")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--plot", type=Path, default=PLOT)
    args = ap.parse_args(argv)
    points = json.loads(args.results.read_text()) if args.results.is_file() else []
    if not args.plot_only:
        # budget by budget, every family at each: a run stopped early still leaves comparable points
        runs = [(f, name, budgets[i]) for i in range(3) for f, (name, budgets) in FAMILIES.items()]
        for family, name, epochs in runs:
            if any(p["recipe"] == name and p["epochs"] == epochs for p in points):
                continue
            points.append(run_point(family, name, epochs))
            text = json.dumps(points, indent=2) + "\n"
            atomic_write(args.results, lambda path, text=text: Path(path).write_text(text))
    if not points:
        raise SystemExit(f"no points in {args.results}: run without --plot-only first")
    image = figures.compute_figure(points)
    atomic_write(args.plot, lambda path: image.save(path, format="PNG"))
    print(table(points))
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
