"""Where the model looked: relevance maps, and the primitives they are made of.

Relevance maps (all batched, all read from ``model(x, return_attention=True)``: no hooks)

- ``attention_rollout``: Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020).
  Each layer's attention, heads fused, plus the identity for the residual path, rows renormalised:
  ``Â_l = (A_l + I) / rowsum(A_l + I)``; the rollout is ``Â_L ... Â_1`` and the map is the read-out
  token's row of it over the patch tokens.
- ``gradient_rollout``: Chefer, Gur & Wolf, "Generic Attention-model Explainability for Interpreting
  Bi-Modal and Encoder-Decoder Transformers" (ICCV 2021), its LRP-free update rule for self-attention:
  ``Ā_l = E_h[(∇A_l ⊙ A_l)^+]``, ``R = I``, ``R <- R + Ā_l R`` for l = 1..L, where ``∇A_l`` is the
  gradient of the target class's logit with respect to layer l's attention probabilities; the map is read
  from ``R - I`` (``weighted_rollout``), what reached each patch through attention.
- ``attention_maps``: one layer's raw attention (one head, or the mean over heads).
- ``centre_gaussian_map``: a Gaussian centred on the token grid, the same for every image: the baseline
  a map must beat where objects sit in the middle of the frame (CIFAR-10, centre crops).
- ``rise``: Petsiuk, Das & Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box Models"
  (BMVC 2018): the expected class probability when a pixel is kept under random smooth masks. Needs
  only the output (it explains a hybrid's CNN too) at the cost of hundreds of forward passes per image;
  pixel-resolution maps.

Conventions shared by all maps:

- The read-out row is what the classifier reads (eq. 4): the class token's row (token 0) for
  ``global_pool='token'``; for average-pooled models (``global_pool='avg'``, with or without a class
  token) the mean of the patch tokens' rows, since the head reads the mean of the patch tokens.
- Only the row is propagated: ``e^T Â_L ... Â_1`` is a vector-matrix chain from the last layer down,
  O(T^2) per layer instead of the O(T^3) of the full matrix product, so the maps cost little more than
  the forward pass that produces the attentions. Arithmetic is float32 whatever the model's dtype.
- Any number of prefix tokens (``model.num_prefix_tokens``) is dropped from the read-out columns; the
  token grid is ``ceil(H / stride), ceil(W / stride)`` with ``stride = model.config.feature_stride``
  (hybrids pad 'same'), so non-square inputs work.
- Maps are (B, grid_h, grid_w) float32, divided by their per-image maximum (so the largest entry is 1
  and ratios between patches are kept; an all-zero map stays zero). ``attention_maps`` returns the
  raw probabilities instead; ``rise`` returns (B, H, W) maps at the input's resolution, shifted to
  minimum 0 before the division (its relevance is a probability with a floor, not a share).
- Inputs are model-ready tensors (resized and normalised with ``model.config.mean/std``). The model is
  put in eval mode for the call and restored afterwards; parameters' ``.grad`` is never touched.

On attentions already computed (a caller that keeps one forward pass, like the app, maps it again without
running the model): ``fuse_heads``, ``discard_lowest``, ``rollout`` (the rollout of any query row: the
read-out row gives ``attention_rollout``'s map, a patch's one-hot row where that patch's attention flows),
``attention_rollout_from`` and ``attention_maps_from``.

``vit_core.explain.faithfulness`` scores maps, ``vit_core.methods`` lists them for the app and the benchmarks, and
``vit_core.explain.inspection`` holds the paper's figure 7 (what the model learned, not where it looked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

MapFn = Callable[[nn.Module, torch.Tensor], torch.Tensor]

HEAD_FUSIONS = ("mean", "max", "min")

CENTRE_SIGMA = 0.25  # centre_gaussian_map's σ, a fraction of each side of the token grid
RISE_MASKS, RISE_CELLS, RISE_P_KEEP = 500, 4, 0.5  # rise's defaults: masks per image, grid side, kept share


# -------------------------------------------------------------------------------------- helpers


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode for the duration (dropout off, so maps are deterministic), then every module's own
    flag restored, not just the root's."""
    training = [m for m in model.modules() if m.training]
    for m in training:
        m.training = False
    try:
        yield
    finally:
        for m in training:
            m.training = True


