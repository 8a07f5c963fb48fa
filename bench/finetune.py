"""Fine-tuning a folder of photos from the bundled model against training the same network from scratch, on
``../shared/data/photos`` (fit on ``train``, report on ``val``): issue #46's targets and the paper's point that
pre-training matters most when labels are few (Dosovitskiy et al., sections 3.2 and 4.2, at small scale).

    OMP_NUM_THREADS=2 python -m bench.finetune --load     # each set idle, then with one core kept busy (issue #64)
    OMP_NUM_THREADS=2 python -m bench.finetune            # runs what is missing, then the table and the plot
    python -m bench.finetune --report-only                # the table and the plot from the recorded points
    python -m bench.finetune --sweep                      # the choices behind FINETUNE_RECIPE, on a split of train

Each point is one ``vit_core.finetune.finetune_folder`` call on a set's ``train`` folder (20% of each
class held out for the calibration), then ``train eval``'s measurement of its ``val`` images as ``predict`` answers them
(image and mirror, calibrated): "bundled" starts from ``models/cifar10_speedrun`` (CIFAR-10, 32 px) with a new
head, "scratch" is the same architecture from its initialisation (airbench's Dirac stem and whitening from the
training images) with AdamW; both at the same input size, budget and augmentation. The main points give each set
its issue budget (3 minutes for ants and bees, 5 for cats and dogs); the curve gives cats and dogs 10, 30, 100
and all 1,000 labelled images per class (a seeded choice) at 1.5 minutes each. Minutes are the training's wall
clock (``budget_minutes``; evaluation of the held-out images included), then the whole call's.

``--load`` (issue #64) runs each set's issue budget as the Train tab does (``within_budget``: the whole call in the
budget) twice: idle (the machine is shared, so the load average is recorded beside it) and with a busy-loop process
of its own keeping one core busy; it reports the budget used, and each stage's held-out (one view, what chose the
kept stage) and ``val`` accuracy (one view; the kept model's also as ``predict`` answers), so that a ceiling shows.
Nothing is chosen on ``val``.

``--sweep`` compares settings of the fine-tuning on ants and bees' ``train`` only (accuracy on its held-out
20%, 48 images: a standard error of about 6 points), never on ``val``. Points go to
``bench/results/finetune.json``; the table to ``bench/results/finetune.md``; the plot to ``docs/finetune.png``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import time
from pathlib import Path

import vit_core
from vit_core.data import default_data_root
from vit_core.finetune import FinetuneOptions, finetune_folder
from vit_core.finetune.budget import BudgetTooShort
from vit_core.io.files import atomic_write
from vit_core.training.evaluation import evaluate_checkpoint

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = default_data_root() / "photos"
BUNDLED = ROOT / "models" / "cifar10_speedrun"
RUNS = ROOT / "runs" / "bench_finetune"
RESULTS = ROOT / "bench" / "results" / "finetune.json"
TABLE = ROOT / "bench" / "results" / "finetune.md"
PLOT = ROOT / "docs" / "finetune.png"
TARGETS = {"ants_and_bees": (3.0, 80.0), "cats_and_dogs": (5.0, 94.0)}  # minutes of training, val accuracy (%)
CURVE_SET, CURVE_SIZES, CURVE_MINUTES = "cats_and_dogs", (10, 30, 100, None), 1.5
IMAGE_SIZE = 32  # the bundled model's own: 64 px (interpolated) fitted 4x fewer steps in the sweep's budget


def scratch_overrides() -> dict:
    """The bundled model's architecture from its initialisation, trained with AdamW as its recipe trains the
    transformer (no stem optimizer of its own: one optimizer, as the fine-tuning has)."""
    arch = json.loads((BUNDLED / "recipe.json").read_text())["model_args"]
    return dict(model_args=arch | {"img_size": IMAGE_SIZE}, stem_init="dirac", opt="adamw", lr=2e-3, weight_decay=0.05)


def per_class_folder(source: Path, n: int | None) -> Path:
    """``source`` (``<class>/<images>``) with ``n`` images per class (a seeded choice; None: all), as links."""
    if n is None:
        return source
    folder = RUNS / "folders" / f"{source.parent.name}_{n}"
    if not folder.is_dir():
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for cls in sorted(p for p in source.iterdir() if p.is_dir()):
            files = sorted(cls.iterdir())
            random.Random(0).shuffle(files)
            (tmp / cls.name).mkdir(parents=True)
            for f in files[:n]:
                (tmp / cls.name / f.name).symlink_to(f.resolve())
        tmp.rename(folder)
    return folder


def run_point(name: str, dataset: str, init: str, per_class: int | None, minutes: float, overrides: dict) -> dict:
    """One fine-tuning (or training from scratch) and its measurement on the set's val images."""
    data = per_class_folder(PHOTOS / dataset / "train", per_class)
    out = RUNS / name
    t0 = time.time()
    start = str(BUNDLED) if init == "bundled" else None
    extra = scratch_overrides() if init == "scratch" else {}
    recipe_keys = {k: v for k, v in overrides.items() if k != "strategy"}  # strategy: FinetuneOptions' own
    options = FinetuneOptions(
        minutes=minutes,
        image_size=IMAGE_SIZE,
        strategy=overrides.get("strategy", "auto"),
        overrides=extra | recipe_keys,
        overwrite=True,
    )
    r = finetune_folder(data, start, out, options=options)
    total = time.time() - t0
    ev = {"top1": None, "ece": None, "count": 0}
    if not name.startswith("sweep_"):  # the sweep decides on train's held-out images, never on val
        ev = evaluate_checkpoint(out, str(PHOTOS / dataset), split="val", tta=r.model.calibration.tta, progress=False)
    return {
        "name": name,
        "set": dataset,
        "init": init,
        "per_class": per_class,
        "train_images": r.train_images,
        "held_out": r.val_images,
        "held_out_top1": r.val_accuracy,
        "val_top1": ev["top1"],
        "val_ece": ev["ece"],
        "val_count": ev["count"],
        "train_minutes": r.train_seconds / 60,
        "total_minutes": total / 60,
        "steps": r.steps,
        "epochs": len(r.history),
        "temperature": r.temperature,
        "strategy": r.strategy,
        "load": os.getloadavg()[0],
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "overrides": overrides,
    }


