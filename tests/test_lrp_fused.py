"""AttnLRP's fused rules and shortened last block against the rules as they were first written: surrogates whose
gradient is the rule (``value.detach() + (surrogate - surrogate.detach())``), every block on every token. The
relevance and the maps must be the same up to float rounding, for every kind of model ``test_lrp`` builds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vit_core.explain import eval_mode, lrp, lrp_rules, target_classes

from .test_lrp import KINDS, image, make_model


def _surrogate(value: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:
    return value.detach() + (surrogate - surrogate.detach())


def _half(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x + (0.5 * x).detach()


def _identity(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _surrogate(y, x * lrp_rules.safe_div(y, x).detach())


def _layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    sigma = (x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
    return _surrogate(norm(x), (x - mean) / sigma.detach() * norm.weight + norm.bias)


def _reference_propagate(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The logits of the blocks and head as first written with AttnLRP's rules: every token through every block."""

    def norm(n: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return _layer_norm(n, x) if isinstance(n, nn.LayerNorm) else x

    x = tokens
    for blk in model.blocks:
        attn, y = blk.attn, norm(blk.norm1, x)
        B, T, D = y.shape
        q, k, v = attn.qkv(y).reshape(B, T, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        a = ((_half(q) * attn.scale) @ _half(k).transpose(-2, -1)).softmax(dim=-1)
        x = x + attn.proj((_half(a) @ _half(v)).transpose(1, 2).reshape(B, T, D))
        h = blk.mlp.fc1(norm(blk.norm2, x))
        x = x + blk.mlp.fc2(_identity(h, blk.mlp.act(h)))
    x = norm(model.norm, x)
    x = x[:, model.num_prefix_tokens :].mean(dim=1) if model.config.global_pool == "avg" else x[:, 0]
    x = norm(model.fc_norm, x)
    if hasattr(model.pre_logits, "fc"):
        x = model.pre_logits.fc(x)
        x = _identity(x, torch.tanh(x))
    return model.head(x)


def _reference_relevance(model: nn.Module, images: torch.Tensor, target, gamma: float, monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(lrp, "identity_rule", _identity)  # the CNN stems' activations, as first written
    with eval_mode(model), torch.enable_grad():
        x = images.clone().requires_grad_(True)
        logits = _reference_propagate(model, lrp._embed(model, x, gamma))
        t = target_classes(target, logits)
        (grad,) = torch.autograd.grad(logits.gather(1, t[:, None]).sum(), x)
    monkeypatch.undo()
    return x.detach() * grad


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("gamma", [0.0, lrp.CONV_GAMMA])
def test_fused_attnlrp_is_the_relevance_as_first_written(kind, gamma, monkeypatch):
    model = make_model(**KINDS[kind])
    x = image(model)
    for target in (None, [0, 3, 4]):
        want = _reference_relevance(model, x, target, gamma, monkeypatch)
        logits, got = lrp.attnlrp_relevance(model, x, target, conv_gamma=gamma)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
        with torch.no_grad():
            torch.testing.assert_close(logits, model(x), rtol=1e-5, atol=1e-5)
