"""Photos of other things in a Train-tab zip (its ``_other`` folder): what they do to "none of my classes".

    OMP_NUM_THREADS=2 python -m bench.other_photos            # about 7 minutes here

Two ``finetune_folder`` calls from the bundled model on ``ants_and_bees/train``, as the Train tab runs them (the
whole job within ``--minutes``, the strategy the budget affords): one whose ``_other`` folder holds ``--others``
photos of ``cats_and_dogs/train`` (a seeded choice, half cats, half dogs), one without. Each saved model then
answers, as ``predict`` does (calibrated views), every photo of the ``val`` splits: ants and bees (its classes:
the share turned away is what "none of my classes" costs), cats and dogs (the kind of photo ``_other`` showed
it), cars, birds, deer, frogs and horses (a kind it did not show), and ``bench/ood_photos``. With ``_other``,
half of those photos choose the score and set its threshold (``ood.choose_with_others``); without, the
Mahalanobis score's threshold keeps 95% of the held-out photos. Output: ``bench/results/other_photos.txt``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import time
from pathlib import Path

import torch

import vit_core
from vit_core.calibration import predict
from vit_core.data import build_transform, default_data_root, load_image
from vit_core.finetune import FinetuneOptions, finetune_folder
from vit_core.io.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = default_data_root() / "photos"
BUNDLED = ROOT / "models" / "cifar10_speedrun"
RUNS = ROOT / "runs" / "bench_other_photos"
RESULT = ROOT / "bench" / "results" / "other_photos.txt"
SETS = {  # what is measured: the name, its photos
    "ants and bees (val): its classes": "ants_and_bees/val",
    "cats and dogs (val): the kind _other showed": "cats_and_dogs/val",
    "cars, birds, deer, frogs, horses (val)": "cars_birds_deer_frogs_horses/val",
}


def build_folder(others: int) -> Path:
    """``ants_and_bees/train`` as links, with ``others`` cats and dogs of ``cats_and_dogs/train`` in ``_other``."""
    folder = RUNS / f"data_{others}"
    shutil.rmtree(folder, ignore_errors=True)
    for cls in sorted((PHOTOS / "ants_and_bees" / "train").iterdir()):
        (folder / cls.name).mkdir(parents=True)
        for f in sorted(cls.iterdir()):
            (folder / cls.name / f.name).symlink_to(f.resolve())
    if others:
        (folder / "_other").mkdir()
        for cls in ("cats", "dogs"):
            files = sorted((PHOTOS / "cats_and_dogs" / "train" / cls).iterdir())
            random.Random(0).shuffle(files)
            for f in files[: others // 2]:
                (folder / "_other" / f"{cls}_{f.name}").symlink_to(f.resolve())
    return folder


def scores(model: torch.nn.Module, paths: list[Path]) -> torch.Tensor:
    """The "none of my classes" scores ``predict`` gives ``paths``, in batches of 64."""
    tf, out = build_transform(model.pretrained_cfg), []
    for i in range(0, len(paths), 64):
        out.append(predict(model, torch.stack([tf(load_image(p)) for p in paths[i : i + 64]])).ood_score)
    return torch.cat(out)


def run(others: int, minutes: float) -> tuple[dict, dict[str, float]]:
    """One fine-tuning with ``others`` photos of other things: what it chose, and the share of each val set
    answered "none of my classes"."""
    data, out = build_folder(others), RUNS / f"run_{others}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    r = finetune_folder(data, BUNDLED, out, options=FinetuneOptions(minutes=minutes, within_budget=True))
    wall = time.time() - t0
    model = vit_core.from_pretrained(out).eval()
    ood = model.calibration.ood
    info = dict(r.details, accuracy=r.val_accuracy, strategy=r.strategy, wall=wall, score=ood.score)
    info |= dict(threshold=ood.threshold, train=r.train_images, held=r.val_images)
    sets = {name: sorted(f for f in (PHOTOS / rel).rglob("*") if f.is_file()) for name, rel in SETS.items()}
    sets["bench/ood_photos"] = sorted((ROOT / "bench" / "ood_photos").rglob("*.jpg"))
    return info, {
        name: (len(paths), float((scores(model, paths) > ood.threshold).double().mean()))
        for name, paths in sets.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--others", type=int, default=60, help="photos of cats and dogs in _other")
    p.add_argument("--minutes", type=float, default=3.0, help="the whole job's budget, as the Train tab's")
    args = p.parse_args()
    (a, with_), (b, without) = run(args.others, args.minutes), run(0, args.minutes)
    lines = [
        f"# OMP_NUM_THREADS={torch.get_num_threads()} python -m bench.other_photos --others {args.others} "
        f"--minutes {args.minutes:g}   ({time.strftime('%Y-%m-%d %H:%M')})",
        f"# the bundled model fine-tuned on ants_and_bees/train ({a['train']} training, {a['held']} held-out photos), "
        "the whole job within the budget, twice:",
    ]
    for name, info in ((f"with _other ({args.others} cats and dogs)", a), ("without", b)):
        lines.append(
            f"# {name}: {info['strategy']}, {info['wall']:.0f} s, held-out accuracy {info['accuracy']:.1f}%; "
            f"score {info['score']}, threshold {info['threshold']:,.4g}, keeps {100 * info.get('kept', 0.95):.0f}% "
            "of the held-out photos"
            + (
                f"; AUROC {info['others_auroc']:.3f} on the {info['others'] - info['others_measured']} that chose it, "
                f"{100 * info['others_turned_away']:.0f}% of the other {info['others_measured']} turned away"
                if "others" in info
                else ""
            )
        )
    lines += [
        "",
        '| val photos | photos | answered "none": with _other | answered "none": without |',
        "|---|---:|---:|---:|",
    ]
    for name, (n, share) in with_.items():
        lines.append(f"| {name} | {n} | {100 * share:.1f}% | {100 * without[name][1]:.1f}% |")
    text = "\n".join(lines) + "\n"
    print(text)
    atomic_write(RESULT, lambda p: Path(p).write_text(text))


if __name__ == "__main__":
    main()