def plan(sweep: bool) -> list[tuple[str, str, str, int | None, float, dict]]:
    if sweep:  # on ants and bees' train folder only: the held-out 20% decide
        return [
            (f"sweep_{key}", "ants_and_bees", "bundled", None, 1.5, o)
            for key, o in {
                "32px": {},
                "64px": {"model_args": {"img_size": 64}},
                "32px_freeze_stem": {"freeze": ["patch_embed.backbone"]},
                "32px_lr3e-3": {"lr": 3e-3},
                "32px_full_again": {"strategy": "full"},  # 32px under the load the LP-FT points ran under
                "32px_lpft": {"strategy": "lp-ft"},
                "64px_lpft": {"strategy": "lp-ft", "model_args": {"img_size": 64}},
                "64px_probe": {"strategy": "probe", "model_args": {"img_size": 64}},
            }.items()
        ]
    points = [(f"{s}_{i}", s, i, None, m, {}) for s, (m, _) in TARGETS.items() for i in ("bundled", "scratch")]
    points += [
        (f"curve_{CURVE_SET}_{n}_{i}", CURVE_SET, i, n, CURVE_MINUTES, {})
        for n in CURVE_SIZES
        for i in ("bundled", "scratch")
    ]
    return points


def b16_point() -> dict:
    """ViT-B/16 with random weights (no Hub here) fine-tuned on ants and bees' train at 224 px within 3 minutes:
    the strategy the budget picks on this machine, and the whole call's wall clock against the budget + 1 minute."""
    init = RUNS / "vit_base_random"
    if not (init / "config.json").is_file():
        vit_core.save_pretrained(vit_core.create_model("vit_base_patch16_224"), init)
    t0 = time.time()
    options = FinetuneOptions(minutes=3.0, overwrite=True)
    r = finetune_folder(PHOTOS / "ants_and_bees" / "train", init, RUNS / "b16", options=options)
    return {
        "name": "b16_random_ants_and_bees",
        "set": "ants_and_bees",
        "strategy": r.strategy,
        "reason": r.strategy_reason,
        "steps": r.steps,
        "copies": r.history[-1].get("copies"),
        "held_out_top1": r.val_accuracy,
        "temperature": r.temperature,
        "threshold": r.ood_threshold,
        "total_minutes": (time.time() - t0) / 60,
        "load": os.getloadavg()[0],
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
    }


def _busy() -> None:
    while True:  # one core kept busy: the other work of a shared machine
        pass


