"""Does a relevance map point at what the model uses? Deletion and insertion (Petsiuk et al., "RISE", BMVC 2018).

``deletion_insertion_auc`` scores any map function (``vit_core.explain.MapFn``: ``(model, images) -> maps``):
pixels are removed, or revealed, in the map's order of relevance, and the probability of the class is
tracked. The removed pixels take a baseline: the dataset mean colour or the image under ``gaussian_blur``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import MapFn, attention_rollout, eval_mode, target_classes

BLUR_SIGMA = 0.25  # the blur baseline's σ, a fraction of each side of the image


def gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Gaussian blur of (B, C, H, W) images with standard deviation ``sigma`` x the side along each axis
    (the same share of the image whatever its size), reflect padding. The 1D kernel is torchvision's
    ``gaussian_blur`` kernel (radius ceil(3σ) px, here capped at side - 1, the most reflect padding
    allows), applied down then across: the separable form of the 2D Gaussian convolution, so that σ of
    tens of pixels stays cheap. Computed in at least float32; returned in the input's dtype."""
    out = images.to(torch.promote_types(images.dtype, torch.float32))
    for dim in (-2, -1):
        side = out.shape[dim]
        s = sigma * side
        r = min(math.ceil(3 * s), side - 1)
        k = torch.exp(-0.5 * (torch.arange(-r, r + 1, dtype=torch.float32, device=out.device) / s) ** 2)
        k = (k / k.sum()).expand(out.shape[1], 1, -1)
        if dim == -2:
            out = F.conv2d(F.pad(out, (0, 0, r, r), mode="reflect"), k[..., None], groups=out.shape[1])
        else:
            out = F.conv2d(F.pad(out, (r, r, 0, 0), mode="reflect"), k[:, :, None], groups=out.shape[1])
    return out.to(images.dtype)


def pixel_ranks(model: nn.Module, images: torch.Tensor, map_fn: MapFn) -> torch.Tensor:
    """(B, 1, H, W) rank of each pixel in ``map_fn``'s map upsampled to the image (0: the most relevant; ties in
    the map's order, first come first): the order in which deletion, insertion and ROAD remove pixels."""
    B, _, H, W = images.shape
    maps = map_fn(model, images).detach().float()
    if maps.ndim != 3 or maps.shape[0] != B:
        raise ValueError(f"map_fn must return (B, h, w) maps for {B} images, got {tuple(maps.shape)}")
    maps = F.interpolate(maps[:, None], size=(H, W), mode="bilinear", align_corners=False).reshape(B, H * W)
    order = maps.argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(H * W, device=order.device).expand(B, -1))
    return rank.reshape(B, 1, H, W)


def deletion_insertion_auc(
    model: nn.Module,
    images: torch.Tensor,
    map_fn: MapFn = attention_rollout,
    target: int | Sequence[int] | torch.Tensor | None = None,
    steps: int = 32,
    baseline: str = "mean",
    batch_size: int = 64,
) -> dict[str, torch.Tensor]:
    """Deletion and insertion scores of ``map_fn`` (Petsiuk et al., "RISE", BMVC 2018).

    ``map_fn(model, images)`` gives (B, h, w) maps (any resolution; upsampled bilinearly to the image).
    Pixels are ranked by relevance, most relevant first. Deletion replaces them with the baseline in
    ``steps`` equal steps, starting from the image; insertion reveals them on the baseline, starting
    from the baseline. At each of the ``steps + 1`` points we record the softmax probability of the
    target class (None: the prediction on the unperturbed image); the AUC is the trapezoid area under
    that curve over the fraction of pixels in [0, 1]. A good map has low deletion and high insertion AUC.

    ``baseline``: ``"mean"`` (zero in normalised input space, i.e. the dataset mean colour) or
    ``"blur"`` (the image under a Gaussian blur, as RISE's insertion, with σ = ``BLUR_SIGMA`` = a
    quarter of each side: 8 px at 32 px, 56 px at 224 px). RISE's σ = 5 px at 224 px, scaled to 0.7 px
    at 32 px, left a CIFAR-10 model most of its evidence; at a quarter of the side the class evidence is
    gone and only the image's colour layout is left (numbers in ``bench/explain_sanity.py``).

    Returns per-image ``deletion`` and ``insertion`` AUCs (B,) and the curves (B, steps + 1).
    """
    if baseline not in ("mean", "blur"):
        raise ValueError(f"baseline must be 'mean' or 'blur', got {baseline!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    B, _, H, W = images.shape
    with eval_mode(model), torch.no_grad():
        logits = model(images)
    t = target_classes(target, logits)
    rank = pixel_ranks(model, images, map_fn)
    base = torch.zeros_like(images) if baseline == "mean" else gaussian_blur(images, BLUR_SIGMA)
    counts = torch.round(torch.linspace(0, H * W, steps + 1, device=images.device)).long()

    def probability(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return model(x).float().softmax(dim=-1).gather(1, t[b][:, None]).squeeze(1)

    # The curves' ends are the image and the baseline whatever the map: one forward pass each, shared.
    everything = torch.arange(B, device=images.device)
    p_image = logits.float().softmax(dim=-1).gather(1, t[:, None]).squeeze(1)
    curves = {}
    with eval_mode(model), torch.no_grad():
        p_base = torch.cat([probability(base[b], b) for b in everything.split(batch_size)])
        for name, (start, end) in {"deletion": (images, base), "insertion": (base, images)}.items():
            probs = []
            n = B * (steps - 1)  # the inner points 1 .. steps - 1, image-major
            for i in range(0, n, batch_size):
                idx = torch.arange(i, min(i + batch_size, n), device=images.device)
                b, s = idx // (steps - 1), idx % (steps - 1) + 1
                changed = rank[b] < counts[s].reshape(-1, 1, 1, 1)  # the first counts[s] pixels by relevance
                probs.append(probability(torch.where(changed, end[b], start[b]), b))
            inner = torch.cat(probs).reshape(B, steps - 1) if probs else p_image.new_zeros(B, 0)
            first, last = (p_image, p_base) if name == "deletion" else (p_base, p_image)
            curves[name] = torch.cat([first[:, None], inner, last[:, None]], dim=1)
    auc = {k: (c.sum(dim=1) - (c[:, 0] + c[:, -1]) / 2) / steps for k, c in curves.items()}
    return {**auc, "deletion_curve": curves["deletion"], "insertion_curve": curves["insertion"]}
