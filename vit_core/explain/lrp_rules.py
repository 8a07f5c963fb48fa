"""Layer-wise relevance propagation's rules, each a modified gradient: AttnLRP's and Chefer et al.'s (``lrp``
runs the model's forward pass with them).

**LRP as modified gradients.** A rule is implemented as the gradient of a surrogate: every operation keeps
its forward value and gets a backward pass chosen so that, with ``R = value ⊙ gradient`` at each tensor,
the gradient step *is* the rule (the "gradient x input" form of LRP: Arras et al. 2025; the efficient mode of
the AttnLRP authors' ``lxt``). One forward and one backward pass then give the relevance of every tensor at
once, and the input's relevance is ``input ⊙ gradient``. The rules:

============================  ==========================================  =====================================
operation                     AttnLRP                                     Chefer et al.
============================  ==========================================  =====================================
linear layer                  ε-rule (eq. 8, ε = 0): the plain gradient;  z⁺-rule (LRP-α1β0): positive
                              the bias keeps its share                    contributions only, no bias share
convolution (patch embedding, γ-rule, γ = ``CONV_GAMMA``: contributions   (not reached: the map stops at
a hybrid's CNN)               of the output's sign count 1 + γ times      the first block's attention)
LayerNorm / GroupNorm         linear in x, σ held constant (prop. 3.4)    identity: ``R_in = R_out`` per entry
GELU, tanh, ReLU              identity (eq. 9): ``R_in = R_out``          identity
softmax                       Taylor at x with bias (prop. 3.1):          identity
                              ``R_in = x ⊙ (R - s Σ R)``, its gradient
q kᵀ and A v                  uniform (prop. 3.2): each operand gets      the same (their ``cam /= 2``)
                              half, the ε-rule within
residual sum                  ε-rule: proportional to each summand        proportional, then rescaled per
                                                                          image so that the branches share
                                                                          ``R`` as ``|ΣR_a| : |ΣR_b|``
max pooling, BatchNorm (eval) the gradient: winner takes all; affine      (not reached)
============================  ==========================================  =====================================

The transformer's rules are the paper's. On convolutions the AttnLRP authors use the γ-rule for ViTs (their
``lxt`` examples: zennit's ``Gamma`` on ``Conv2d``), as LRP does for the lower layers of CNNs (Montavon et al.
2019): the ε-rule there gives pixel relevance dominated by noise of both signs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def with_gradient_of(value: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:
    """``value`` in the forward pass, ``surrogate``'s gradient in the backward pass (the two are equal
    in value, or ``surrogate`` is the rule's linearisation at this point)."""
    return value.detach() + (surrogate - surrogate.detach())


def safe_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b, and 0 where b is 0 (relevance with no path to follow is dropped, as LRP implementations do).
    For values only (ratios that are detached, backward rules): the unused branch may hold inf."""
    return torch.where(b == 0, 0.0, a / b)


class _UniformProduct(torch.autograd.Function):
    """``a @ b`` whose backward pass hands each operand half of the plain gradient: the uniform rule."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        g = 0.5 * g
        return g @ b.transpose(-2, -1), a.transpose(-2, -1) @ g