def load_point(dataset: str, loaded: bool) -> dict:
    """One set at its issue budget, as the Train tab runs it, idle or beside a busy-loop process; each stage's
    model measured on ``val``."""
    minutes, target = TARGETS[dataset]
    busy = multiprocessing.get_context("spawn").Process(target=_busy, daemon=True) if loaded else None
    if busy is not None:
        busy.start()
    out = RUNS / f"load_{dataset}_{'busy' if loaded else 'idle'}"
    before = os.getloadavg()
    t0 = time.time()
    name = f"load_{dataset}_{'busy' if loaded else 'idle'}"
    try:
        options = FinetuneOptions(
            minutes=minutes, within_budget=True, image_size=IMAGE_SIZE, overwrite=True, keep_stages=True
        )
        r = finetune_folder(PHOTOS / dataset / "train", BUNDLED, out, options=options)
    except BudgetTooShort as e:  # the job the Train tab would refuse: a point of its own, not a crash
        return {"name": name, "set": dataset, "loaded": loaded, "budget_s": 60 * minutes, "refused": str(e),
                "target": target, "loadavg_before": before, "loadavg_after": os.getloadavg()}  # fmt: skip
    finally:
        if busy is not None:
            busy.terminate()
            busy.join()
    total, after = time.time() - t0, os.getloadavg()
    val = str(PHOTOS / dataset)
    stages, later = r.details["stages"], iter(sorted((out / "stages").glob("*"), key=lambda p: int(p.name)))
    for st in stages:
        folder = out / "linear_probe" if st["kind"] == "probe" else next(later)
        st["val_top1"] = evaluate_checkpoint(folder, val, split="val", tta=None, progress=False)["top1"]
    ev = evaluate_checkpoint(out, val, split="val", tta=r.model.calibration.tta, progress=False)
    return {
        "name": name,
        "set": dataset,
        "loaded": loaded,
        "budget_s": 60 * minutes,
        "total_s": total,
        "budget_used": total / (60 * minutes),
        "held_out_top1": r.val_accuracy,
        "val_top1": ev["top1"],
        "target": target,
        "stages": stages,
        "strategy": r.strategy,
        "reason": r.strategy_reason,
        "loadavg_before": before,
        "loadavg_after": after,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
    }


