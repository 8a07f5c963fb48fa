"""What a trained ViT learned: the analyses of the paper's figure 7 (Dosovitskiy et al., ICLR 2021).

- ``embedding_filters`` (left): the principal components of the patch projection's filters;
- ``position_embedding_similarity`` (centre): how alike the learned position embeddings of two patches are;
- ``mean_attention_distance`` (right, and figure 11): how far each head looks, layer by layer.

Each returns tensors; ``vit_core.figures`` draws them as the paper does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import eval_mode, token_grid


def embedding_filters(model: nn.Module, n: int = 28) -> torch.Tensor:
    """Principal components of the patch projection E's filters (paper fig. 7 left): (n, C, P, P).

    The D filters of E, flattened to C*P*P pixels, are centred and decomposed (SVD); rows are the
    components in order of explained variance. A component's sign is arbitrary; we make its entry of
    largest magnitude positive so results are reproducible.
    """
    if model.config.is_hybrid:
        raise ValueError("hybrid models embed CNN features, not pixels: their filters are not images")
    w = model.patch_embed.proj.weight.detach().float()  # (D, C, P, P)
    D, C, P, _ = w.shape
    if not 1 <= n <= min(D, C * P * P):
        raise ValueError(f"n must be in [1, {min(D, C * P * P)}] for {D} filters of {C}x{P}x{P} pixels, got {n}")
    flat = w.reshape(D, -1)
    _, _, vh = torch.linalg.svd(flat - flat.mean(dim=0), full_matrices=False)
    comps = vh[:n]
    sign = comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)).sign()
    return (comps * sign).reshape(n, C, P, P)


def position_embedding_similarity(model: nn.Module) -> torch.Tensor:
    """Cosine similarity between the learned position embeddings of the patches (paper fig. 7 centre):
    (h, w, h, w), entry [i, j] is the (h, w) map of patch (i, j)'s similarity to every patch."""
    h, w = model.patch_embed.grid_size
    pos = model.pos_embed.detach()[0, -h * w :].float()  # the patches' entries come after any prefix tokens'

    pos = F.normalize(pos, dim=-1)
    return (pos @ pos.T).reshape(h, w, h, w)


def mean_attention_distance(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Mean attention distance in pixels (paper fig. 7 right and fig. 11): (depth, heads).

    For each query patch, the distance between its centre and every key patch's centre, weighted by
    the attention probability, averaged over query patches and images. Prefix tokens have no place in
    the image: they are left out as queries, and each query's attention over the patch keys is
    renormalised to sum 1 (otherwise mass on the class token would count as distance 0).
    """
    prefix = model.num_prefix_tokens
    grid = token_grid(model, images)
    with eval_mode(model), torch.no_grad():
        _, attns = model(images, return_attention=True)
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    centres = torch.stack([rows, cols], dim=-1).reshape(-1, 2).float() * model.config.feature_stride
    dist = torch.cdist(centres, centres).to(attns[0].device)  # (N, N) pixels
    out = []
    for attn in attns:
        a = attn[:, :, prefix:, prefix:].float()
        a = a / a.sum(dim=-1, keepdim=True)
        out.append(torch.einsum("bhqk,qk->bhq", a, dist).mean(dim=(0, 2)))
    return torch.stack(out)
