"""Position embeddings on another token grid: ``resample_pos_embed`` (paper section 3.2, fine-tuning at a higher
resolution), used when a checkpoint is loaded at another ``img_size`` and when a model sees an image of another
size than its own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def resample_pos_embed(
    pos_embed: torch.Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
) -> torch.Tensor:
    """Resize learned position embeddings to a new token grid (paper section 3.2).

    The class token's embedding is kept as is; the patch embeddings, seen as a (D, h, w) image, are
    interpolated in 2D. The original JAX code zooms bilinearly (``scipy.ndimage.zoom(order=1)``); we
    default to bicubic with antialiasing, as timm does, so a checkpoint resized here and one resized by
    timm (on load or with ``dynamic_img_size``) are the same tensor, and logits match across the two.
    ``old_grid`` defaults to a square grid.
    """
    n_old = pos_embed.shape[1] - num_prefix_tokens
    if old_grid is None:
        side = math.isqrt(n_old)
        if side * side != n_old:
            raise ValueError(f"cannot infer a square grid from {n_old} position embeddings; pass old_grid")
        old_grid = (side, side)
    if tuple(old_grid) == tuple(new_grid):
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    dim = pos_embed.shape[-1]
    grid = grid.float().reshape(1, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(new_grid), mode=interpolation, antialias=interpolation != "nearest")
    grid = grid.permute(0, 2, 3, 1).reshape(1, -1, dim).to(pos_embed.dtype)
    return torch.cat([prefix, grid], dim=1)