def load_report(points: dict[str, dict]) -> str:
    """The idle and busy runs side by side, each stage's held-out and val accuracy under them."""
    lines = [
        "## Idle and with one core kept busy (`python -m bench.finetune --load`)\n",
        "The Train tab's way: the budget covers the whole call (calibration and writing included). val top-1 as "
        "`predict` answers (calibrated views); per stage, one view. Load averages (1 min) before / after each run: "
        "the machine is shared with other work, so idle is not truly idle.\n",
        "| set | run | budget | used | val top-1 | target | held-out top-1 | load avg | kept |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for p in points.values():
        if "refused" in p:
            run = "one core busy" if p["loaded"] else "idle"
            lines.append(f"| {p['set']} | {run} | {p['budget_s'] / 60:.0f} min | refused: {p['refused']} |")
            continue
        mark = f"{p['target']:.0f}% {'met' if p['val_top1'] >= p['target'] else 'missed'}"
        lines.append(
            f"| {p['set']} | {'one core busy' if p['loaded'] else 'idle'} | {p['budget_s'] / 60:.0f} min | "
            f"{100 * p['budget_used']:.0f}% | {p['val_top1']:.1f}% | {mark} | {p['held_out_top1']:.1f}% | "
            f"{p['loadavg_before'][0]:.2f} / {p['loadavg_after'][0]:.2f} | {p['strategy']} |"
        )
    lines += ["", "| set | run | stage | epochs | steps | images seen | seconds | held-out top-1 | val top-1 |"]
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for p in points.values():
        for st in p.get("stages", []):
            held = "-" if st["held_out_top1"] is None else f"{st['held_out_top1']:.1f}%"
            lines.append(
                f"| {p['set']} | {'busy' if p['loaded'] else 'idle'} | {st['name']}{' (kept)' * st['kept']} | "
                f"{st['epochs']} | {st['steps']} | {st['images_seen']:,} | {st['seconds']:.0f} | {held} | "
                f"{st['val_top1']:.1f}% |"
            )
    for s in TARGETS:
        idle, busy = points.get(f"load_{s}_idle"), points.get(f"load_{s}_busy")
        if idle and busy and "refused" not in idle and "refused" not in busy:
            lines.append(f"\n{s}: busy - idle val top-1 = {busy['val_top1'] - idle['val_top1']:+.1f} points")
    return "\n".join(lines) + "\n"


def load() -> dict[str, dict]:
    return {p["name"]: p for p in json.loads(RESULTS.read_text())} if RESULTS.is_file() else {}


def save(points: dict[str, dict]) -> None:
    text = json.dumps(list(points.values()), indent=1) + "\n"
    atomic_write(RESULTS, lambda p: Path(p).write_text(text))


def report(points: dict[str, dict]) -> str:
    lines = [
        "# Fine-tuning a folder of photos (`python -m bench.finetune`)\n",
        "Fit on `train` (20% of each class held out for calibration), accuracy on `val` as `predict` answers "
        f"(image and mirror, calibrated). Input {IMAGE_SIZE} px. Minutes: training wall clock / whole call.\n",
        "| point | set | start | strategy | images/class | val top-1 | target | ECE | held-out top-1 | minutes | steps "
        "| threads |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in points.items():
        target = TARGETS.get(p["set"], (None, None))[1] if p["per_class"] is None and p["init"] == "bundled" else None
        mark = "" if target is None else f"{target:.0f}% {'met' if p['val_top1'] >= target else 'missed'}"
        lines.append(
            f"| {name} | {p['set']} | {p['init']} | {p.get('strategy', 'full')} | {p['per_class'] or 'all'} | "
            f"{p['val_top1']:.1f}% | {mark} | "
            f"{p['val_ece']:.3f} | {p['held_out_top1']:.1f}% | {p['train_minutes']:.2f} / {p['total_minutes']:.2f} | "
            f"{p['steps']} | {p['threads'] or '-'} |"
        )
    for s in TARGETS:
        b, f = points.get(f"{s}_bundled"), points.get(f"{s}_scratch")
        if b and f:
            lines.append(f"\n{s}: bundled / scratch val accuracy = {b['val_top1'] / f['val_top1']:.3f}")
    return "\n".join(lines) + "\n"


def plot(points: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for init, style in (("bundled", "o-"), ("scratch", "s--")):
        rows = [p for p in points.values() if p["name"].startswith("curve_") and p["init"] == init]
        rows.sort(key=lambda p: p["per_class"] or 10**9)
        xs = [p["per_class"] or 1000 for p in rows]
        label = "from the bundled CIFAR-10 model" if init == "bundled" else "from scratch"
        ax.plot(xs, [p["val_top1"] for p in rows], style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("labelled images per class (cats and dogs)")
    ax.set_ylabel("val top-1 (%)")
    ax.set_title(f"Fine-tuning vs from scratch, {CURVE_MINUTES:g} min each, {IMAGE_SIZE} px")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="the settings compared on a split of ants and bees' train")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run these points only")
    ap.add_argument("--b16", action="store_true", help="time ViT-B/16 (random weights) on ants and bees, 3 minutes")
    ap.add_argument("--load", action="store_true", help="each set idle and with one core busy (issue #64)")
    args = ap.parse_args()
    points = load()
    if args.load:
        for dataset in TARGETS:
            for loaded in (False, True):
                point = load_point(dataset, loaded)
                points[point["name"]] = point
                save(points)
                print(json.dumps({k: v for k, v in point.items() if k != "stages"}), flush=True)
    if args.b16:
        points["b16_random_ants_and_bees"] = b16_point()
        save(points)
        print(json.dumps(points["b16_random_ants_and_bees"]), flush=True)
        return
    if not args.report_only:
        for name, *spec in plan(args.sweep):
            if name in points or (args.only and name not in args.only):
                continue
            print(f"--- {name}", flush=True)
            points[name] = run_point(name, *spec)
            save(points)
            print(json.dumps(points[name]), flush=True)
    main_points = {k: v for k, v in points.items() if not k.startswith(("sweep_", "b16_", "load_"))}
    loaded = {k: v for k, v in points.items() if k.startswith("load_")}
    sweep = {k: v for k, v in points.items() if k.startswith("sweep_")}
    text = report(main_points)
    if sweep:
        text += "\n## Sweep (ants and bees `train` only: accuracy on its held-out 20%)\n\n"
        text += "| setting | held-out top-1 | minutes | steps |\n|---|---:|---:|---:|\n"
        text += "".join(
            f"| {k[len('sweep_') :]} | {p['held_out_top1']:.1f}% | {p['train_minutes']:.2f} | {p['steps']} |\n"
            for k, p in sweep.items()
        )
    text += "\n" + load_report(loaded) if loaded else ""
    atomic_write(TABLE, lambda p: Path(p).write_text(text))
    print(text)
    if any(k.startswith("curve_") for k in main_points):
        plot(main_points)


if __name__ == "__main__":
    main()
