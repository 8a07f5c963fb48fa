"""Calibration and "none of my classes", measured offline: ECE before and after, and every OOD score on three protocols.

    python -m bench.ood                                   # everything (about 10 minutes on a 2-core CPU)
    python -m bench.ood --protocols photos far            # some protocols
    python -m bench.ood --open-model runs/cifar10_open6   # the open-set model (trained there first if missing)

Protocols (inside = images of the model's classes, outside = images of none of them):

- ``open-set``: open-set CIFAR-10 (Neal et al. 2018). A model trained on 6 classes (``train/recipes/cifar10_open6``:
  automobile, cat, deer, dog, horse, truck) scores the 6,000 test images of its classes against the 4,000 of
  the other 4 (airplane, bird, frog, ship). Trained under ``--open-model`` (15 minutes) when missing, and
  calibrated there with ``python -m train calibrate`` on the 5,000 training images it never saw.
- ``far``: far-OOD. The bundled model scores the 10,000 CIFAR-10 test images against the MNIST and the
  Fashion-MNIST test images (``--far-images`` of each, grey made RGB by the model's preprocessing).
- ``photos``: real photos. The bundled model scores the 43 photos of its classes (``bench/real_photos``)
  against the 78 of other things (``bench/ood_photos``: food, plants, household objects, tools, hobbies,
  people, buildings, interiors, landscapes, other animals; sources and licences in its ``SOURCES.md``).

Every image goes through the model's own preprocessing and, as the app, the views the model was calibrated
for (``vit_core.calibration.calibrated_views``: the views ``train calibrate --tta`` fitted it for, the bundled
model's airbench's six, ``flip-translate``; the image and its mirror, ``flip``, for a model never calibrated): the
probabilities are their calibrated mean, a score is computed from all the views' outputs
(``vit_core.calibration.ood``). Printed:

1. ECE (15 bins) on the test images, single view and the model's views, with the plain softmax and with the stored
   temperature (fitted by ``train calibrate`` on held-out training images, never on these; the bundled model
   stores T = 0.550). A model that stores none shows the temperature fitted on its held-out images anyway.
2. Per protocol and score (every entry of ``vit_core.calibration.ood.SCORES``: msp, energy, knn, mahalanobis,
   relative_mahalanobis, vim):
   AUROC (outside scoring higher) and FPR at 95% TPR (the share of outside images taken for inside when 95% of
   inside images are kept).
   ``msp`` is the reference: the confidence the app showed before.
3. At the threshold stored with the checkpoint (set on held-out training images only): the share of inside
   images kept, and of outside images that get a plain answer (not out of distribution and a top probability
   of at least 50%, the app's "Not sure" rule); for the photos also the share of correctly classified inside
   photos that keep their plain answer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

import vit_core
from bench.real_photos import PHOTOS, load_photos, print_table
from vit_core.calibration import (
    calibrated_views,
    expected_calibration_error,
    fit_temperature,
    forward_views,
    mixture_log_probs,
    temperature,
)
from vit_core.calibration.ood import SCORES, auroc, fit_statistics, fpr_at_tpr, ood_scores
from vit_core.data import Batches, build_transform, class_subset, load_image
from vit_core.io.files import RECIPE_NAME
from vit_core.training.builders import load_data
from vit_core.training.evaluation import HELD_OUT, OOD_FIT, model_classes, ood_fit_images
from webapp.inference.model_info import UNSURE_BELOW
from webapp.registry.catalog import BUNDLED, ROOT

OOD_PHOTOS = Path(__file__).resolve().parent / "ood_photos"
OPEN_RECIPE = "cifar10_open6"


@dataclass
class Outputs:
    """A model's views of some images: logits and pre-logit features per view, and the labels."""

    logits: list[torch.Tensor]
    features: list[torch.Tensor]
    weights: list[float]
    labels: torch.Tensor

    def probs(self, T: float, single: bool = False) -> torch.Tensor:
        """The calibrated mean over the views (``single``: the first view, the image itself, alone)."""
        if single:
            return mixture_log_probs(self.logits[:1], [1.0], T).exp()
        return mixture_log_probs(self.logits, self.weights, T).exp()


def run(model: vit_core.VisionTransformer, batches, what: str, tta: str | None = "model") -> Outputs:
    """The model's outputs on ``batches`` for the ``tta`` views ("model": those it was calibrated for)."""
    logits, features, labels = [], [], []
    for x, y in tqdm(batches, desc=what, leave=False):
        z, f, weights, _ = forward_views(model, x, tta)
        logits.append(torch.stack(z))
        features.append(torch.stack(f))
        labels.append(y)
    return Outputs(list(torch.cat(logits, 1)), list(torch.cat(features, 1)), weights, torch.cat(labels))


