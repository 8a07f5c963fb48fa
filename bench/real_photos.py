"""Real-photo check: how a CIFAR-10 model does on freely licensed photos of its ten classes.

    python -m bench.real_photos                  # the bundled model: plain and as-the-app accuracy
    python -m bench.real_photos --model FOLDER   # another checkpoint folder or Hub id
    python -m bench.real_photos --tta            # per-image table as the app predicts (its TTA views)
    python -m bench.real_photos --compare        # eval-crop variants side by side

The photos live in ``bench/real_photos/<class>/*.jpg`` (sources and licences in ``SOURCES.md`` there), one
folder per CIFAR-10 class, at most 256 px on the long side. Each photo is opened with
``vit_core.data.load_image`` and preprocessed with ``vit_core.data.build_transform(model.pretrained_cfg)``,
exactly as the app does. Printed: top-1 accuracy per class and overall, of the image alone and of the app's
probabilities (``vit_core.calibration.predict``: the softmaxes of the views the model was calibrated for,
the image and its mirror, or, after ``train calibrate --tta flip-translate``, those pairs shifted 1 px too; so
that column is what the app gets right), split into full photos and
cut-outs (objects on a white background, the ``kind`` column of ``SOURCES.md``), and a per-image table
(file, true class, prediction, confidence).

``--compare`` evaluates other eval preprocessings on the same photos, each alone and as the app:

- ``cfg``: the checkpoint's own ``pretrained_cfg``;
- ``center, crop_pct=1.0`` and ``center, crop_pct=0.875``: centre crops (shorter side resized to
  ``size / crop_pct``, centre crop; timm's eval geometry);
- ``squash``: the whole image resized to the input size, aspect ratio not kept (timm's ``crop_mode="squash"``,
  which a checkpoint's ``pretrained_cfg`` can name);
- ``pad``: the image padded to a square with the normalisation mean colour, then resized (the whole object
  kept, at its own aspect ratio).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

import vit_core
from vit_core import calibration
from vit_core.data import build_transform, load_image
from webapp.registry.catalog import BUNDLED, ROOT

PHOTOS = Path(__file__).resolve().parent / "real_photos"
CIFAR10 = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
Preprocess = Callable[[Image.Image], Image.Image]


@dataclass(frozen=True)
class Photo:
    path: Path
    label: str  # the class folder's name
    kind: str  # "photo" or "cutout" (SOURCES.md), "?" when not listed


@dataclass(frozen=True)
class Variant:
    """An eval preprocessing: a ``pretrained_cfg`` for ``build_transform`` and an optional step before it."""

    name: str
    cfg: dict
    before: Preprocess | None = None


def load_photos(root: Path = PHOTOS) -> list[Photo]:
    """Every ``root/<class>/*.jpg``, sorted, with its kind from ``root/SOURCES.md``."""
    kinds = read_sources(root / "SOURCES.md") if (root / "SOURCES.md").is_file() else {}
    files = sorted(p for p in root.glob("*/*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    return [Photo(p, p.parent.name, kinds.get(p.relative_to(root).as_posix(), {}).get("kind", "?")) for p in files]


def read_sources(path: Path) -> dict[str, dict[str, str]]:
    """The rows of a Markdown table whose first column is a file name (in backticks or not), keyed by it,
    each a dict from the header's lower-cased column names to the cell text."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
        elif not re.fullmatch(r"[-: ]+", "".join(cells)):
            row = dict(zip(header, cells, strict=False))
            rows[cells[0].strip("`")] = row
    return rows


def pad_square(mean: tuple[float, ...]) -> Preprocess:
    """Pad the image to a square, centred, with the colour ``mean`` (in [0, 1])."""

    def pad(img: Image.Image) -> Image.Image:
        side = max(img.size)
        fill = tuple(round(255 * m) for m in mean) if img.mode == "RGB" else round(255 * mean[0])
        out = Image.new(img.mode, (side, side), fill)
        out.paste(img, ((side - img.width) // 2, (side - img.height) // 2))
        return out

    return pad


def variants(cfg: dict, compare: bool) -> list[Variant]:
    """The checkpoint's own preprocessing, and with ``compare`` the alternatives in the module docstring."""
    mode = cfg.get("crop_mode", "center")
    own = Variant(f"cfg ({mode}, crop_pct={cfg.get('crop_pct')})", cfg)
    if not compare:
        return [own]
    centre = {**cfg, "crop_mode": "center"}
    crops = [
        Variant(f"center, crop_pct={c}", {**centre, "crop_pct": c})
        for c in (1.0, 0.875)
        if (mode, c) != ("center", cfg.get("crop_pct"))
    ]
    squash = [Variant("squash", {**cfg, "crop_mode": "squash", "crop_pct": 1.0})] if mode != "squash" else []
    return [own, *crops, *squash, Variant("pad", {**centre, "crop_pct": 1.0}, pad_square(tuple(cfg["mean"])))]


