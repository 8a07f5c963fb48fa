"""ROAD, RemOve And Debias (Rong, Leemann, Borisov, Kasneci & Kasneci, "A Consistent and Efficient Evaluation
Strategy for Attribution Methods", ICML 2022): scores for relevance maps, less biased by what the removal
itself looks like.

Deletion and insertion (``faithfulness.deletion_insertion_auc``) replace pixels with a constant or a blur; the
shape of the replaced region then carries information of its own (the paper's "class information leakage":
a model can read the class off the mask) and the images leave the training distribution, so the score mixes
the map's faithfulness with the model's reaction to the filling. ROAD fills removed pixels by noisy linear
imputation instead: each removed pixel is the weighted mean of its eight neighbours (1/6 for the four direct
ones, 1/12 for the diagonals; neighbours outside the image are left out), all removed pixels solved jointly,
plus Gaussian noise of σ = 0.01 of the pixel range, which hides the mask's outline. The imputation here is
the paper's linear system (their ``NoisyLinearImputer``), solved by preconditioned conjugate gradients on the
whole batch at once instead of a sparse direct solver; the test suite checks it against a dense solve of the
system built entry by entry.

Two orders, as the paper: MoRF (most relevant pixels removed first; a faithful map makes the probability fall
fast: lower is better) and LeRF (least relevant first; it should stay high: higher is better). Each score is
the probability of the target class averaged over the removal fractions (10%, 20%, ..., 90%).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import MapFn, eval_mode, target_classes
from .faithfulness import pixel_ranks

ROAD_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ROAD_NOISE = 0.01  # the imputation noise's σ, a fraction of the pixel range [0, 1] (the paper's)

# The paper's neighbour weights (their ``neighbors_weights``): 1/6 direct, 1/12 diagonal, summing to 1.
_NEIGHBOURS = torch.tensor([[1 / 12, 1 / 6, 1 / 12], [1 / 6, 0.0, 1 / 6], [1 / 12, 1 / 6, 1 / 12]])


def noisy_linear_imputation(
    images: torch.Tensor,
    removed: torch.Tensor,
    noise: torch.Tensor | float = 0.0,
    generator: torch.Generator | None = None,
    tol: float = 1e-5,
    max_iter: int = 2000,
) -> torch.Tensor:
    """Fill the ``removed`` pixels (N, 1, H, W) bool of ``images`` (N, C, H, W) as ROAD does.

    The removed values x solve, per channel, ``s_i x_i - Σ_{j removed} w_ij x_j = Σ_{j kept} w_ij v_j`` at each
    removed pixel i, where ``w_ij`` are the neighbour weights and ``s_i = Σ_j w_ij`` over the neighbours inside
    the image: each removed pixel is the weighted mean of its neighbours. The matrix is symmetric and, with at
    least one pixel kept, positive definite, so conjugate gradients (Jacobi-preconditioned) converge; they stop
    when every system's residual is below ``tol`` times its right-hand side's norm. ``noise`` (a float or one σ
    per channel, in the images' units) is added to the filled pixels. Kept pixels are returned unchanged.
    """
    N, C, H, W = images.shape
    if removed.shape != (N, 1, H, W):
        raise ValueError(f"removed must be shaped {(N, 1, H, W)}, got {tuple(removed.shape)}")
    x0 = images.float().reshape(N * C, 1, H, W)
    m = removed.to(x0.dtype).repeat_interleave(C, dim=0)
    k = _NEIGHBOURS.to(x0.device, x0.dtype)[None, None]

    def neighbours(u: torch.Tensor) -> torch.Tensor:  # Σ_j w_ij u_j, zero outside the image
        return F.conv2d(u, k, padding=1)

    s = neighbours(torch.ones(1, 1, H, W, device=x0.device, dtype=x0.dtype))

    def system(u: torch.Tensor) -> torch.Tensor:  # the matrix applied to u (u is zero on kept pixels)
        return (s * u - neighbours(u)) * m

    b = neighbours(x0 * (1 - m)) * m
    x = torch.zeros_like(b)
    r = b.clone()
    z = r / s
    p = z.clone()
    rz = (r * z).sum(dim=(1, 2, 3), keepdim=True)
    b_norm = b.flatten(1).norm(dim=1).clamp_min(torch.finfo(x0.dtype).tiny)
    for _ in range(max_iter):
        if (r.flatten(1).norm(dim=1) <= tol * b_norm).all():
            break
        q = system(p)
        alpha = rz / (p * q).sum(dim=(1, 2, 3), keepdim=True).clamp_min(torch.finfo(x0.dtype).tiny)
        x = x + alpha * p
        r = r - alpha * q
        z = r / s
        rz, rz_old = (r * z).sum(dim=(1, 2, 3), keepdim=True), rz
        p = z + rz / rz_old.clamp_min(torch.finfo(x0.dtype).tiny) * p
    filled = x.reshape(N, C, H, W)
    sigma = torch.as_tensor(noise, dtype=x0.dtype, device=x0.device).reshape(-1, 1, 1)
    if (sigma > 0).any():
        filled = filled + sigma * torch.randn(filled.shape, generator=generator, device="cpu").to(filled.device)
    return torch.where(removed, filled.to(images.dtype), images)


def road(
    model: nn.Module,
    images: torch.Tensor,
    map_fn: MapFn,
    target: int | Sequence[int] | torch.Tensor | None = None,
    fractions: Sequence[float] = ROAD_FRACTIONS,
    noise: float = ROAD_NOISE,
    batch_size: int = 64,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """ROAD scores of ``map_fn`` (Rong et al., ICML 2022): per-image ``morf`` (lower is better) and ``lerf``
    (higher is better), each the mean over ``fractions`` of the target class's probability, and the curves
    ``morf_curve`` / ``lerf_curve`` (B, len(fractions)).

    ``map_fn(model, images)`` gives (B, h, w) maps, upsampled bilinearly to the image and ranked as in
    ``faithfulness.deletion_insertion_auc`` (ties in the map's order, first come first). ``target`` None explains
    the prediction on the unperturbed image. Images are model-ready (normalised with ``model.config.mean`` /
    ``std``), so the imputation noise is ``noise / std`` per channel; ``seed`` fixes it.
    """
    if not fractions or not all(0.0 < f < 1.0 for f in fractions):
        raise ValueError(f"fractions must lie in (0, 1), got {list(fractions)}")
    B, _, H, W = images.shape
    with eval_mode(model), torch.no_grad():
        t = target_classes(target, model(images))
    rank = pixel_ranks(model, images, map_fn)
    sigma = noise / torch.tensor(model.config.std, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    counts = [round(f * H * W) for f in fractions]
    curves = {}
    with eval_mode(model), torch.no_grad():
        for name in ("morf", "lerf"):
            # every (image, fraction) pair is one imputed image: image-major, in batches
            pairs = [(b, n) for b in range(B) for n in counts]
            probs = []
            for i in range(0, len(pairs), batch_size):
                b = torch.tensor([p[0] for p in pairs[i : i + batch_size]], device=images.device)
                n = torch.tensor([p[1] for p in pairs[i : i + batch_size]], device=images.device).reshape(-1, 1, 1, 1)
                removed = rank[b] < n if name == "morf" else rank[b] >= H * W - n
                x = noisy_linear_imputation(images[b], removed, sigma, g)
                probs.append(model(x).float().softmax(dim=-1).gather(1, t[b][:, None]).squeeze(1))
            curves[name] = torch.cat(probs).reshape(B, len(counts))
    return {**{k: c.mean(dim=1) for k, c in curves.items()}, **{f"{k}_curve": c for k, c in curves.items()}}