def token_grid(model: nn.Module, images: torch.Tensor) -> tuple[int, int]:
    """The token grid (rows, columns) of ``model`` on ``images`` (B, C, H, W): ceil(side / stride), as hybrids
    pad 'same'."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"expected a batch of images shaped (B, C, H, W), got {shape}; add a batch dim with x[None]")
    stride = model.config.feature_stride
    return -(-images.shape[-2] // stride), -(-images.shape[-1] // stride)


def _attentions(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], tuple[int, int]]:
    """Logits, per-layer attention probabilities and token grid, checked against each other."""
    grid = token_grid(model, images)
    logits, attns = model(images, return_attention=True)
    expected = model.num_prefix_tokens + grid[0] * grid[1]
    if attns[0].shape[-1] != expected:
        raise ValueError(
            f"attention has {attns[0].shape[-1]} tokens but a {grid[0]}x{grid[1]} grid with "
            f"{model.num_prefix_tokens} prefix token(s) makes {expected}; is model.config.feature_stride right?"
        )
    return logits, attns, grid


def readout_row(model: nn.Module, batch: int, tokens: int, device: torch.device) -> torch.Tensor:
    """(B, T) weights of the row the classifier reads: e_0 (class token), or the mean of the patch
    tokens' rows for average-pooled models."""
    prefix = model.num_prefix_tokens
    v = torch.zeros(batch, tokens, device=device)
    if getattr(model.config, "global_pool", "token") == "avg":
        v[:, prefix:] = 1.0 / (tokens - prefix)
    else:
        v[:, 0] = 1.0
    return v


def weighted_rollout(readout: torch.Tensor, cams: Sequence[torch.Tensor]) -> torch.Tensor:
    """The read-out row of ``R - I`` (B, T) float32 for ``R = (I + Ā_L) ... (I + Ā_1)``, ``cams`` the layers' Ā
    (B, T, T) last first (Chefer et al.'s ``R <- R + Ā_l R``, ICCV 2021 eq. 6-7): what reached each token through
    attention. For a class token the identity has no patch column anyway; averaged patch rows would give every
    patch the same 1/N, swamping Ā (a photo's Chefer et al. map read 0.9999 to 1). With ``v = r + d``,
    ``d <- d + (r + d) Ā_l`` keeps the identity's share apart, exactly."""
    r = readout.float()
    d = torch.zeros_like(r)
    for cam in cams:
        d = d + torch.bmm((r + d).unsqueeze(1), cam.float()).squeeze(1)
    return d


def to_map(row: torch.Tensor, prefix: int, grid: tuple[int, int]) -> torch.Tensor:
    """(B, T) row -> (B, h, w) map over the patch tokens, divided by its per-image maximum."""
    m = row[:, prefix:].reshape(-1, *grid)
    return m / m.amax(dim=(1, 2), keepdim=True).clamp_min(torch.finfo(m.dtype).tiny)