@torch.no_grad()
def predict(model: torch.nn.Module, photos: list[Photo], variant: Variant) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax probabilities (N, classes) of the image alone, and the app's (the model's views, calibrated)."""
    transform = build_transform(variant.cfg)
    images = [load_image(p.path) for p in photos]
    if variant.before is not None:
        images = [variant.before(img) for img in images]
    x = torch.stack([transform(img) for img in images])
    return model(x).softmax(-1), calibration.predict(model, x).probs


def accuracy(correct: torch.Tensor, mask: torch.Tensor | None = None) -> str:
    """``"pct% (hits/n)"`` over the images selected by ``mask`` (all by default)."""
    c = correct if mask is None else correct[mask]
    return f"{100 * c.float().mean():.1f}% ({int(c.sum())}/{len(c)})" if len(c) else "-"


def summary_rows(photos: list[Photo], targets: torch.Tensor, preds: list[torch.Tensor]) -> list[list[str]]:
    """One row per class, then per kind (photo / cutout) and overall; one column per prediction tensor."""
    labels = [p.label for p in photos]
    kinds = [p.kind for p in photos]
    groups = [(c, [lab == c for lab in labels]) for c in dict.fromkeys(labels)]
    groups += [(f"[{k}s]", [kd == k for kd in kinds]) for k in sorted(set(kinds))]
    groups.append(("overall", [True] * len(photos)))
    return [[name] + [accuracy(p == targets, torch.tensor(mask)) for p in preds] for name, mask in groups]


def print_table(header: list[str], rows: list[list[str]]) -> None:
    """A Markdown table with padded columns."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(BUNDLED.relative_to(ROOT)), help="checkpoint folder or Hub id")
    ap.add_argument("--photos", type=Path, default=PHOTOS, help="folder of <class>/<image> files")
    ap.add_argument("--tta", action="store_true", help="per-image table as the app predicts (its TTA views)")
    ap.add_argument("--compare", action="store_true", help="also other eval crops (see the module docstring)")
    args = ap.parse_args(argv)

    model = vit_core.from_pretrained(args.model).eval()
    names = model.label_names or list(CIFAR10)
    photos = load_photos(args.photos)
    unknown = sorted({p.label for p in photos} - set(names))
    if not photos or unknown:
        raise SystemExit(f"{args.photos}: no photos, or class folders the model lacks: {unknown}")
    targets = torch.tensor([names.index(p.label) for p in photos])

    runs = {v.name: predict(model, photos, v) for v in variants(model.pretrained_cfg, args.compare)}
    header, preds = ["class"], []
    for name, (plain, tta) in runs.items():
        header += [f"{name}", f"{name}, as the app ({calibration.calibrated_views(model) or 'one view'})"]
        preds += [plain.argmax(-1), tta.argmax(-1)]
    print(f"{args.model}: {len(photos)} photos in {args.photos}\n")
    print_table(header, summary_rows(photos, targets, preds))

    probs = next(iter(runs.values()))[1 if args.tta else 0]
    conf, pred = probs.max(-1)
    views = f", {calibration.calibrated_views(model)} TTA" if args.tta else ""
    print(f"\nPer image ({next(iter(runs))}{views}):\n")
    rows = []
    for p, k, c, t in zip(photos, pred.tolist(), conf.tolist(), targets.tolist(), strict=True):
        file = p.path.relative_to(args.photos).as_posix()
        rows.append([file, p.kind, p.label, names[k], f"{c:.2f}", "ok" if k == t else "WRONG"])
    print_table(["file", "kind", "true", "predicted", "confidence", ""], rows)


if __name__ == "__main__":
    main()
