"""Fine-tuning that fits its time budget: measure the model's speed here, then fine-tune the whole model, or
linear-probe then fine-tune the last blocks (LP-FT), or train the head alone on cached features.

LP-FT (Kumar et al., "Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution", ICLR
2022): first fit the new head on the frozen backbone's features (a linear probe), then fine-tune from that head,
which beats either alone when labelled images are few. The probe runs on features computed once per image and
view (the image, its mirror and random resized crops as augmentation copies), so it costs a few forward passes
whatever the model; what the budget leaves after them goes to fine-tuning as many of the last blocks as it can
give a few epochs. When even one block cannot have an epoch (ViT-B/16 on a CPU), the probe is the result, and the
cached features of the held-out images (and their mirrors) and of the training images calibrate it
(``FeatureNet``), with no further pass over the photos.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..data import Batches

FULL_EPOCHS = 5  # the epochs of whole-model fine-tuning a budget must afford for "full"
FT_EPOCHS = 2  # the epochs LP-FT's fine-tuning of the last blocks must be given
MAX_COPIES = (
    8  # augmentation copies of each training image the probe's features may have (the first two: plain, mirror)
)


@dataclass(frozen=True)
class Speed:
    """Seconds per image on this machine: a forward pass (eval, no gradients) and a training step (forward and
    backward of the whole model)."""

    forward_s: float
    train_s: float


@dataclass(frozen=True)
class Strategy:
    """How a fine-tuning spends its budget. ``name``: "full" (the whole model from a zero head, as the recipe
    says), "lp-ft" (a linear probe, then the last ``blocks`` blocks fine-tuned from its head) or "probe" (the
    head alone). ``copies``: feature copies of each training image for the probe (0 for "full"). ``reason``: one
    sentence saying why. ``steps``: the engine's optimizer steps the budget is expected to allow (0 for "probe").
    ``tta``: the views the calibration is fitted for (the image and its mirror, or where a probe cannot afford
    the held-out mirrors, the image alone)."""

    name: str
    blocks: int
    copies: int
    reason: str
    steps: int
    tta: str | None = "flip"


@torch.no_grad()
def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.forward_head(model.forward_features(x), pre_logits=True)


def measure_speed(model: nn.Module, image_hw: tuple[int, int], batch: int = 2) -> Speed:
    """Time ``model`` on ``batch`` random images: one forward to warm up, one timed forward, and one timed
    forward and backward (in eval mode, so that no normalisation statistics move; the gradients are dropped)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    x = torch.randn(batch, 3, *image_hw, device=device)
    _forward(model, x)
    t0 = time.perf_counter()
    _forward(model, x)
    forward = (time.perf_counter() - t0) / batch
    t0 = time.perf_counter()
    with torch.enable_grad():
        model(x).float().logsumexp(-1).sum().backward()
    train = (time.perf_counter() - t0) / batch
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return Speed(forward, max(train, forward))


def choose_strategy(
    speed: Speed, train_images: int, held_out: int, depth: int, budget_s: float, batch_size: int = 32
) -> Strategy:
    """The strategy for ``budget_s`` seconds of training: "full" when whole-model fine-tuning gets
    ``FULL_EPOCHS`` epochs (each with its evaluation of the held-out images); else LP-FT with the most last
    blocks that get ``FT_EPOCHS`` epochs after the probe's features (the image and its mirror) and after the
    calibration's passes (held-out images twice with mirrors, training images once); else the probe alone, with
    as many augmentation copies as the budget pays for (at least the image itself: one pass over every photo),
    and the held-out images' mirrors if it pays for them too."""
    f, t = speed.forward_s, speed.train_s
    full_epoch = train_images * t + held_out * f
    epochs = budget_s / full_epoch
    per_epoch = max(train_images // batch_size, 1)
    if epochs >= FULL_EPOCHS:
        steps = math.floor(epochs) * per_epoch
        return Strategy("full", depth, 0, f"whole-model fine-tuning affords {epochs:.0f} epochs here", steps)
    features = (2 * train_images + 2 * held_out) * f
    calibration = (train_images + 4 * held_out) * f
    left = budget_s - features - calibration
    for k in range(depth, 0, -1):
        epoch = train_images * (f + k / depth * (t - f)) + held_out * f
        if left >= FT_EPOCHS * epoch:
            reason = (
                f"whole-model fine-tuning would get {epochs:.1f} epochs, so a linear probe on cached features comes "
                f"first, then the last {k} of {depth} blocks get {left / epoch:.0f} epochs"
            )
            return Strategy("lp-ft", k, 2, reason, math.floor(left / epoch) * per_epoch)
    tta = "flip" if (train_images + 2 * held_out) * f <= budget_s else None
    held_cost = (2 if tta else 1) * held_out * f
    copies = max(1, min(MAX_COPIES, math.floor((budget_s - held_cost) / (train_images * f))))
    views = f"{copies} views of each photo" if copies > 1 else "one view of each photo"
    reason = (
        f"one training step takes {t:.2g} s an image here, too slow to fine-tune even the last block for "
        f"{FT_EPOCHS} epochs, so only the head trains, on cached features of the frozen model ({views})"
    )
    return Strategy("probe", 0, copies, reason, 0, tta)


@torch.no_grad()
def cache_features(
    model: nn.Module, dataset: Dataset, *, batch_size: int = 32, mirror: bool = False, desc: str = "features"
) -> torch.Tensor:
    """(N, D) float32: the pre-logit features of every image of ``dataset`` (its own transform: a training
    transform gives an augmented copy), in order; ``mirror``: of each image's horizontal mirror."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    for x, _ in tqdm(Batches(dataset, batch_size, device, train=False), desc=desc, leave=False):
        out.append(_forward(model, x.flip(-1) if mirror else x).float().cpu())
    model.train(was_training)
    return torch.cat(out)


def fit_probe(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, *, weight_decay: float = 1e-3, iters: int = 200
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (C, D), bias (C,)) of multinomial logistic regression on ``features`` (N, D): the mean
    cross-entropy plus ``weight_decay`` / 2 times the squared weights, minimised from zero by L-BFGS (strong
    Wolfe line search), full batch."""
    x, y = features.double(), labels
    w = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=iters, line_search_fn="strong_wolfe", tolerance_grad=1e-9)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(F.linear(x, w, b), y) + weight_decay / 2 * w.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach().float(), b.detach().float()


class FeatureNet(nn.Module):
    """A frozen model's head over its cached features, taking the place of the model where its calibration and
    evaluation (``evaluation.calibrate_model``, ``evaluation.evaluate``) read it: an "image" is the (D, 2) pair
    of the features of a photo and of its mirror, so that the mirror view those functions take (a flip of the
    last dimension) swaps the pair, and a view's features are the pair's first column."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.head, self.config, self.calibration = model.head, model.config, None

    def forward_features(self, pairs: torch.Tensor) -> torch.Tensor:
        return pairs[..., 0]

    def forward_head(self, features: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return features if pre_logits else self.head(features)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(pairs))


class FeaturePairs(Dataset):
    """Cached (plain, mirror) features with their labels, as a dataset of (D, 2) pairs for ``FeatureNet``."""

    transform = None

    def __init__(self, plain: torch.Tensor, mirror: torch.Tensor, labels: torch.Tensor) -> None:
        self.pairs, self.targets = torch.stack([plain, mirror], -1), labels

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.pairs[i], int(self.targets[i])
