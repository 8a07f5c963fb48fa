"""The first answer first: an image's top classes and an attention rollout from one forward pass, then the full
answer (the calibrated views, the OOD decision and AttnLRP's map) from what that pass left.

    first = answer.first_answer(model, x)            # one view: probabilities, attentions, rollout map
    full = answer.full_answer(model, x, first)       # = calibration.predict(model, x, return_attention=True),
                                                     #   and AttnLRP's map of the full answer's class

**What the first answer is.** The image alone (the first of the views ``calibration.predict`` averages), its
softmax divided by the model's temperature (fitted for the mixture of views, so for one view its confidences are
an approximation), and the attention rollout of that pass's attentions (Abnar & Zuidema 2020: nothing but the
pass is needed). ``FirstAnswer.views`` says how many views the full answer averages; a caller shows the first
answer as "from 1 of N views" and, where the full answer's class differs (``FullAnswer.changed``), says that it
changed rather than replacing it silently. The full answer is the library's answer, unchanged: its
probabilities and OOD decision equal ``calibration.predict``'s to float rounding.

**Work done once.** For a model without a CNN stem the first pass *is* AttnLRP's forward pass
(``lrp.propagate``: its values are the model's, its backward pass is LRP; Achtibat et al., ICML 2024), kept with
its graph: the full answer then runs the other views in one call (``calibration.view_outputs``) and AttnLRP's
backward pass only, for the class the full answer predicts (or the one asked for). For ViT-B/16 that pass costs
about 1.1 plain forward passes. A CNN stem's convolutions under the γ-rule cost two convolutions each (the
bundled model's AttnLRP forward pass: 2.7 plain passes), so there the first pass is the plain one with its
attentions, and AttnLRP runs whole in the full answer (``relevance=True`` forces the shared pass, ``False``
the plain one: a caller that shows another map passes ``False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..calibration import Prediction, calibrated_views, combine, temperature, tta_views, view_outputs
from . import attention_rollout_from, eval_mode, target_classes, token_grid
from .lrp import attnlrp, attnlrp_forward, relevance_map


@dataclass
class FirstAnswer:
    """One forward pass's answer for B images, and what the full answer reuses of it."""

    probs: torch.Tensor  # (B, C) float32: softmax(z / T) of the image alone, one of ``views`` views
    attentions: list[torch.Tensor]  # per block (B, heads, T, T), no graph
    rollout: torch.Tensor  # (B, grid_h, grid_w) attention rollout of those attentions, in [0, 1]
    views: int  # how many views the full answer averages (``calibration.calibrated_views``)
    logits: torch.Tensor  # (B, C) float32, this view's: the full answer's first view
    features: torch.Tensor  # (B, num_features) float32, this view's pre-logit features (the OOD score's)
    # AttnLRP's forward pass, kept for its backward pass: (the pixels it starts from, its logits); None when the
    # pass was the plain one, or once ``full_answer`` used it
    graph: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class FullAnswer:
    """The full answer for B images: ``calibration.predict``'s, and AttnLRP's map."""

    prediction: Prediction  # the calibrated views, the OOD decision, the first view's attentions
    relevance: torch.Tensor | None  # (B, grid_h, grid_w) AttnLRP maps in [0, 1]; None when not asked for
    target: torch.Tensor  # (B,) the class each map explains
    changed: torch.Tensor  # (B,) bool: the full answer's class is not the first answer's


def shares_forward(model: nn.Module) -> bool:
    """Whether AttnLRP's forward pass costs about a plain one, so the first answer can come from it: a model
    whose patches are pixels (no CNN stem under the γ-rule's two convolutions)."""
    return model.patch_embed.backbone is None


def first_answer(
    model: nn.Module, images: torch.Tensor, *, relevance: bool | None = None, **rollout: Any
) -> FirstAnswer:
    """The answer of one forward pass on ``images`` (B, C, H, W), model-ready: one view's probabilities, its
    attentions and their rollout (``rollout``: ``attention_rollout_from``'s options, its defaults when none).
    ``relevance``: keep AttnLRP's forward pass for ``full_answer`` (None: where ``shares_forward``)."""
    grid = token_grid(model, images)
    keep = shares_forward(model) if relevance is None else relevance
    graph = None
    with eval_mode(model):
        if keep:
            with torch.inference_mode(False), torch.enable_grad():
                x, logits, attentions, features = attnlrp_forward(model, images)
            graph = (x, logits)
            attentions = [a.detach() for a in attentions]
        else:
            with torch.no_grad():
                tokens, attentions = model.forward_features(images, return_attention=True)
                features = model.forward_head(tokens, pre_logits=True)
                logits = model.head(features)
    logits, features = logits.detach().float(), features.detach().float()
    return FirstAnswer(
        probs=(logits / temperature(model)).softmax(dim=-1),
        attentions=attentions,
        rollout=attention_rollout_from(model, attentions, grid, **rollout),
        views=len(tta_views(images, calibrated_views(model))),
        logits=logits,
        features=features,
        graph=graph,
    )


def full_answer(
    model: nn.Module,
    images: torch.Tensor,
    first: FirstAnswer,
    *,
    target: int | torch.Tensor | None = None,
    relevance: bool = True,
) -> FullAnswer:
    """The full answer for the ``images`` of ``first``: the other calibrated views in one call, their mixture
    and OOD decision with the first view's (``calibration.combine``), and with ``relevance`` AttnLRP's map for
    ``target`` (None: the full answer's class), from ``first``'s kept pass where it has one (its backward pass
    alone) or run whole. ``first``'s kept pass is released either way."""
    views = tta_views(images, calibrated_views(model))
    with eval_mode(model):
        logits, features = view_outputs(model, [v for v, _ in views[1:]])
    prediction = combine(
        model, [first.logits, *logits], [first.features, *features], [w for _, w in views], first.attentions
    )
    t = target_classes(target, prediction.probs)
    graph, first.graph = first.graph, None
    maps = None
    if relevance and graph is not None:
        x, lrp_logits = graph
        with torch.inference_mode(False), torch.enable_grad():
            (grad,) = torch.autograd.grad(lrp_logits.gather(1, t[:, None].to(lrp_logits.device)).sum(), x)
        maps = relevance_map(model, (x.detach() * grad).float())
    elif relevance:
        maps = attnlrp(model, images, t)
    changed = prediction.probs.argmax(dim=-1) != first.probs.argmax(dim=-1)
    return FullAnswer(prediction, maps, t, changed)