def target_classes(target: int | Sequence[int] | torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
    """(B,) class indices: the prediction (None), one class for all, or one per image."""
    B, C = logits.shape
    if target is None:
        return logits.argmax(dim=-1)
    t = torch.as_tensor(target, device=logits.device).long().reshape(-1)
    if t.numel() == 1:
        t = t.expand(B)
    if t.numel() != B:
        raise ValueError(f"target has {t.numel()} classes for {B} images; pass None, one int, or one per image")
    if t.min() < 0 or t.max() >= C:
        raise ValueError(f"target classes must lie in [0, {C}), got {t.tolist()}")
    return t


# ------------------------------------------------------------------ on attentions already computed


def fuse_heads(attn: torch.Tensor, head_fusion: str) -> torch.Tensor:
    """One layer's attention (B, heads, T, T) with its heads fused by ``head_fusion`` (``"mean"``, ``"max"``
    or ``"min"``): (B, T, T) float32."""
    attn = attn.float()
    if head_fusion == "mean":
        return attn.mean(dim=1)
    return attn.amax(dim=1) if head_fusion == "max" else attn.amin(dim=1)


def discard_lowest(fused: torch.Tensor, ratio: float, prefix: int) -> torch.Tensor:
    """Zero the lowest ``ratio`` of each (T, T) matrix's entries, never a prefix token's attention to
    itself (as vit-explain keeps the class token's own entry, so its row never empties)."""
    B, T, _ = fused.shape
    k = int(T * T * ratio)
    if k == 0:
        return fused
    lowest = fused.reshape(B, T * T).topk(k, dim=-1, largest=False).indices
    drop = torch.zeros(B, T * T, dtype=torch.bool, device=fused.device).scatter_(1, lowest, True)
    drop[:, torch.arange(prefix, device=fused.device) * (T + 1)] = False
    return fused.masked_fill(drop.reshape(B, T, T), 0.0)


def rollout(
    attentions: Sequence[torch.Tensor],
    rows: torch.Tensor,
    prefix: int,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
) -> torch.Tensor:
    """Query rows carried down the attention rollout: ``rows^T Â_L ... Â_1`` (B, T) float32, over the layers'
    attentions (B, heads, T, T), first layer first.

    Per layer, as Abnar & Zuidema (2020): heads fused (``fuse_heads``), the lowest ``discard_ratio`` of the
    entries zeroed (``discard_lowest``, ``prefix`` tokens' own entries kept), the identity added for the
    residual path and rows renormalised, ``Â_l = (A_l + I) / rowsum(A_l + I)``. ``rows`` (B, T) is any row:
    the read-out row gives ``attention_rollout``, a token's one-hot row where that token's attention flows."""
    v = rows.float()
    for attn in reversed(attentions):
        a = discard_lowest(fuse_heads(attn, head_fusion), discard_ratio, prefix)
        # v^T (A + I) / rowsum(A + I): scale v by the row norms, then one vector-matrix product.
        u = v / (a.sum(dim=-1) + 1.0)
        v = torch.bmm(u.unsqueeze(1), a).squeeze(1) + u
    return v


def attention_rollout_from(
    model: nn.Module,
    attentions: Sequence[torch.Tensor],
    grid: tuple[int, int],
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
) -> torch.Tensor:
    """``attention_rollout`` of attentions already computed (``model(x, return_attention=True)``) on a token
    ``grid`` of (grid_h, grid_w): (B, grid_h, grid_w) maps in [0, 1]. ``model`` is not run: it says which
    row the classifier reads and how many prefix tokens there are."""
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    depth = len(attentions)
    if not 0 <= start_layer < depth:
        raise ValueError(f"start_layer must be in [0, {depth}) for this {depth}-layer model, got {start_layer}")
    B, _, T, _ = attentions[0].shape
    prefix = model.num_prefix_tokens
    readout = readout_row(model, B, T, attentions[0].device)
    return to_map(rollout(attentions[start_layer:], readout, prefix, head_fusion, discard_ratio), prefix, grid)


def attention_maps_from(
    model: nn.Module,
    attentions: Sequence[torch.Tensor],
    grid: tuple[int, int],
    layer: int = -1,
    head: int | None = None,
) -> torch.Tensor:
    """``attention_maps`` of attentions already computed, on a token ``grid``: (B, grid_h, grid_w) attention
    probabilities of the read-out row at ``layer``, for one ``head`` or their mean (None)."""
    depth = len(attentions)
    if not -depth <= layer < depth:
        raise ValueError(f"layer must be in [-{depth}, {depth}) for this {depth}-layer model, got {layer}")
    heads = attentions[layer].shape[1]
    if head is not None and not 0 <= head < heads:
        raise ValueError(f"head must be None (mean) or in [0, {heads}), got {head}")
    attn = attentions[layer].float()
    attn = attn.mean(dim=1) if head is None else attn[:, head]
    B, T, _ = attn.shape
    row = torch.bmm(readout_row(model, B, T, attn.device).unsqueeze(1), attn).squeeze(1)
    return row[:, model.num_prefix_tokens :].reshape(B, *grid)


# ------------------------------------------------------------------------------- relevance maps


def attention_rollout(
    model: nn.Module,
    images: torch.Tensor,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention rollout (Abnar & Zuidema 2020): (B, grid_h, grid_w) maps in [0, 1].

    Per layer l >= ``start_layer``: fuse the heads (``"mean"``, ``"max"`` or ``"min"``), optionally zero
    the lowest ``discard_ratio`` of the fused matrix (keeping prefix tokens' own entries), add the
    identity for the residual path and renormalise each row to sum 1. The map is the read-out row of
    ``Â_L ... Â_start`` over the patch tokens (see the module docstring), divided by its maximum.
    ``return_logits=True`` returns ``(logits, maps)`` from the same forward pass.
    """
    with eval_mode(model), torch.no_grad():
        logits, attns, grid = _attentions(model, images)
        maps = attention_rollout_from(model, attns, grid, head_fusion, discard_ratio, start_layer)
    return (logits, maps) if return_logits else maps


def gradient_rollout(
    model: nn.Module,
    images: torch.Tensor,
    target: int | Sequence[int] | torch.Tensor | None = None,
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Gradient-weighted attention rollout (Chefer et al. 2021, the LRP-free self-attention rule):
    (B, grid_h, grid_w) maps in [0, 1] for ``target`` (None: each image's predicted class; an int;
    or one class per image).

    ``Ā_l = mean_heads(clamp(∂y_t/∂A_l ⊙ A_l, min=0))``, ``R = (I + Ā_L) ... (I + Ā_1)``, map = the
    read-out row of ``R - I`` over the patch tokens (``weighted_rollout``: the same as R's for a class token;
    for average pooling the identity would add the same 1/N to every patch). ``y_t`` is the target logit. One
    backward pass serves the whole batch: images do not interact in a ViT, so the gradient of the summed target
    logits with respect to image b's attention is that of image b's own logit. ``return_logits=True`` returns
    ``(logits, maps)`` from the same forward pass.
    """
    prefix = model.num_prefix_tokens
    # inference_mode(False)/enable_grad: work even when called under no_grad or inference_mode.
    # The input requires grad so the attentions are in the graph even when every parameter is frozen.
    with eval_mode(model), torch.inference_mode(False), torch.enable_grad():
        x = images.detach().clone().requires_grad_(True)
        logits, attns, grid = _attentions(model, x)
        t = target_classes(target, logits)
        score = logits.gather(1, t[:, None]).sum()
        # Gradients for exactly these tensors, paired by position: grads[l] = d score / d attns[l].
        grads = torch.autograd.grad(score, attns)
    B, _, T, _ = attns[0].shape
    cams = [
        (grad.detach().float() * attn.detach().float()).clamp(min=0).mean(dim=1)
        for attn, grad in zip(reversed(attns), reversed(grads), strict=True)
    ]
    maps = to_map(weighted_rollout(readout_row(model, B, T, attns[0].device), cams), prefix, grid)
    return (logits.detach(), maps) if return_logits else maps


def attention_maps(
    model: nn.Module, images: torch.Tensor, layer: int = -1, head: int | None = None, return_logits: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Raw attention of the read-out token over the patch tokens at one layer: (B, grid_h, grid_w)
    softmax probabilities, not rescaled. ``layer`` indexes the blocks (negative counts from the end; the
    last by default); ``head=None`` averages the heads. ``return_logits=True`` returns ``(logits, maps)``."""
    with eval_mode(model), torch.no_grad():
        logits, attns, grid = _attentions(model, images)
        maps = attention_maps_from(model, attns, grid, layer, head)
    return (logits, maps) if return_logits else maps


def centre_gaussian_map(model: nn.Module, images: torch.Tensor, sigma: float = CENTRE_SIGMA) -> torch.Tensor:
    """A map that ignores the image: a 2D Gaussian centred on the token grid, (B, grid_h, grid_w) float32
    with maximum 1, the same for every image (a ``MapFn`` for ``deletion_insertion_auc``).

    Objects in CIFAR-10 (and in centre-cropped photos) sit in the middle of the frame, so "the centre
    matters most" already scores well on deletion/insertion; a relevance map has to beat this to show it
    finds the image's own evidence. ``sigma`` is a fraction of each side of the grid: the default, a
    quarter, puts the middle of each edge at exp(-2) ≈ 0.14 of the peak. Deletion and insertion only use
    the order of the pixels, which for a centred Gaussian is (up to the bilinear upsampling) the distance
    from the centre whatever ``sigma``; it matters for display.
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0 (a fraction of the grid side), got {sigma}")
    h, w = token_grid(model, images)
    rows = (torch.arange(h, device=images.device, dtype=torch.float32) - (h - 1) / 2) / (sigma * h)
    cols = (torch.arange(w, device=images.device, dtype=torch.float32) - (w - 1) / 2) / (sigma * w)
    g = torch.exp(-0.5 * (rows[:, None] ** 2 + cols[None, :] ** 2))
    return (g / g.amax()).expand(images.shape[0], h, w).clone()


def rise_masks(
    n: int, size: tuple[int, int], cells: int = RISE_CELLS, p_keep: float = RISE_P_KEEP, seed: int = 0
) -> torch.Tensor:
    """RISE's random masks (Petsiuk et al. 2018, section 3.2): (n, 1, H, W) float32 in [0, 1].

    Each mask starts as a ``cells`` x ``cells`` grid of independent Bernoulli(``p_keep``) cells, is upsampled
    bilinearly to ``(cells + 1)`` cells of ``ceil(side / cells)`` pixels and cropped to ``size`` at a random
    offset of less than one cell, so that the kept regions are smooth and fall anywhere, not only on a grid.
    The same ``seed`` gives the same masks on every machine (CPU generator)."""
    H, W = size
    ch, cw = -(-H // cells), -(-W // cells)
    g = torch.Generator().manual_seed(seed)
    grid = (torch.rand(n, 1, cells, cells, generator=g) < p_keep).float()
    up = F.interpolate(grid, size=((cells + 1) * ch, (cells + 1) * cw), mode="bilinear", align_corners=False)
    up = up.clamp_(0.0, 1.0)  # bilinear weights can sum to 1 + 1 ulp
    dy = torch.randint(0, ch, (n,), generator=g).tolist()
    dx = torch.randint(0, cw, (n,), generator=g).tolist()
    return torch.stack([up[i, :, y : y + H, x : x + W] for i, (y, x) in enumerate(zip(dy, dx, strict=True))])


def rise(
    model: nn.Module,
    images: torch.Tensor,
    target: int | Sequence[int] | torch.Tensor | None = None,
    n_masks: int = RISE_MASKS,
    cells: int = RISE_CELLS,
    p_keep: float = RISE_P_KEEP,
    batch_size: int = 64,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """RISE, randomized input sampling (Petsiuk et al., BMVC 2018): (B, H, W) maps in [0, 1] at the input's
    resolution, for ``target`` (None: each image's predicted class; an int; or one class per image).

    The model sees the image through ``n_masks`` random masks (``rise_masks``; masked pixels take zero,
    the dataset mean colour in normalised input space, as the deletion/insertion ``"mean"`` baseline), and
    each pixel's relevance is the expected probability of the target class when that pixel is kept,
    eq. (6): ``S(λ) = 1 / (E[M] N) Σ_i p_t(I ⊙ M_i) M_i(λ)``. The map is shifted to minimum 0 and divided
    by its maximum. It asks only for the model's output, no attention or gradient, so it explains the
    whole network (a hybrid's CNN included), and it costs ``n_masks`` forward passes per image.
    ``progress(done, total)`` is called after each batch of ``batch_size`` masked images (64: as fast as 256
    on a 2-core CPU for the bundled model, with a quarter of the activation memory: its peak RSS is about
    100 instead of 270 MB above the process's resting size).
    """
    if n_masks < 1 or cells < 1 or not 0.0 < p_keep < 1.0:
        raise ValueError(f"need n_masks >= 1, cells >= 1 and p_keep in (0, 1); got {n_masks}, {cells}, {p_keep}")
    B, _, H, W = images.shape
    masks = rise_masks(n_masks, (H, W), cells, p_keep, seed).to(images.device, images.dtype)
    out = torch.zeros(B, H, W, device=images.device, dtype=torch.float32)
    with eval_mode(model), torch.no_grad():
        t = target_classes(target, model(images))
        done, total = 0, B * n_masks
        for b in range(B):
            for m in masks.split(batch_size):
                p = model(images[b] * m).float().softmax(dim=-1)[:, t[b]]
                out[b] += torch.einsum("n,nhw->hw", p, m[:, 0].float())
                done += len(m)
                if progress is not None:
                    progress(done, total)
    out = out / (n_masks * p_keep)
    out = out - out.amin(dim=(1, 2), keepdim=True)
    return out / out.amax(dim=(1, 2), keepdim=True).clamp_min(torch.finfo(out.dtype).tiny)
