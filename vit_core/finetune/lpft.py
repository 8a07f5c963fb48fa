"""The linear probe of LP-FT on cached features, and the cached features standing in for the frozen model.

LP-FT (Kumar et al., "Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution", ICLR
2022): first fit the new head on the frozen backbone's features (a linear probe), then fine-tune from that head,
which beats either alone when labelled images are few. The probe runs on features computed once per image and
view (the image and its mirror), so it costs a few forward passes whatever the model: the first stage of
``finetune.stages``. Where it stays the best stage (ViT-B/16 on a CPU, say), the cached features of the held-out
images (and their mirrors) and of the training images calibrate it (``FeatureNet``), with no further pass over the
photos.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from ..data import Batches


@torch.no_grad()
def _forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.forward_head(model.forward_features(x), pre_logits=True)


def forward_seconds(model: nn.Module, image_hw: tuple[int, int], batch: int = 8) -> float:
    """Seconds a forward pass of one image takes ``model`` here: one pass of ``batch`` random images to warm
    up, then the faster of two timed (a first pass after loading ran 5x slower here). Only a first estimate of
    what finishing a run takes (``finetune.budget``), before any photo is decoded; the probe's pass over every
    photo measures it again (``stages.probe``)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    x = torch.randn(batch, 3, *image_hw, device=device)
    _forward(model, x)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        _forward(model, x)
        times.append(time.perf_counter() - t0)
    model.train(was_training)
    return min(times) / batch


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
