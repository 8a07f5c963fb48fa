"""Relevance propagation through a ViT: AttnLRP and Chefer et al.'s transformer attribution.

Layer-wise relevance propagation (LRP; Bach et al. 2015) hands the explained logit back through the
network layer by layer, each layer splitting the relevance of its outputs among its inputs by a rule.
Two methods here, both batched (one target class per image), CPU or CUDA, any class:

- ``attnlrp``: Achtibat et al., "AttnLRP: Attention-Aware Layer-Wise Relevance Propagation for
  Transformers" (ICML 2024). Relevance of every pixel, through the transformer and a hybrid's CNN stem:
  the map is each token's cell of the image, holding its pixels' positive relevance.
- ``chefer``: Chefer, Gur & Wolf, "Transformer Interpretability Beyond Attention Visualization" (CVPR 2021),
  their "transformer attribution": each layer's attention weighted by LRP relevance times gradient,
  ``Ā_l = E_h[(∇A_l ⊙ R_{A_l})^+]``, rolled out with the identity for the residual path, ``R = (I + Ā_L) ...
  (I + Ā_1)``, read at the classifier's row of ``R - I`` as ``explain.gradient_rollout`` does.

The rules, as gradients, are ``lrp_rules``' (its docstring has their table).

The forward pass below is the model's own (``model.py``, ``hybrid.py``) written out with the rules; the test
suite holds its logits equal to ``model(x)``. Relevance is conserved where the rules are: the ε-, γ-, z⁺-,
identity and uniform rules pass on all of it (biases, position embeddings and the class token keep what the
ε- and γ-rules give them; the z⁺-rule drops a unit's relevance when none of its contributions is positive);
AttnLRP's softmax rule does not (prop. 3.1: its bias term absorbs the rest).

Maps follow ``explain``'s conventions: (B, grid_h, grid_w) float32 on the token grid (hybrids: ceil(side /
stride)), non-negative and divided by their maximum, for the class ``target`` (None: each image's
prediction). Inputs are model-ready; the model is in eval mode for the call; parameters' ``.grad`` is never
touched. Both need a ``VisionTransformer`` with a classifier head.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..models.hybrid import ConvStem, ResNetV2Stem, StdConv2dSame, WhiteningConv, pad_same
from . import eval_mode, readout_row, target_classes, to_map, token_grid, weighted_rollout
from .lrp_rules import ATTNLRP, CHEFER, Rules, gamma_conv, identity_rule, safe_div, uniform_product, with_gradient_of

# The γ-rule on convolutions: 0.1, the lowest of the AttnLRP authors' ViT sweep (0.1, 0.25, 100). On the speedrun
# hybrids it deletes and reveals the class evidence sooner than zennit's default 0.25 (README, "How AttnLRP's map
# was chosen"); 0 is the ε-rule, whose pixel relevance is noise of both signs.
CONV_GAMMA = 0.1

# ------------------------------------------------------------------- the forward pass, with rules


def _norm(rules: Rules, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The final norms are ``nn.Identity`` in the layout that does not use them."""
    return rules.layer_norm(norm, x) if isinstance(norm, nn.LayerNorm) else x