def dataset_outputs(
    model, data: str, split: str, subset, what: str, classes: list[str] | None = None, tta: str | None = "model"
) -> Outputs:
    ds = load_data(data, split, build_transform(model.pretrained_cfg), subset)
    ds = class_subset(ds, classes if classes is not None else model_classes(model, ds.classes))
    return run(model, Batches(ds, 500, torch.device("cpu"), train=False), what, tta)


def photo_outputs(model, folder: Path, what: str) -> tuple[Outputs, list]:
    photos = load_photos(folder)
    transform = build_transform(model.pretrained_cfg)
    x = torch.stack([transform(load_image(p.path)) for p in photos])
    names = model.class_names
    y = torch.tensor([names.index(p.label) if p.label in names else -1 for p in photos])
    return run(model, [(x, y)], what), photos


def all_scores(model, out: Outputs, statistics: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    probs = out.probs(temperature(model))
    return {
        s: ood_scores(s, probs=probs, logits=out.logits, features=out.features, statistics=statistics[s])
        for s in SCORES
    }


def fit_all(model, data: str, folder: str | Path | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """Every score's statistics from the plain view of the images ``train calibrate`` fits its score on
    (``vit_core.training.evaluation.ood_fit_images``: training images OOD_FIT and ``folder``'s recipe's ``photos``)."""
    recipe = Path(folder or "", RECIPE_NAME)
    photos = json.loads(recipe.read_text()).get("photos") if folder is not None and recipe.is_file() else None
    images, _ = ood_fit_images(model, data, OOD_FIT, photos, progress=False)
    bank = run(model, Batches(images, 500, torch.device("cpu"), train=False), "OOD statistics", tta=None)
    head = (model.head.weight, model.head.bias)
    return {s: fit_statistics(s, bank.features[0], bank.labels, model.config.num_classes, head) for s in SCORES}


def calibration_rows(name: str, out: Outputs, T: float, views: str | None) -> list[list[str]]:
    rows = []
    for single, label in ((True, "single view"), (False, f"{views} views")):
        before = expected_calibration_error(out.probs(1.0, single), out.labels)
        after = expected_calibration_error(out.probs(T, single), out.labels)
        acc = (out.probs(T, single).argmax(-1) == out.labels).double().mean()
        rows.append(
            [name, label, f"{len(out.labels):,}", f"{100 * acc:.2f}%", f"{before:.4f}", f"{after:.4f}", f"{T:.4g}"]
        )
    return rows


def held_out_temperature(model, data: str) -> float:
    """The temperature ``train calibrate`` fits (the model's views of held-out training images), for a model that
    stores none because it saw them: what calibrating on seen images would do."""
    held = dataset_outputs(model, data, "train", list(HELD_OUT), "held-out training images")
    return fit_temperature(held.logits, held.weights, held.labels)


def score_rows(protocol: str, inside: dict, outside: dict) -> list[list[str]]:
    ref = auroc(inside["msp"], outside["msp"])
    return [
        [
            protocol,
            s,
            f"{auroc(inside[s], outside[s]):.3f}",
            f"{auroc(inside[s], outside[s]) - ref:+.3f}",
            f"{fpr_at_tpr(inside[s], outside[s]):.3f}",
        ]
        for s in SCORES
    ]


def plain(model, out: Outputs, scores: dict[str, torch.Tensor]) -> torch.Tensor:
    """Which images the app would answer plainly: not out of distribution by the stored detector, and a
    calibrated top probability of at least UNSURE_BELOW."""
    ood = model.calibration.ood
    flagged = ood.is_ood(scores[ood.score])
    return ~flagged & (out.probs(temperature(model)).max(-1).values >= UNSURE_BELOW)


def decision_rows(protocol: str, model, inside: Outputs, s_in: dict, outside: Outputs, s_out: dict) -> list[list[str]]:
    ood = model.calibration.ood
    kept = ~ood.is_ood(s_in[ood.score])
    out_plain = plain(model, outside, s_out)
    row = [
        protocol,
        f"{ood.score} > {ood.threshold:.4g}",
        f"{100 * kept.double().mean():.1f}% ({int(kept.sum())}/{len(kept)})",
        f"{100 * (~ood.is_ood(s_out[ood.score])).double().mean():.1f}%",
        f"{100 * out_plain.double().mean():.1f}% ({int(out_plain.sum())}/{len(out_plain)})",
    ]
    correct = inside.probs(temperature(model)).argmax(-1) == inside.labels
    keep = plain(model, inside, s_in)[correct]
    row.append(f"{100 * keep.double().mean():.1f}% ({int(keep.sum())}/{len(keep)})")
    return [row]


def open_model(folder: Path) -> vit_core.VisionTransformer:
    """The open-set model: trained (``train/recipes/cifar10_open6``) and calibrated in ``folder`` when missing."""
    if not (folder / "model.safetensors").is_file():
        print(f"training the open-set model into {folder} (train/recipes/{OPEN_RECIPE}.py, about 15 minutes)")
        subprocess.run([sys.executable, "-m", "train", "--recipe", OPEN_RECIPE, "--out", str(folder)], check=True)
    model = vit_core.from_pretrained(folder)
    if model.calibration is None:
        subprocess.run([sys.executable, "-m", "train", "calibrate", "--model", str(folder)], check=True)
        model = vit_core.from_pretrained(folder)
    return model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bundled = str(BUNDLED.relative_to(ROOT))
    ap.add_argument("--model", default=bundled, help="calibrated CIFAR-10 checkpoint for the far and photo protocols")
    ap.add_argument("--open-model", type=Path, default=Path("runs") / OPEN_RECIPE, help="the open-set model's folder")
    ap.add_argument(
        "--protocols", nargs="+", choices=("open-set", "far", "photos"), default=["open-set", "far", "photos"]
    )
    ap.add_argument("--far-images", type=int, default=10000, help="MNIST and Fashion-MNIST test images of each")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)

    calib, scores, decisions = [], [], []
    if "open-set" in args.protocols:
        model = open_model(args.open_model)
        known = model.label_names
        test = load_data("cifar10", "test", None, None)
        unknown = [c for c in test.classes if c not in known]
        stats = fit_all(model, "cifar10")
        inside = dataset_outputs(model, "cifar10", "test", None, "open-set: known")
        outside = dataset_outputs(model, "cifar10", "test", None, "open-set: unknown", classes=unknown)
        s_in, s_out = all_scores(model, inside, stats), all_scores(model, outside, stats)
        calib += calibration_rows(
            f"open-set ({len(known)} classes)", inside, temperature(model), calibrated_views(model)
        )
        scores += score_rows(f"open-set: {', '.join(unknown)} vs the {len(known)} known", s_in, s_out)
        decisions += decision_rows("open-set", model, inside, s_in, outside, s_out)
    if "far" in args.protocols or "photos" in args.protocols:
        model = vit_core.from_pretrained(args.model)
        if model.calibration is None or model.calibration.ood is None:
            raise SystemExit(
                f"{args.model} has no stored calibration: run python -m train calibrate --model {args.model}"
            )
        stats = fit_all(model, "cifar10", args.model)
    if "far" in args.protocols:
        inside = dataset_outputs(model, "cifar10", "test", None, "CIFAR-10 test")
        s_in = all_scores(model, inside, stats)
        if model.calibration.temperature is not None:
            calib += calibration_rows(
                "bundled (10 classes)", inside, model.calibration.temperature, calibrated_views(model)
            )
        else:  # it saw its held-out images: what their temperature would do
            seen_t = held_out_temperature(model, "cifar10")
            calib += calibration_rows(
                "bundled, T fitted on seen images (not stored)", inside, seen_t, calibrated_views(model)
            )
        for data in ("mnist", "fashion-mnist"):
            outside = dataset_outputs(model, data, "test", args.far_images, data, classes=None)
            s_out = all_scores(model, outside, stats)
            scores += score_rows(f"far: {data} ({len(outside.labels):,}) vs CIFAR-10 test", s_in, s_out)
            decisions += decision_rows(f"far: {data}", model, inside, s_in, outside, s_out)
    if "photos" in args.protocols:
        inside, _ = photo_outputs(model, PHOTOS, "photos of the classes")
        outside, photos = photo_outputs(model, OOD_PHOTOS, "photos of other things")
        s_in, s_out = all_scores(model, inside, stats), all_scores(model, outside, stats)
        scores += score_rows(f"photos: {len(photos)} outside vs {len(inside.labels)} inside", s_in, s_out)
        decisions += decision_rows("photos", model, inside, s_in, outside, s_out)
        by_group = {}
        out_plain = plain(model, outside, s_out)
        for p, ok in zip(photos, out_plain.tolist(), strict=True):
            by_group.setdefault(p.label, []).append(ok)
    if calib:
        print("\nCalibration: ECE (15 bins) on the test images, before (T = 1) and after (the stored temperature)\n")
        print_table(["model", "views", "images", "top-1", "ECE, softmax", "ECE, calibrated", "T"], calib)
    print("\nOOD scores: AUROC (outside higher; vs msp, the reference) and FPR at 95% TPR\n")
    print_table(["protocol", "score", "AUROC", "vs msp", "FPR@95%TPR"], scores)
    print("\nAt the stored threshold (set on held-out training images)\n")
    print_table(
        ["protocol", "rule", "inside kept", "outside kept", "outside: plain answer", "correct inside: plain answer"],
        decisions,
    )
    if "photos" in args.protocols:
        print("\nOutside photos with a plain answer, by group\n")
        print_table(["group", "plain answer"], [[g, f"{sum(v)}/{len(v)}"] for g, v in sorted(by_group.items())])


if __name__ == "__main__":
    main()
