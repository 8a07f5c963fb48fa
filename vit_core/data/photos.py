"""Real photos folded into a small-image training set, shrunk as the app shrinks them.

A CIFAR-10 model sees 32x32 images that were made by shrinking photos; the app squashes a person's photo
whole to the model's input the same way. Photos of the model's classes (e.g. ``photos/cats_and_dogs/train``)
are added to its in-memory training images as uint8 tensors of the input size, so the batch pipeline (pad-crop,
alternating flips) treats them like the rest:

- copy 0 of each photo is exactly what the app's preprocessing makes of it (``ImageTransform``'s eval resize
  with ``crop_pct`` 1 and the checkpoint's ``crop_mode``);
- copies 1.. look like other photos of the same thing, shrunk: a random resized crop of the full-size photo
  (area 35-100%, aspect 3/4-4/3, as Szegedy et al. 2015's Inception crop), colour jitter (brightness,
  contrast and saturation factors in [0.7, 1.3], hue within 0.03 of a turn), a Gaussian blur (p = 0.3,
  radius 0.3-1.2 px at the photo's size) and a JPEG re-encode (p = 0.5, quality 30-90), then the same resize.

Photos of other things (a recipe's ``outliers``, e.g. ``photos/ants_and_bees``) join the same way, every class
of their folder, labelled ``OUTLIER`` (-1): outlier exposure (Hendrycks et al. 2019), whose loss
(``vit_core.training.builders.OutlierExposure``) pushes the model's answer for them toward "all classes equally likely".

A spec may take a ``share`` of its folder's photos: "fit" or "held", the photos whose file name's SHA-256 falls
above or in the lowest ``HELD_SHARE`` (``in_held_share``: a split that does not move when files are added), so that
a recipe chosen on a held-out share of ``train`` names the photos it trained on (``bench.photo_split`` links the
same two shares for measuring).

Everything is drawn from ``random.Random(seed)``: the same recipe makes the same images.
"""

from __future__ import annotations

import hashlib
import io
import math
import random
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image, ImageFilter
from tqdm.auto import tqdm

from .datasets import ImageFolderDataset, InMemoryImageDataset, _split_folder, default_data_root
from .images import ImageDataError, load_image, to_model_mode
from .transforms import _resize_center_crop

PHOTO_KEYS = ("folder", "classes", "copies")
OUTLIER_KEYS = ("folder", "copies", "weight")
SHARES = ("fit", "held")  # a spec's optional "share" of its folder's photos
HELD_SHARE = 0.2  # the held-out share's size
OUTLIER = -1  # the target of a photo of none of the model's classes


def in_held_share(name: str) -> bool:
    """Whether the photo file named ``name`` is in the held-out share: its SHA-256 among the lowest ``HELD_SHARE``."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) < HELD_SHARE * 16**8


def _in_share(samples: list[tuple[Path, int]], share: str | None) -> list[tuple[Path, int]]:
    """``samples`` of a spec's ``share`` ("fit", "held"; None: all)."""
    return (
        samples if share is None else [(p, y) for p, y in samples if in_held_share(Path(p).name) == (share == "held")]
    )


def photo_specs(photos: dict[str, Any] | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A recipe's ``photos`` as a list of specs: one folder's spec, or a list of them (several photo sets)."""
    return [] if photos is None else list(photos) if isinstance(photos, list) else [photos]


def check_photos(photos: dict[str, Any] | list[dict[str, Any]] | None) -> list[str]:
    """Problems with a recipe's ``photos``: {"folder": path (relative: under the data root), "classes":
    {folder class: model class}, "copies": n >= 1}, or a list of such specs (one per photo set)."""
    if isinstance(photos, list):
        return [p for spec in photos for p in check_photos(spec)] if photos else ["photos: an empty list"]
    return _spec_problems_of_one(photos)


def _spec_problems_of_one(spec: dict[str, Any] | None) -> list[str]:
    problems = _spec_problems("photos", spec, PHOTO_KEYS)
    if spec is None or set(spec) - {"share"} != set(PHOTO_KEYS):
        return problems
    classes = spec["classes"]
    if not (isinstance(classes, dict) and classes and all(isinstance(v, str) for v in classes.values())):
        problems.append(f"photos classes must map folder class names to the model's, got {classes!r}")
    return problems


def check_outliers(spec: dict[str, Any] | None) -> list[str]:
    """Problems with a recipe's ``outliers``: {"folder": path (relative: under the data root), "copies": n >= 1,
    "weight": the outlier-exposure loss's weight > 0 (Hendrycks et al. 2019 use 0.5)}."""
    problems = _spec_problems("outliers", spec, OUTLIER_KEYS)
    if spec is None or set(spec) - {"share"} != set(OUTLIER_KEYS):
        return problems
    weight = spec["weight"]
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        problems.append(f"outliers weight must be a number > 0, got {weight!r}")
    return problems


def _spec_problems(key: str, spec: dict[str, Any] | None, keys: tuple[str, ...]) -> list[str]:
    """What a photo folder's spec (``key`` of a recipe) gets wrong in its keys, its folder, its share or its
    copies."""
    if spec is None:
        return []
    unknown, missing = sorted(set(spec) - set(keys) - {"share"}), sorted(set(keys) - set(spec))
    if unknown or missing:
        return [f"{key} needs the keys {', '.join(keys)}, and may take share (unknown {unknown}, missing {missing})"]
    problems = [] if isinstance(spec["folder"], str) else [f"{key} folder must be a path, got {spec['folder']!r}"]
    if spec.get("share", "fit") not in SHARES:
        problems.append(f"{key} share must be one of {', '.join(SHARES)}, got {spec['share']!r}")
    copies = spec["copies"]
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        problems.append(f"{key} copies must be an integer >= 1, got {copies!r}")
    return problems


