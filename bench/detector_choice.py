"""Choosing the "none of my classes" detector on training splits: each OOD score at a few thresholds, side by side.

    python -m bench.detector_choice                       # the bundled model, the held-out share of the train splits
    python -m bench.detector_choice --model runs/NAME --keep 0.85 0.9 0.95

For each score of ``vit_core.calibration.ood`` (statistics fitted as ``train calibrate`` fits them: CIFAR-10
training images 0-9,999 and the recipe's photos) and each ``--keep`` (the threshold keeps that share of the
held-out training images 45,000-49,999, the views the model is calibrated for), as the app decides (not out of
distribution and a calibrated top probability of at least ``UNSURE_BELOW``): of the photos of the bundle's classes
(``photos/cats_and_dogs``, ``photos/cars_birds_deer_frogs_horses``) that the model gets right, the share with a
plain answer; the share of ``photos/ants_and_bees`` with a plain answer; the same for ``bench/real_photos`` and
``bench/ood_photos`` (photos of other things); and the score's AUROC, the seven classes' photos against ants and
bees and against ``bench/ood_photos``. The last rows try Mahalanobis with one threshold per predicted class (each
the ``--keep`` quantile of the held-out images predicted as that class). ``--split held`` (the default: the
held-out share of the ``train`` splits, ``bench.photo_split``, which the bundle never trained on) is for
choosing; ``val`` is for the final numbers (``bench.photo_answers``). Images are opened with ``load_image`` and
the model's eval transform, as the app does for photos of this size (at most 256 px: no reduced decoding
applies).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import vit_core
from bench.ood import OOD_PHOTOS, Outputs, all_scores, dataset_outputs, fit_all, run
from bench.photo_answers import INSIDE, OUTSIDE, PLURALS, shared_folder
from bench.real_photos import PHOTOS, load_photos, print_table
from vit_core.calibration import temperature
from vit_core.calibration.ood import SCORES, auroc, threshold_for
from vit_core.data import build_transform, load_image
from vit_core.training.evaluation import HELD_OUT
from webapp.inference.model_info import UNSURE_BELOW
from webapp.registry.catalog import BUNDLED, ROOT


def photo_set(model, folder: Path, what: str) -> Outputs:
    """The model's views of ``folder/<class>/<image>``; labels -1 for classes it does not have."""
    photos = load_photos(folder)
    transform = build_transform(model.pretrained_cfg)
    x = torch.stack([transform(load_image(p.path)) for p in photos])
    names = model.class_names
    labels = [PLURALS.get(p.label, p.label) for p in photos]
    y = torch.tensor([names.index(lab) if lab in names else -1 for lab in labels])
    return run(model, [(x, y)], what)


def share(mask: torch.Tensor) -> str:
    return f"{100 * mask.double().mean():.1f}%" if len(mask) else "-"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(BUNDLED.relative_to(ROOT)), help="checkpoint folder")
    ap.add_argument("--split", choices=("held", "val"), default="held")
    ap.add_argument("--keep", type=float, nargs="+", default=[0.85, 0.875, 0.9, 0.95])
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    model = vit_core.from_pretrained(args.model).eval()
    T = temperature(model)
    stats = fit_all(model, "cifar10", args.model)
    held = dataset_outputs(model, "cifar10", "train", list(HELD_OUT), "held-out training images")
    sets = {d: photo_set(model, shared_folder(d, args.split), d) for d in (*INSIDE, *OUTSIDE)}
    sets |= {"real_photos": photo_set(model, PHOTOS, "bench/real_photos")}
    sets |= {"ood_photos": photo_set(model, OOD_PHOTOS, "bench/ood_photos")}
    scores = {name: all_scores(model, out, stats) for name, out in {"held": held, **sets}.items()}
    rows = []
    held_pred = held.probs(T).argmax(-1)
    for s, per_class in [(s, False) for s in SCORES] + [("mahalanobis", True)]:
        inside = torch.cat([scores[d][s] for d in INSIDE])
        aucs = [f"{auroc(inside, scores[d][s]):.3f}" for d in ("ants_and_bees", "ood_photos")]
        for keep in args.keep:
            # one threshold, or one per predicted class (the keep quantile of the held-out images predicted so)
            if per_class:
                C = model.config.num_classes
                threshold = torch.tensor([threshold_for(scores["held"][s][held_pred == c], keep) for c in range(C)])
            else:
                threshold = torch.tensor([threshold_for(scores["held"][s], keep)])
            shown = f"{float(threshold.min()):.4g}-{float(threshold.max()):.4g}" if per_class else f"{threshold[0]:.4g}"
            row = [s + (", per class" if per_class else ""), f"{keep:.3g}", shown, *aucs]
            for name, out in sets.items():
                probs = out.probs(T)
                limit = threshold[probs.argmax(-1)] if per_class else threshold[0]
                plain = (scores[name][s] <= limit) & (probs.max(-1).values >= UNSURE_BELOW)
                right = probs.argmax(-1) == out.labels
                row.append(share(plain[right]) if name in (*INSIDE, "real_photos") else share(plain))
            rows.append(row)
    print(f"{args.model}, T = {T:.4g}, split {args.split}: plain answers as the app decides\n")
    header = ["score", "keep", "threshold", "AUROC: a&b", "AUROC: ood_photos", "c&d right: plain"]
    header += ["5 classes right: plain", "a&b: plain", "real_photos right: plain", "ood_photos: plain"]
    print_table(header, rows)


if __name__ == "__main__":
    main()
