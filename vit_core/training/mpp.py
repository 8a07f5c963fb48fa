"""Masked patch prediction: the self-supervised pre-training of the paper's section 4.6 and appendix B.1.2.

Like BERT's masked language modelling, on patches: corrupt 50% of the patch embeddings, replacing each
corrupted one with a learnable [mask] embedding (80%), a random other patch's embedding (10%), or keeping
it unchanged (10%); then predict, from the encoder's output token at each corrupted position, the patch's
mean colour with 3 bits per channel: a 512-way classification (8 ** in_chans classes; 8 for grayscale).

The corruption acts on the patch embeddings x_p^i E, before the position embeddings are added (eq. 1), so
the model still knows where every patch is. After pre-training, ``mpp.vit`` is a plain VisionTransformer
(no head) whose checkpoint fine-tunes like any other (``python -m train --init RUN``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.model import VisionTransformer

MASK, RANDOM, KEEP = 1, 2, 3  # corruption kinds; 0: not corrupted


def patch_colour_targets(images: torch.Tensor, patch_size: int, bits: int = 3) -> torch.Tensor:
    """Class of each patch's mean colour: images (B, C, H, W) in [0, 1] -> (B, N) int64, patches in
    row-major order. Each channel's mean is quantised to ``bits`` bits, ``q = floor(mean * 2^bits)``; the
    class is ``r * 64 + g * 8 + b`` for RGB with 3 bits."""
    levels = 2**bits
    mean = F.avg_pool2d(images.float(), patch_size)  # (B, C, h, w)
    q = (mean * levels).floor().clamp_(0, levels - 1).long()
    index = torch.zeros_like(q[:, 0])
    for c in range(q.shape[1]):
        index = index * levels + q[:, c]
    return index.flatten(1)


def corrupt_patches(
    tokens: torch.Tensor,
    mask_token: torch.Tensor,
    mask_ratio: float = 0.5,
    probs: tuple[float, float, float] = (0.8, 0.1, 0.1),
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupt patch embeddings (B, N, D) as BERT corrupts words; returns (corrupted tokens, kind (B, N)).

    Exactly ``round(mask_ratio * N)`` positions per image are chosen uniformly; each chosen one becomes
    ``mask_token`` (kind MASK), a uniformly drawn *other* patch embedding of the batch (RANDOM), or stays
    (KEEP), with ``probs``. Unchosen positions have kind 0.
    """
    B, N, D = tokens.shape
    dev = tokens.device
    n_chosen = int(mask_ratio * N + 0.5)
    order = torch.rand(B, N, device=dev, generator=generator).argsort(dim=1)
    chosen = torch.zeros(B, N, dtype=torch.bool, device=dev).scatter_(1, order[:, :n_chosen], True)
    u = torch.rand(B, N, device=dev, generator=generator)
    kind = torch.where(u < probs[0], MASK, torch.where(u < probs[0] + probs[1], RANDOM, KEEP))
    kind = torch.where(chosen, kind, 0)
    # a uniform draw over the other B*N - 1 patches: skip over one's own index
    flat = tokens.reshape(B * N, D)
    own = torch.arange(B * N, device=dev)
    other = torch.randint(0, B * N - 1, (B * N,), device=dev, generator=generator)
    other = other + (other >= own).long()
    out = torch.where((kind == RANDOM).view(B, N, 1), flat[other].view(B, N, D), tokens)
    out = torch.where((kind == MASK).view(B, N, 1), mask_token.to(tokens.dtype).expand(B, N, D), out)
    return out, kind


class MaskedPatchPrediction(nn.Module):
    """A VisionTransformer wrapped for masked patch prediction: [mask] embedding + 8^C-way colour head.

    ``forward(images)`` takes images normalised as the ViT's config says and returns (logits (M, 8^C),
    targets (M,)) for the M corrupted patches of the batch; train with cross-entropy. The head reads the
    encoder's output token after the ViT's final norm (``norm``, or ``fc_norm`` with average pooling: both
    are per-token LayerNorms), so that norm is pre-trained too.
    """

    def __init__(
        self,
        vit: VisionTransformer,
        mask_ratio: float = 0.5,
        probs: tuple[float, float, float] = (0.8, 0.1, 0.1),
        bits: int = 3,
    ) -> None:
        super().__init__()
        cfg = vit.config
        if cfg.is_hybrid:
            raise ValueError("masked patch prediction needs pixel patches; hybrid (CNN stem) models have none")
        self.vit, self.mask_ratio, self.probs, self.bits = vit, mask_ratio, probs, bits
        self.mask_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        self.head = nn.Linear(cfg.embed_dim, (2**bits) ** cfg.in_chans)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("mean", torch.tensor(cfg.mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(cfg.std).view(1, -1, 1, 1), persistent=False)

    def no_weight_decay(self) -> set[str]:
        return {"mask_token"} | {f"vit.{name}" for name in self.vit.no_weight_decay()}

    def forward(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        vit = self.vit
        # targets from the unnormalised image in [0, 1]
        targets = patch_colour_targets(
            (images * self.std + self.mean).clamp(0, 1), vit.patch_embed.patch_size, self.bits
        )
        grid = vit.patch_embed(images)  # (B, h, w, D): x_p^i E
        B, h, w, D = grid.shape
        x, kind = corrupt_patches(grid.reshape(B, h * w, D), self.mask_token, self.mask_ratio, self.probs, generator)
        x, _ = vit.forward_blocks(vit.to_tokens(x.reshape(B, h, w, D)))  # eq. 1-3, with corrupted patches
        x = vit.fc_norm(vit.norm(x))[:, vit.num_prefix_tokens :]
        chosen = kind > 0
        return self.head(x[chosen]), targets[chosen]
