"""Right and honest on real photos (issue #45): what the app answers for photos of its classes and of other things.

    python -m bench.photo_answers                    # the bundled model, the val splits (final numbers)
    python -m bench.photo_answers --split held       # the held-out share of train (bench.photo_split): for choosing
    python -m bench.photo_answers --model FOLDER     # another checkpoint

Each photo goes through the app's own path: the model loaded as the app loads it (``webapp.registry.models.Models``),
the upload decoded and analysed by ``webapp.inference.analysis.analyse`` (its preprocessing, the views the model was
calibrated for, its temperature and "none of my classes" detector), and decided by
``webapp.inference.model_info.decide``
(a plain answer, "not one of my classes", "torn between" two, or "not sure"). Sets:

- inside, photos of the model's classes: ``photos/cats_and_dogs/<split>`` (``cats``, ``dogs``) and
  ``photos/cars_birds_deer_frogs_horses/<split>`` under the data root, and ``bench/real_photos`` (43 photos of
  the ten classes; it has no split and chose the bundle's threshold long ago, so it is printed for reference);
- outside, photos of other things: ``photos/ants_and_bees/<split>``, and ``bench/ood_photos`` (78 photos, the
  same caveat).

Printed: per inside set and class, the share right (the top class) and, of the right ones, the share with a
plain answer; over the shared sets' classes together, the mean of the classes' shares right, the lowest, and the
share of plain answers among the right ones (issue #54's targets); per outside set and class, the share with a
plain answer (a plain answer there is wrong); the detector's AUROC (its score, outside higher) for each inside
set against each outside set, and the top probability's (``msp``, 1 - top) for reference; and how the unsure
answers split by kind.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from bench import photo_split
from bench.ood import OOD_PHOTOS
from bench.real_photos import PHOTOS, load_photos, print_table
from vit_core.calibration.ood import auroc
from vit_core.data import default_data_root
from webapp.inference.analysis import analyse
from webapp.inference.model_info import analysis_decision
from webapp.registry.catalog import BUNDLED, ROOT
from webapp.registry.models import Models
from webapp.registry.options import Options

PLURALS = {"cats": "cat", "dogs": "dog"}  # the shared sets' folder names -> the model's class names
INSIDE = ("cats_and_dogs", "cars_birds_deer_frogs_horses")  # the shared sets of the bundle's classes
OUTSIDE = ("ants_and_bees",)


def shared_folder(dataset: str, split: str) -> Path:
    """A shared photo set's ``split``: ``train`` or ``val`` under the data root, or ``held``, the held-out share
    of ``train`` (``bench.photo_split``)."""
    if split == "held":
        return photo_split.split(dataset) / "held"
    return default_data_root() / "photos" / dataset / split


@dataclass
class Answer:
    label: str  # the photo's class, in the model's names where it is one of them
    right: bool
    kind: str  # webapp.inference.model_info.Decision.kind
    plain: bool
    score: float  # the detector's score (nan without one)
    msp: float  # 1 - the top probability


def answers(folder: Path, what: str, model, transform) -> list[Answer]:
    """The app's decision for every ``folder/<class>/<image>``."""
    out = []
    names = model.class_names
    for photo in tqdm(load_photos(folder), desc=what, leave=False):
        a = analyse(model, transform, "bench", str(photo.path), torch.device("cpu"))
        d = analysis_decision(a)
        label = PLURALS.get(photo.label, photo.label)
        right = label in names and int(a.probs.argmax()) == names.index(label)
        score = float("nan") if a.ood_score is None else a.ood_score
        out.append(Answer(label, right, d.kind, d.plain, score, 1 - float(a.probs.max())))
    return out


def share(hits: int, n: int) -> str:
    return f"{100 * hits / n:.1f}% ({hits}/{n})" if n else "-"


def inside_rows(name: str, got: list[Answer]) -> list[list[str]]:
    rows = []
    for label in [*sorted({a.label for a in got}), None]:
        sel = [a for a in got if label is None or a.label == label]
        right = [a for a in sel if a.right]
        rows.append([name, label or "all", share(len(right), len(sel)), share(sum(a.plain for a in right), len(right))])
    return rows


def outside_rows(name: str, got: list[Answer]) -> list[list[str]]:
    return [
        [name, label or "all", share(sum(a.plain for a in sel), len(sel))]
        for label in [*sorted({a.label for a in got}), None]
        if (sel := [a for a in got if label is None or a.label == label])
    ]


def class_means(sets: dict[str, list[Answer]]) -> tuple[float, float, float]:
    """Over every class of ``sets`` together: the mean of the classes' shares right, the lowest class's share,
    and of the right ones the share with a plain answer (all photos pooled)."""
    got = [a for answers_ in sets.values() for a in answers_]
    by_class = {c: [a for a in got if a.label == c] for c in {a.label for a in got}}
    rights = [sum(a.right for a in sel) / len(sel) for sel in by_class.values()]
    right = [a for a in got if a.right]
    return 100 * sum(rights) / len(rights), 100 * min(rights), 100 * sum(a.plain for a in right) / max(len(right), 1)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(BUNDLED.relative_to(ROOT)), help="checkpoint folder or Hub id")
    ap.add_argument("--split", choices=("held", "val"), default="val", help="the shared sets' split")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    model, transform = Models(torch.device("cpu"), Options(models=(args.model,))).get(args.model, wait=3600)
    inside = {f"{d}/{args.split}": answers(shared_folder(d, args.split), d, model, transform) for d in INSIDE}
    shared = dict(inside)
    inside["bench/real_photos"] = answers(PHOTOS, "bench/real_photos", model, transform)
    outside = {f"{d}/{args.split}": answers(shared_folder(d, args.split), d, model, transform) for d in OUTSIDE}
    outside["bench/ood_photos"] = answers(OOD_PHOTOS, "bench/ood_photos", model, transform)
    print(f"{args.model}: as the app decides (views, temperature, threshold, 'not sure' rule)\n")
    rows = [r for name, got in inside.items() for r in inside_rows(name, got)]
    print_table(["photos of its classes", "class", "right", "of the right: plain answer"], rows)
    mean, lowest, plain = class_means(shared)
    print(
        f"\nthe shared sets' classes together: mean right {mean:.1f}% (lowest class {lowest:.1f}%), of the right "
        f"ones {plain:.1f}% plain\n"
    )
    rows = [r for name, got in outside.items() for r in outside_rows(name, got)]
    print_table(["photos of other things", "class", "plain answer (target: few)"], rows)
    print()
    rows = []
    every_shared = [a for got in shared.values() for a in got]
    for i_name, i_got in [*inside.items(), ("the shared sets together", every_shared)]:
        for o_name, o_got in outside.items():
            values = [
                (torch.tensor([getattr(a, k) for a in i_got]), torch.tensor([getattr(a, k) for a in o_got]))
                for k in ("score", "msp")
            ]
            aucs = [f"{auroc(i, o):.3f}" for i, o in values]
            rows.append([i_name, o_name, *aucs])
    print_table(["inside", "outside", "AUROC, detector", "AUROC, 1 - top probability"], rows)
    print()
    every = {**inside, **outside}
    kinds = sorted({a.kind for got in every.values() for a in got})
    rows = [[name, *[str(sum(a.kind == k for a in got)) for k in kinds]] for name, got in every.items()]
    print_table(["set", *kinds], rows)


if __name__ == "__main__":
    main()