def photo_folder(folder: str, split: str) -> Path:
    """``folder`` (relative paths under ``default_data_root()``), its ``split`` sub-folder when it has one."""
    path = Path(folder).expanduser()
    path = path if path.is_absolute() else default_data_root() / path
    if not path.is_dir():
        raise ImageDataError(f"photos folder {path}: no such folder")
    return _split_folder(path, split)


def shrink(img: Image.Image, cfg: dict[str, Any]) -> torch.Tensor:
    """``img`` as the eval transform of ``cfg`` (a ``pretrained_cfg``) resizes it, before normalising: uint8."""
    in_chans, h, w = (int(v) for v in cfg["input_size"])
    squash = cfg.get("crop_mode") == "squash"
    small = _resize_center_crop(to_model_mode(img, in_chans), (h, w), 1.0, cfg["interpolation"], squash)
    return TF.pil_to_tensor(small)


def photo_like(img: Image.Image, rng: random.Random) -> Image.Image:
    """Another photo of the same thing: crop, colour, blur and compression drawn from ``rng`` (module docstring)."""
    W, H = img.size
    for _ in range(10):  # torchvision's RandomResizedCrop sampling, with its fallback to the whole image
        area = W * H * rng.uniform(0.35, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < w <= W and 0 < h <= H:
            left, top = rng.randint(0, W - w), rng.randint(0, H - h)
            img = img.crop((left, top, left + w, top + h))
            break
    img = TF.adjust_brightness(img, rng.uniform(0.7, 1.3))
    img = TF.adjust_contrast(img, rng.uniform(0.7, 1.3))
    img = TF.adjust_saturation(img, rng.uniform(0.7, 1.3))
    img = TF.adjust_hue(img, rng.uniform(-0.03, 0.03))
    if rng.random() < 0.3:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.2)))
    if rng.random() < 0.5:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=rng.randint(30, 90))
        img = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    return img


def photo_images(
    spec: dict[str, Any], class_names: list[str], cfg: dict[str, Any], seed: int, progress: bool = True
) -> InMemoryImageDataset:
    """The training photos of ``spec`` (a recipe's ``photos``; its ``share`` of them when it names one),
    ``copies`` of each, labelled with the model's ``class_names`` through ``spec["classes"]``, as uint8 images of
    the input size (module docstring)."""
    folder = ImageFolderDataset(photo_folder(spec["folder"], "train"))
    mapping = spec["classes"]
    wrong = sorted(set(mapping) - set(folder.classes)) + sorted(set(mapping.values()) - set(class_names))
    if wrong:
        raise ImageDataError(
            f"photos classes {mapping}: {wrong} not among the folder's ({folder.classes}) or the data's classes"
        )
    samples = [
        (p, class_names.index(mapping[folder.classes[y]])) for p, y in folder.samples if folder.classes[y] in mapping
    ]
    samples = _in_share(samples, spec.get("share"))
    return _shrunk_copies(samples, spec["copies"], class_names, cfg, random.Random(seed), progress=progress)


def outlier_images(
    spec: dict[str, Any], class_names: list[str], cfg: dict[str, Any], seed: int, progress: bool = True
) -> InMemoryImageDataset:
    """Every training photo of ``spec`` (a recipe's ``outliers``), ``copies`` of each as ``photo_images`` makes
    them, labelled ``OUTLIER``."""
    folder = ImageFolderDataset(photo_folder(spec["folder"], "train"))
    samples = _in_share([(p, OUTLIER) for p, _ in folder.samples], spec.get("share"))
    return _shrunk_copies(
        samples, spec["copies"], class_names, cfg, random.Random(seed + 1), desc="outliers", progress=progress
    )


def _shrunk_copies(
    samples: list[tuple[Path, int]],
    copies: int,
    class_names: list[str],
    cfg: dict[str, Any],
    rng: random.Random,
    *,
    desc: str = "photos",
    progress: bool = True,
) -> InMemoryImageDataset:
    """Copy 0 of each photo as the app shrinks it, copies 1.. ``photo_like`` first (module docstring)."""
    images, targets = [], []
    for path, label in tqdm(samples, desc=desc, unit="photo", leave=False, disable=not progress):
        img = load_image(path).convert("RGB")
        for copy in range(copies):
            images.append(shrink(img if copy == 0 else photo_like(img, rng), cfg))
            targets.append(label)
    return InMemoryImageDataset(torch.stack(images), torch.tensor(targets), list(class_names))


def with_photos(
    train_set: InMemoryImageDataset,
    photos: dict[str, Any] | list[dict[str, Any]] | None,
    outliers: dict[str, Any] | None,
    cfg: dict[str, Any],
    seed: int,
    progress: bool = True,
) -> InMemoryImageDataset:
    """``train_set`` (in memory), the photos of ``photos`` (one spec or a list) and those of ``outliers`` (either
    may be None), one dataset with ``train_set``'s transform."""
    if not isinstance(train_set, InMemoryImageDataset):
        raise ImageDataError("photos are added to an in-memory training set (mnist, fashion-mnist, cifar10)")
    names = list(train_set.classes)
    extra = [photo_images(spec, names, cfg, seed + i, progress) for i, spec in enumerate(photo_specs(photos))]
    extra += [outlier_images(outliers, names, cfg, seed, progress)] if outliers is not None else []
    return InMemoryImageDataset(
        torch.cat([train_set.images, *(e.images for e in extra)]),
        torch.cat([train_set.targets, *(e.targets for e in extra)]),
        names,
        train_set.transform,
    )
