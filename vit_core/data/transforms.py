"""Preprocessing from a model's ``pretrained_cfg`` (timm's layout), for PIL images and uint8 tensor batches.

Eval is timm's ``create_transform(is_training=False)``; the train augmentations are timm's own
(RandomResizedCrop, RandAugment, RandomErasing, Mixup/CutMix) plus the classic pad-and-crop and flip,
which run on whole uint8 batches on any device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torchvision.transforms import InterpolationMode

from .images import match_channels, to_model_mode

_INTERPOLATION = {
    "nearest": InterpolationMode.NEAREST,
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
}
PIL_RESAMPLE = {  # interpolation name -> PIL filter (convert.py reads transformers' codes with it)
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
}

AUGMENT_DEFAULTS: dict[str, Any] = {
    "crop": None,  # "rrc" | "pad" | "none"; None: "pad" for inputs <= 64 px, else "rrc"
    "scale": (0.08, 1.0),  # RandomResizedCrop area range
    "ratio": (3 / 4, 4 / 3),  # RandomResizedCrop aspect-ratio range
    "padding": None,  # "pad": zero padding before the random crop; None: input size // 8 (4 px at 32)
    # random horizontal flip, p = 0.5 (turn off for digits and text); "alternate": airbench's alternating flips,
    # each image flipped on every other epoch, a fixed random half of them on the even ones (``Batches``)
    "hflip": True,
    "rand_augment": None,  # timm RandAugment spec, e.g. "rand-m9-mstd0.5-inc1"
    "re_prob": 0.0,  # timm RandomErasing probability, on the normalised tensor
    "re_mode": "pixel",  # erase with per-pixel noise ("pixel"), per-channel noise ("rand") or zeros ("const")
    "re_count": 1,  # up to this many erased boxes per image
}


def build_transform(
    pretrained_cfg: dict[str, Any], train: bool = False, *, augment: dict[str, Any] | None = None
) -> ImageTransform:
    """The model's preprocessing, from its ``pretrained_cfg`` (timm's dict: input_size, mean, std,
    interpolation, crop_pct, crop_mode).

    Eval (``train=False``), as timm's ``create_transform(..., is_training=False)``: resize the shorter side to
    ``input_size / crop_pct`` with the configured interpolation (crop_mode "squash": both sides, ignoring the
    aspect ratio), center-crop to ``input_size``, scale to [0, 1], normalise with mean/std. Channels follow
    ``input_size[0]`` (``to_model_mode``).

    Train: ``augment`` keys (see ``AUGMENT_DEFAULTS``): ``crop`` "pad" (resize to the input size if the image
    differs, zero-pad, random crop back: the classic CIFAR/MNIST recipe), "rrc" (timm's
    RandomResizedCrop with ``scale`` and ``ratio``) or "none" (resize + center crop); ``hflip`` (True: random;
    "alternate": left to ``Batches``, which knows each image's index and the epoch);
    ``rand_augment`` (timm's RandAugment, a per-image PIL op); ``re_prob``/``re_mode``/``re_count`` (timm's
    RandomErasing). Unknown keys are an error. Mixup/CutMix act on batches and labels: ``build_mixup``.
    """
    return ImageTransform(pretrained_cfg, train, augment)


class ImageTransform:
    """PIL image, uint8 (C, H, W) or uint8 (B, C, H, W) -> normalised float32 of the same rank.

    ``needs_pil`` is True when a per-image PIL op (RandAugment) is on: batches still work, image by image,
    but belong in DataLoader workers.
    """

    def __init__(self, pretrained_cfg: dict[str, Any], train: bool, augment: dict[str, Any] | None) -> None:
        missing = [k for k in ("input_size", "mean", "std") if k not in pretrained_cfg]
        if missing:
            raise ValueError(f"pretrained_cfg lacks {', '.join(missing)} (need input_size, mean, std)")
        self.in_chans, *hw = (int(v) for v in pretrained_cfg["input_size"])
        self.size: tuple[int, int] = (hw[0], hw[1])
        self.mean = torch.tensor(pretrained_cfg["mean"], dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(pretrained_cfg["std"], dtype=torch.float32).view(-1, 1, 1)
        self.interpolation = pretrained_cfg.get("interpolation", "bicubic")
        self.crop_pct = float(pretrained_cfg.get("crop_pct") or 0.875)  # timm's default
        if self.interpolation not in _INTERPOLATION:
            raise ValueError(f"interpolation {self.interpolation!r} unsupported; use one of {sorted(_INTERPOLATION)}")
        self.crop_mode = pretrained_cfg.get("crop_mode") or "center"
        if self.crop_mode not in ("center", "squash"):
            raise ValueError(f"crop_mode {self.crop_mode!r} unsupported; use 'center' or 'squash'")
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            raise ValueError(f"mean/std need {self.in_chans} values for input_size {pretrained_cfg['input_size']}")
        if self.in_chans not in (1, 3):
            raise ValueError(f"models take 1 or 3 input channels, got input_size {pretrained_cfg['input_size']}")
        self.train = train
        self.augment = _resolve_augment(augment, self.size) if train else {}
        self._rrc = self._rand_augment = None
        if self.augment.get("crop") == "rrc":
            from timm.data.transforms import RandomResizedCropAndInterpolation

            a = self.augment
            self._rrc = RandomResizedCropAndInterpolation(self.size, a["scale"], a["ratio"], self.interpolation)
        if self.augment.get("rand_augment"):
            self._rand_augment = self._build_rand_augment(self.augment["rand_augment"])
        self.needs_pil = self._rand_augment is not None

    def _build_rand_augment(self, spec: str) -> Callable[[Image.Image], Image.Image]:
        from timm.data.auto_augment import rand_augment_transform

        # timm's hparams for RandAugment (transforms_factory.transforms_imagenet_train)
        hparams = {
            "translate_const": int(min(self.size) * 0.45),
            "img_mean": tuple(min(255, round(255 * float(m))) for m in self.mean.flatten()),
            "interpolation": PIL_RESAMPLE[self.interpolation],
        }
        if self.in_chans == 1:
            hparams["img_mean"] = hparams["img_mean"][0]  # PIL wants a scalar fill for "L"
        try:
            return rand_augment_transform(spec, hparams)
        except Exception as e:
            raise ValueError(f"bad rand_augment spec {spec!r} ({e}); e.g. 'rand-m9-mstd0.5-inc1'") from e

    def __call__(self, img: Image.Image | torch.Tensor) -> torch.Tensor:
        batched = isinstance(img, torch.Tensor) and img.ndim == 4
        if isinstance(img, Image.Image):
            img = to_model_mode(img, self.in_chans)
        elif isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and img.ndim in (3, 4):
            img = match_channels(img if batched else img[None], self.in_chans)
        else:
            got = f"{img.dtype} tensor of shape {tuple(img.shape)}" if isinstance(img, torch.Tensor) else type(img)
            raise TypeError(f"expected a PIL image or a uint8 (C, H, W) / (B, C, H, W) tensor, got {got}")

        crop = self.augment.get("crop")
        if crop == "rrc":
            img = self._rrc(img) if isinstance(img, Image.Image) else torch.stack([self._rrc(x) for x in img])
        else:  # eval zooms by 1 / crop_pct like timm; train crops from the whole image
            crop_pct = self.crop_pct if not self.train else 1.0
            img = _resize_center_crop(img, self.size, crop_pct, self.interpolation, self.crop_mode == "squash")
        x = TF.pil_to_tensor(img)[None] if isinstance(img, Image.Image) else img

        if self.train:
            if crop == "pad":
                x = _random_pad_crop(x, self.augment["padding"])
            if self.augment["hflip"] is True:  # "alternate" flips by image and epoch: Batches does it
                x = _random_hflip(x)
            if self._rand_augment is not None:
                pils = [TF.to_pil_image(xi) for xi in x.cpu()]
                x = torch.stack([TF.pil_to_tensor(self._rand_augment(p)) for p in pils]).to(x.device)
        # ToTensor + Normalize, as torchvision computes them (same bits as timm's eval transform)
        x = x.to(torch.float32).div(255).sub(self.mean.to(x.device)).div(self.std.to(x.device))
        if self.train and self.augment["re_prob"] > 0:
            from timm.data.random_erasing import RandomErasing

            a = self.augment
            x = RandomErasing(a["re_prob"], mode=a["re_mode"], max_count=a["re_count"], device=x.device)(x)
        return x if batched else x[0]

    def crop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """The region (left, top, right, bottom) of a ``width`` x ``height`` image that the eval transform keeps,
        in that image's pixels: where a relevance map over the model's input belongs on the original image."""
        return _crop_region(height, width, self.size, self.crop_pct, self.crop_mode == "squash")[2]

    def __repr__(self) -> str:
        aug = f", augment={self.augment}" if self.train else ""
        return (
            f"ImageTransform(train={self.train}, input_size={(self.in_chans, *self.size)}, "
            f"interpolation={self.interpolation!r}, crop_pct={self.crop_pct}, crop_mode={self.crop_mode!r}{aug})"
        )


def storage_transform(pretrained_cfg: dict[str, Any]) -> Callable[[Image.Image | torch.Tensor], torch.Tensor]:
    """PIL image (or uint8 (C, H, W) tensor) -> uint8 (C, S, S): the eval transform's resize, stopped before its
    crop (S = input size / crop_pct, so the eval transform of the result crops without resizing again: the same
    pixels as from the original image). What ``decode_all`` keeps of each image of a folder in memory."""
    tf = build_transform(pretrained_cfg)
    store = tuple(math.floor(s / tf.crop_pct) for s in tf.size)

    def to_stored(img: Image.Image | torch.Tensor) -> torch.Tensor:
        img = (
            to_model_mode(img, tf.in_chans)
            if isinstance(img, Image.Image)
            else match_channels(img[None], tf.in_chans)[0]
        )
        img = _resize_center_crop(img, store, 1.0, tf.interpolation, tf.crop_mode == "squash")
        return TF.pil_to_tensor(img) if isinstance(img, Image.Image) else img

    return to_stored


def check_augment(augment: dict[str, Any] | None) -> dict[str, Any]:
    """``augment`` over ``AUGMENT_DEFAULTS``, checked: a ``ValueError`` names every unknown key and every
    value of the wrong type or out of range. ``crop`` and ``padding`` may stay None (they follow the
    input size). Recipes call this before any data is loaded."""
    augment = dict(augment or {})
    unknown = sorted(set(augment) - set(AUGMENT_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown augment key(s) {', '.join(unknown)}; known: {', '.join(AUGMENT_DEFAULTS)}")
    a = {**AUGMENT_DEFAULTS, **augment}
    problems = []
    if a["crop"] not in (None, "rrc", "pad", "none"):
        problems.append(f"crop must be 'rrc', 'pad' or 'none', got {a['crop']!r}")
    for key, hi in (("scale", 1.0), ("ratio", math.inf)):
        v = a[key]
        if not (
            isinstance(v, list | tuple) and len(v) == 2 and all(_is_number(x) for x in v) and 0 < v[0] <= v[1] <= hi
        ):
            problems.append(f"{key} must be [lo, hi] with 0 < lo <= hi{' <= 1' if hi == 1 else ''}, got {v!r}")
    if a["padding"] is not None and not (_is_int(a["padding"]) and a["padding"] >= 0):
        problems.append(f"padding must be an int >= 0, got {a['padding']!r}")
    if not (isinstance(a["hflip"], bool) or a["hflip"] == "alternate"):
        problems.append(f"hflip must be true, false or 'alternate', got {a['hflip']!r}")
    if a["rand_augment"] is not None and not (
        isinstance(a["rand_augment"], str) and a["rand_augment"].startswith("rand")
    ):
        problems.append(
            f"rand_augment must be a RandAugment spec like 'rand-m9-mstd0.5-inc1', got {a['rand_augment']!r}"
        )
    if not (_is_number(a["re_prob"]) and 0 <= a["re_prob"] <= 1):
        problems.append(f"re_prob must be in [0, 1], got {a['re_prob']!r}")
    if a["re_mode"] not in ("pixel", "rand", "const"):
        problems.append(f"re_mode must be 'pixel', 'rand' or 'const', got {a['re_mode']!r}")
    if not (_is_int(a["re_count"]) and a["re_count"] >= 1):
        problems.append(f"re_count must be an int >= 1, got {a['re_count']!r}")
    if problems:
        raise ValueError("invalid augment: " + "; ".join(problems))
    return a


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _resolve_augment(augment: dict[str, Any] | None, size: tuple[int, int]) -> dict[str, Any]:
    """``check_augment``, with the size-dependent defaults filled in."""
    a = check_augment(augment)
    if a["crop"] is None:
        a["crop"] = "pad" if max(size) <= 64 else "rrc"
    if a["padding"] is None:
        a["padding"] = max(1, min(size) // 8)
    a["scale"], a["ratio"] = tuple(a["scale"]), tuple(a["ratio"])
    return a


def _resized_size(h: int, w: int, size: tuple[int, int], crop_pct: float, squash: bool = False) -> tuple[int, int]:
    """timm's eval resize: shorter side to size / crop_pct (torchvision ``Resize(int)`` sizes, or timm's
    ``ResizeKeepRatio`` for non-square sizes); with ``squash`` (timm's crop_mode "squash") both sides to
    size / crop_pct, whatever the aspect ratio: the whole photo is seen, stretched."""
    ch, cw = size
    if squash:
        return math.floor(ch / crop_pct), math.floor(cw / crop_pct)
    if ch == cw:
        s = math.floor(ch / crop_pct)
        return (int(s * h / w), s) if w <= h else (s, int(s * w / h))
    ratio = min(h / math.floor(ch / crop_pct), w / math.floor(cw / crop_pct))
    return round(h / ratio), round(w / ratio)


def _crop_region(
    h: int, w: int, size: tuple[int, int], crop_pct: float, squash: bool = False
) -> tuple[int, int, tuple[float, ...]]:
    """What ``CenterCrop(size)`` keeps of the resized image: its (height, width) and the same region as a box
    (left, top, right, bottom) in the original image's pixels."""
    sh, sw = _resized_size(h, w, size, crop_pct, squash)
    ch, cw = size
    top = round((sh - ch) / 2.0) if sh > ch else 0  # torchvision's CenterCrop offsets
    left = round((sw - cw) / 2.0) if sw > cw else 0
    oh, ow = min(ch, sh), min(cw, sw)
    return oh, ow, (left * w / sw, top * h / sh, (left + ow) * w / sw, (top + oh) * h / sh)


def _resize_center_crop(
    img: Image.Image | torch.Tensor, size: tuple[int, int], crop_pct: float, interpolation: str, squash: bool = False
) -> Image.Image | torch.Tensor:
    """timm's eval geometry: shorter side (``squash``: both sides) to size / crop_pct, then
    ``CenterCrop(size)`` (zero-padding if smaller)."""
    h, w = (img.height, img.width) if isinstance(img, Image.Image) else img.shape[-2:]
    ch, cw = size
    sh, sw = _resized_size(h, w, size, crop_pct, squash)
    if isinstance(img, torch.Tensor):
        if (sh, sw) != (h, w):
            img = TF.resize(img, [sh, sw], interpolation=_INTERPOLATION[interpolation], antialias=True)
        return TF.center_crop(img, [ch, cw])
    if sh * sw <= 1 << 24:  # the usual case: exactly timm's resize, then crop
        return TF.center_crop(img.resize((sw, sh), PIL_RESAMPLE[interpolation]), [ch, cw])
    # Extreme aspect ratios (a 1x20000 strip would become 248x5 million pixels): resample only the region
    # the crop keeps. Same sampling positions and filter; only the rounding between PIL's two passes may differ.
    oh, ow, box = _crop_region(h, w, size, crop_pct, squash)
    img = img.resize((ow, oh), PIL_RESAMPLE[interpolation], box=box)
    return img if (oh, ow) == (ch, cw) else TF.center_crop(img, [ch, cw])


def _random_pad_crop(x: torch.Tensor, padding: int) -> torch.Tensor:
    """Zero-pad each side by ``padding`` and crop back at a random offset, per image of the batch
    (torchvision's ``RandomCrop(size, padding)``, vectorised)."""
    if padding == 0:
        return x
    B, _, H, W = x.shape
    # every crop position as a view (B, C, 2p+1, 2p+1, H, W); pick one per image
    windows = torch.nn.functional.pad(x, (padding,) * 4).unfold(2, H, 1).unfold(3, W, 1)
    dy, dx = torch.randint(0, 2 * padding + 1, (2, B)).to(x.device)
    return windows[torch.arange(B, device=x.device), :, dy, dx]


def _random_hflip(x: torch.Tensor) -> torch.Tensor:
    flip = (torch.rand(x.shape[0]) < 0.5).to(x.device)[:, None, None, None]
    return torch.where(flip, x.flip(-1), x)


def build_mixup(
    num_classes: int,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    label_smoothing: float = 0.1,
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None:
    """timm's batch Mixup/CutMix, or None when both alphas are 0.

    ``x, y_soft = mixup(x, y)`` on a normalised batch (even batch size: drop the last partial batch) gives
    soft targets (label smoothing included) for ``timm.loss.SoftTargetCrossEntropy``.
    """
    if mixup_alpha <= 0 and cutmix_alpha <= 0:
        return None
    from timm.data import Mixup

    return Mixup(
        mixup_alpha=mixup_alpha,
        cutmix_alpha=cutmix_alpha,
        prob=prob,
        switch_prob=switch_prob,
        label_smoothing=label_smoothing,
        num_classes=num_classes,
    )