def _attention(
    rules: Rules, attn: nn.Module, x: torch.Tensor, rows: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.Attention`` (eq. 5-8) unfused: the probabilities A are a tensor of the graph. ``rows``: the
    output of the first ``rows`` tokens only (A stays whole)."""
    B, T, D = x.shape
    qkv = rules.linear(attn.qkv, x).reshape(B, T, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    a = rules.softmax(uniform_product(q * attn.scale, k.transpose(-2, -1)))
    out = uniform_product(a if rows is None else a[:, :, :rows], v).transpose(1, 2).reshape(B, -1, D)
    return rules.linear(attn.proj, out), a


def propagate(
    model: nn.Module, tokens: torch.Tensor, rules: Rules
) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Embedded tokens (B, T, D) -> (logits, each block's attention probabilities (B, heads, T, T), the
    pre-logit features (B, num_features)) through the blocks and head of ``model`` (eq. 2-4; call in eval mode:
    no dropout), whose backward pass is LRP under ``rules``: ``tokens ⊙ ∂logit/∂tokens`` is the tokens'
    relevance for that logit.

    A model that reads its class token (not average pooling) runs its last block's attention output and MLP on
    that token alone: no other token of the last block reaches the logits, so neither the values nor the
    relevance change, and the forward and backward passes skip about 6% of ViT-B/16's work."""
    x, attentions = tokens, []
    pooled = model.config.global_pool == "avg"
    for i, blk in enumerate(model.blocks):
        rows = 1 if not pooled and i == len(model.blocks) - 1 else None
        y, a = _attention(rules, blk.attn, _norm(rules, blk.norm1, x), rows)
        x = rules.add(x if rows is None else x[:, :rows], y)  # eq. 2
        h = rules.linear(blk.mlp.fc1, _norm(rules, blk.norm2, x))
        x = rules.add(x, rules.linear(blk.mlp.fc2, identity_rule(h, blk.mlp.act(h))))  # eq. 3
        attentions.append(a)
    x = _norm(rules, model.norm, x)
    # pooling is linear: its gradient is the ε-rule (the mean's relevance goes to each token in proportion)
    x = x[:, model.num_prefix_tokens :].mean(dim=1) if pooled else x[:, 0]
    x = _norm(rules, model.fc_norm, x)
    if isinstance(model.pre_logits, nn.Module) and hasattr(model.pre_logits, "fc"):
        x = rules.linear(model.pre_logits.fc, x)
        x = identity_rule(x, torch.tanh(x))
    if not isinstance(model.head, nn.Linear):
        raise ValueError("relevance propagation explains a class: the model needs a classifier head (num_classes > 0)")
    return rules.linear(model.head, x), attentions, x


def _conv(conv: nn.Conv2d, x: torch.Tensor, gamma: float) -> torch.Tensor:
    """A convolution of the patch embedding or a hybrid's CNN (``nn.Conv2d`` or ``hybrid.StdConv2dSame``)
    under the γ-rule."""
    if isinstance(conv, StdConv2dSame):
        x = pad_same(x, conv.kernel_size[0], conv.stride[0])
        return gamma_conv(x, conv.standardized_weight(), None, gamma, stride=conv.stride)
    if isinstance(conv, WhiteningConv):
        x = pad_same(x, conv.kernel_size[0], 1)
    return gamma_conv(x, conv.weight, conv.bias, gamma, stride=conv.stride, padding=conv.padding)


def _group_norm(norm: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """``hybrid.GroupNormAct`` with AttnLRP's norm rule (σ of each group held constant), then its ReLU."""
    g = x.reshape(x.shape[0], norm.num_groups, -1)
    mean = g.mean(dim=-1, keepdim=True)
    sigma = (g.var(dim=-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    linear = ((g - mean) / sigma.detach()).reshape_as(x) * norm.weight[:, None, None] + norm.bias[:, None, None]
    y = with_gradient_of(F.group_norm(x, norm.num_groups, norm.weight, norm.bias, norm.eps), linear)
    return F.relu(y) if norm.act else y


def _resnet(stem: ResNetV2Stem, x: torch.Tensor, gamma: float) -> torch.Tensor:
    """``hybrid.ResNetV2Stem`` with its convolutions under the γ-rule and its GroupNorms under AttnLRP's norm
    rule; max pooling, ReLU and the residual sums pass relevance by their gradients."""
    x = _group_norm(stem.stem.norm, _conv(stem.stem.conv, x, gamma))
    x = F.max_pool2d(pad_same(x, 3, 2, value=float("-inf")), 3, 2)
    for stage in stem.stages:
        for blk in stage.blocks:
            shortcut = x
            if blk.downsample is not None:
                shortcut = _group_norm(blk.downsample.norm, _conv(blk.downsample.conv, x, gamma))
            y = _group_norm(blk.norm1, _conv(blk.conv1, x, gamma))
            y = _group_norm(blk.norm2, _conv(blk.conv2, y, gamma))
            x = F.relu(_group_norm(blk.norm3, _conv(blk.conv3, y, gamma)) + shortcut)
    return x


def _conv_stem(stem: ConvStem, x: torch.Tensor, gamma: float) -> torch.Tensor:
    """``hybrid.ConvStem`` with its convolutions (the whitening one included) under the γ-rule; max pooling
    (winner takes all) and BatchNorm (affine in eval mode) pass relevance by their gradients, the activations
    (ReLU or GELU) by the identity rule."""
    if stem.whiten is not None:
        x = _conv(stem.whiten, x, gamma)
        x = identity_rule(x, stem.act(x))
    for layer in stem.layers:
        x = _conv(layer.conv, x, gamma)
        if layer.pool > 1:
            x = F.max_pool2d(x, layer.pool, ceil_mode=True)
        x = layer.norm(x)
        x = identity_rule(x, layer.act(x))
    return x


def _embed(model: nn.Module, images: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eq. 1 with AttnLRP's rules and the γ-rule on every convolution: images -> tokens (B, T, D)."""
    patch_embed = model.patch_embed
    x = images
    if isinstance(patch_embed.backbone, ResNetV2Stem):
        x = _resnet(patch_embed.backbone, x, gamma)
    elif isinstance(patch_embed.backbone, ConvStem):
        x = _conv_stem(patch_embed.backbone, x, gamma)
    return model.to_tokens(_conv(patch_embed.proj, x, gamma).permute(0, 2, 3, 1))


# ------------------------------------------------------------------------------------- maps


def attnlrp_forward(
    model: nn.Module, images: torch.Tensor, conv_gamma: float = CONV_GAMMA
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """AttnLRP's forward pass with its graph (call in eval mode, gradients enabled): ``(pixels, logits,
    attentions, pre-logit features)``, ``pixels`` the leaf ``images`` were copied to; ``pixels ⊙ ∂logit/∂pixels``
    is then every input value's relevance for that logit. The logits, attentions and features are the model's."""
    x = images.detach().clone().requires_grad_(True)
    logits, attentions, features = propagate(model, _embed(model, x, conv_gamma), ATTNLRP)
    return x, logits, attentions, features


def attnlrp_relevance(
    model: nn.Module,
    images: torch.Tensor,
    target: int | Sequence[int] | torch.Tensor | None = None,
    conv_gamma: float = CONV_GAMMA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AttnLRP relevance of every input value: ``(logits, relevance)``, relevance (B, C, H, W) float32, signed.

    AttnLRP's rules in the transformer, the γ-rule with ``conv_gamma`` on the convolutions (0: the ε-rule).
    One forward and one backward pass for the batch. Per image the relevance sums to the target logit less
    what the biases, position embeddings, class token and the softmax rule's bias term keep (module docstring).
    """
    token_grid(model, images)  # the shape check
    with eval_mode(model), torch.inference_mode(False), torch.enable_grad():
        x, logits, _, _ = attnlrp_forward(model, images, conv_gamma)
        t = target_classes(target, logits)
        # one backward for the batch: images do not interact, so each image's gradient is its own logit's
        (grad,) = torch.autograd.grad(logits.gather(1, t[:, None]).sum(), x)
    return logits.detach(), (x.detach() * grad).float()


def relevance_map(model: nn.Module, relevance: torch.Tensor) -> torch.Tensor:
    """AttnLRP's map of pixel relevance (B, C, H, W): (B, grid_h, grid_w) in [0, 1], the positive part (the
    evidence for the class) summed over the colour channels and over each token's ``stride x stride`` cell of
    the image, divided by the maximum. For a hybrid the relevance has gone through the CNN, so a cell is the
    pixels under its token, not the token's receptive field."""
    h, w = token_grid(model, relevance)
    s = model.config.feature_stride
    r = relevance.sum(dim=1).clamp(min=0)
    r = F.pad(r, (0, w * s - r.shape[-1], 0, h * s - r.shape[-2]))  # hybrids: the last cell may be partial
    cells = r.reshape(r.shape[0], h, s, w, s).sum(dim=(2, 4))
    return cells / cells.amax(dim=(1, 2), keepdim=True).clamp_min(torch.finfo(cells.dtype).tiny)


def attnlrp(
    model: nn.Module,
    images: torch.Tensor,
    target: int | Sequence[int] | torch.Tensor | None = None,
    conv_gamma: float = CONV_GAMMA,
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """AttnLRP (Achtibat et al., ICML 2024): (B, grid_h, grid_w) maps in [0, 1] for ``target`` (None: each
    image's predicted class; an int; or one class per image): ``relevance_map`` of ``attnlrp_relevance``.
    ``return_logits=True`` returns ``(logits, maps)``.
    """
    logits, relevance = attnlrp_relevance(model, images, target, conv_gamma)
    maps = relevance_map(model, relevance)
    return (logits, maps) if return_logits else maps


def chefer(
    model: nn.Module,
    images: torch.Tensor,
    target: int | Sequence[int] | torch.Tensor | None = None,
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chefer, Gur & Wolf's transformer attribution (CVPR 2021): (B, grid_h, grid_w) maps in [0, 1] for
    ``target`` (None: each image's predicted class; an int; or one class per image).

    ``Ā_l = mean_heads((∇A_l ⊙ R_{A_l})^+)``, ``R = (I + Ā_L) ... (I + Ā_1)``, map = the read-out row of
    ``R - I`` over the patch tokens (``explain.weighted_rollout``: their map for a class token; for average
    pooling the identity's 1/N on every patch would swamp Ā, whose entries are about 1e-6 of it), divided by
    its maximum. ``∇A_l`` is the plain gradient of the target logit; ``R_{A_l}`` the LRP relevance of the
    attention probabilities under their rules (``CHEFER``), starting from relevance 1 on the target class, as
    their ``relprop(one_hot)``. The CNN of a hybrid is run once and not explained (like every attention map).
    Two backward passes through the blocks: the gradient, then the relevance. ``return_logits=True`` returns
    ``(logits, maps)``.

    Their rules are sensitive to the input: the identity rule of a LayerNorm hands relevance to entries of the
    residual stream near 0, and the z-rule of the residual sum that made them divides by them. On the bundled
    model a photo re-saved as JPEG gets a map correlated 0.5 with the first (AttnLRP's LayerNorm rule in its
    place: 1.000), and their code's own 1e-9 offset in that division moves a map by 1e-3.
    """
    grid = token_grid(model, images)
    with eval_mode(model), torch.inference_mode(False), torch.enable_grad():
        with torch.no_grad():
            tokens = model.to_tokens(model.patch_embed(images.detach().clone()))
        # the gradient of the plain forward pass at the attention probabilities
        x = tokens.clone().requires_grad_(True)
        feats, attns = model.forward_blocks(x, return_attention=True)
        logits = model.forward_head(model.norm(feats))
        t = target_classes(target, logits)
        grads = torch.autograd.grad(logits.gather(1, t[:, None]).sum(), attns)
        # the relevance under Chefer et al.'s rules: R = 1 on the target, i.e. gradient 1 / z_t at the logit
        lrp_logits, lrp_attns, _ = propagate(model, x, CHEFER)
        z = lrp_logits.gather(1, t[:, None])
        seed = safe_div(torch.ones_like(z), z.detach())
        lrp_grads = torch.autograd.grad((z * seed).sum(), lrp_attns)
    B, _, T, _ = attns[0].shape
    cams = [  # Ā_l, last layer first; a ⊙ lrp_grad is R_{A_l}, the relevance of the attention probabilities
        (grad.detach().float() * a.detach().float() * lrp_grad.float()).clamp(min=0).mean(dim=1)
        for a, grad, lrp_grad in zip(reversed(lrp_attns), reversed(grads), reversed(lrp_grads), strict=True)
    ]
    maps = to_map(weighted_rollout(readout_row(model, B, T, attns[0].device), cams), model.num_prefix_tokens, grid)
    return (logits.detach(), maps) if return_logits else maps
