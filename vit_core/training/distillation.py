"""A fine-tune held to the model it started from: learning without forgetting (Li & Hoiem 2017), with
Hinton et al.'s (2015) distillation loss.

Fine-tuning a model on a few new images (photos of two of its classes, say) moves it on the images it
already knew: CIFAR-10's test accuracy drops. Holding it to its own starting answers where they were right
keeps those; where the starting model was wrong, the labels alone teach it.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


class Distilled(nn.Module):
    """``loss(z, y)`` plus ``weight`` T^2 KL(softmax(t / T) || softmax(z / T)) (Hinton et al. 2015, the T^2
    keeping the gradients' scale as T changes), t the starting model's logits, averaged over the labelled
    images that model classifies right. Images it got wrong, and outliers (no label), get ``loss`` only."""

    def __init__(self, loss: nn.Module, weight: float, temperature: float) -> None:
        super().__init__()
        self.loss, self.weight, self.temperature = loss, weight, temperature

    def forward(self, logits: torch.Tensor, target: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
        loss = self.loss(logits, target)
        kept = teacher_logits.argmax(-1) == target  # outliers' target (-1) is never an argmax
        if not kept.any():
            return loss
        t = self.temperature
        kl = F.kl_div(
            (logits[kept] / t).log_softmax(-1),
            (teacher_logits[kept] / t).log_softmax(-1),
            log_target=True,
            reduction="batchmean",
        )
        return loss + self.weight * t * t * kl


def frozen_copy(model: nn.Module) -> nn.Module:
    """The teacher: a copy of ``model`` as it is now, in eval mode, without gradients."""
    teacher = copy.deepcopy(model).eval()
    teacher.requires_grad_(False)
    return teacher