def uniform_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` under the uniform rule for a bilinear product (AttnLRP prop. 3.2): each operand takes half of
    the product's relevance, the ε-rule within, i.e. half the plain gradient. One Function, not the surrogate
    ``(0.5 a + (0.5 a).detach()) @ (0.5 b + (0.5 b).detach())``: the same gradient, without its six
    elementwise passes over the attention's tensors."""
    return _UniformProduct.apply(a, b)


class _Identity(torch.autograd.Function):
    """``y = f(x)``, given both; the backward pass multiplies by ``y / x`` (0 where x is 0)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(safe_div(y, x))
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return g * ratio, None


def identity_rule(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Identity rule for y = f(x) of the same shape (AttnLRP eq. 9): R_x = R_y entry by entry, i.e. the
    gradient y / x in place of f'(x). One Function: the surrogate ``y.detach() + x * (y / x).detach() - ...``
    took four more elementwise passes. Only ``x`` gets a gradient (``f`` is elementwise)."""
    return _Identity.apply(x, y.detach())


def _epsilon_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """ε-rule with ε = 0 (AttnLRP eq. 8): ``R_x = x ⊙ Wᵀ (R / z)``, which is the plain gradient times x;
    the bias keeps ``b ⊙ R / z``."""
    return layer(x)


def _zplus_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """z⁺-rule (LRP-α1β0, Chefer et al.'s ``Linear.relprop`` with alpha = 1): only positive contributions
    count, ``R_x = x⁺ ⊙ W⁺ᵀ S + x⁻ ⊙ W⁻ᵀ S`` with ``S = R / z⁺``, ``z⁺ = W⁺ x⁺ + W⁻ x⁻`` and no bias."""
    z = layer(x)
    w_pos, w_neg = layer.weight.clamp(min=0), layer.weight.clamp(max=0)
    z_pos = F.linear(x.clamp(min=0), w_pos) + F.linear(x.clamp(max=0), w_neg)
    # gradient (z / z⁺) ∂z⁺/∂x: with R = z ⊙ g at the output, x ⊙ gradient is the rule above
    return with_gradient_of(z, z_pos * safe_div(z, z_pos).detach())


def gamma_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gamma: float, **conv: object
) -> torch.Tensor:
    """Generalised γ-rule (Montavon et al. 2019, "Layer-Wise Relevance Propagation: An Overview"; zennit's
    ``Gamma``) for ``z = conv2d(x, W, b)``: contributions of the output's sign count 1 + γ times. For z > 0 the
    rule's pre-activation is ``z↑ = conv(x⁺, W + γW⁺, b + γb⁺) + conv(x⁻, W + γW⁻)``, for z < 0 ``z↓ =
    conv(x⁺, W + γW⁻, b + γb⁻) + conv(x⁻, W + γW⁺)``, and ``R_x = x ⊙ ∂z↑/∂x ⋅ R / z↑`` (resp. z↓). γ = 0 is the
    ε-rule (z↑ = z↓ = z). Signed inputs (normalised pixels) are allowed."""
    if gamma == 0:
        return F.conv2d(x, weight, bias, **conv)
    # With P = conv(x⁺, W⁺) + conv(x⁻, W⁻), the positive contributions, and N = conv(x, W) - P the negative ones,
    # z↑ = conv(x, W) + γP + b + γb⁺ and z↓ = conv(x, W) + γN + b + γb⁻: one extra pair of convolutions, not four,
    # and after a ReLU (x⁻ = 0) one convolution with W and W⁺ stacked.
    if bool((x < 0).any()):
        z_nobias = F.conv2d(x, weight, None, **conv)
        positive = F.conv2d(x.clamp(min=0), weight.clamp(min=0), None, **conv)
        positive = positive + F.conv2d(x.clamp(max=0), weight.clamp(max=0), None, **conv)
    else:
        z_nobias, positive = F.conv2d(x, torch.cat([weight, weight.clamp(min=0)]), None, **conv).chunk(2, dim=1)
    z = z_nobias if bias is None else z_nobias + bias[:, None, None]
    up = z > 0
    # the contributions of the output's own sign, P where z > 0 and N elsewhere, count 1 + γ times: z↑ or z↓
    rule = z_nobias + gamma * torch.where(up, positive, z_nobias - positive)
    if bias is not None:
        b_up = (bias + gamma * bias.clamp(min=0))[:, None, None]
        b_down = (bias + gamma * bias.clamp(max=0))[:, None, None]
        rule = rule + torch.where(up, b_up, b_down)
    return with_gradient_of(z, rule * safe_div(z, rule).detach())


class _LayerNormLinear(torch.autograd.Function):
    """LayerNorm's value (PyTorch's kernel), with the gradient of ``(x - mean) / σ ⊙ w + b`` at σ held
    constant: ``(w ⊙ g - mean(w ⊙ g)) / σ``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        sigma = (x.var(dim=-1, unbiased=False, keepdim=True) + eps).sqrt()
        ctx.save_for_backward(weight, sigma)
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None, torch.Tensor | None, None]:
        weight, sigma = ctx.saved_tensors
        wg = g * weight
        # the shift b is an additive constant: its gradient is the plain one, for its share of the relevance
        bias = g.reshape(-1, g.shape[-1]).sum(0) if ctx.needs_input_grad[2] else None
        return (wg - wg.mean(dim=-1, keepdim=True)) / sigma, None, bias, None


def _layer_norm_linear(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """AttnLRP's LayerNorm (prop. 3.4): ``(x - mean) / σ ⊙ w + b`` with σ held constant, so the layer is
    linear in x (the ε-rule through the centring, the identity rule through the division by σ). Its gradient is
    written out (``_LayerNormLinear``): the norm runs once, not once for its value and again for a surrogate.
    The shift b gets its plain gradient (its share of the relevance), the scale w none."""
    return _LayerNormLinear.apply(x, norm.weight, norm.bias, norm.eps)


def _layer_norm_identity(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """Chefer et al.'s LayerNorm (``RelProp.relprop`` returns R): the identity rule, entry by entry."""
    return identity_rule(x, norm(x))


def _softmax_taylor(scores: torch.Tensor) -> torch.Tensor:
    """AttnLRP's softmax (prop. 3.1, Taylor expansion at the input with a bias): ``R_in = x ⊙ (R - s Σ R)``,
    which is exactly x times softmax's own gradient at ``R / s``: no change needed."""
    return scores.softmax(dim=-1)


def _softmax_identity(scores: torch.Tensor) -> torch.Tensor:
    """Chefer et al.'s softmax: the identity rule."""
    return identity_rule(scores, scores.softmax(dim=-1))


class _ShareByBranch(torch.autograd.Function):
    """Chefer et al.'s ``Add.relprop`` for ``a + b``: each entry's relevance split in proportion to its
    contributions (the z-rule), then each branch rescaled, per image, so that the two share the total
    relevance as ``|ΣR_a| : |ΣR_b|``. A backward rule that needs sums of the backward's own values, hence a
    Function; it returns gradients ``g ⋅ factor`` so that ``a ⊙ gradient`` is the rescaled relevance."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return a + b

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        dims = tuple(range(1, g.ndim))
        r_a, r_b = (a * g).sum(dims, keepdim=True), (b * g).sum(dims, keepdim=True)
        share_a = safe_div(r_a.abs(), r_a.abs() + r_b.abs())
        total = r_a + r_b
        return g * safe_div(share_a * total, r_a), g * safe_div((1 - share_a) * total, r_b)


def _add_proportional(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


@dataclass(frozen=True)
class Rules:
    """The rules in which AttnLRP and Chefer et al. differ (the module docstring's table); the identity rule
    on activations and the uniform rule on the attention's products are common to both."""

    linear: Callable[[nn.Linear, torch.Tensor], torch.Tensor]
    layer_norm: Callable[[nn.LayerNorm, torch.Tensor], torch.Tensor]
    softmax: Callable[[torch.Tensor], torch.Tensor]
    add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


ATTNLRP = Rules(linear=_epsilon_linear, layer_norm=_layer_norm_linear, softmax=_softmax_taylor, add=_add_proportional)
CHEFER = Rules(
    linear=_zplus_linear, layer_norm=_layer_norm_identity, softmax=_softmax_identity, add=_ShareByBranch.apply
)
