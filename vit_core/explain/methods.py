"""The explanation methods, one entry each: the table that the app, its API and the benchmarks read.

The app offers every method here in its Classify and Compare tabs and its API, the ``batchable`` ones in its
Batch tab (``webapp``); ``bench/explain_sanity.py`` scores each by its ``key``. Adding a method is one entry
below plus its function, which takes ``(model, images, **options)`` and returns (B, h, w) maps, as
``vit_core.explain``'s do: with ``target=`` (a class index, one per image, or None for each image's
prediction) when ``per_class``; with ``return_logits=True`` (then it returns the logits of its own forward
pass and the maps) when ``batchable``; with ``progress=`` (called with the work done and the total) when
``progress`` says what it counts.

What a map costs (``Cost``) decides where it runs. A map made from one forward and backward pass (gradient
rollout) costs about what a prediction does, which the limits on loading a model already bound; a map that
runs the model again and again (RISE: one forward pass per masked image) is held to a server's budget
(``webapp.inference.settings.MAP_BUDGET``).

What a caller that keeps one image's forward pass (the app's ``webapp.inference.analysis.Analysis``) keeps for a
method: the attentions, when it has ``from_attentions`` (the map is drawn again from them for each request,
without running the model); otherwise the map itself, one per class when ``per_class``.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import explain
from ..models.config import ViTConfig
from ..models.cost import forward_flops
from . import lrp


@dataclass(frozen=True)
class Cost:
    """What one map of one image costs, for one class when the map is per class, beyond the forward pass
    that makes the prediction."""

    forward: int = 0  # forward passes of the model on other inputs (RISE: one per masked image)
    backward: int = 0  # backward passes, each with the forward pass it differentiates

    def flops(self, cfg: ViTConfig) -> int:
        """Floating-point operations at ``cfg``'s input size, a backward pass with its forward pass counted as
        three forward passes (the usual estimate: a backward pass costs about twice its forward pass)."""
        return (self.forward + 3 * self.backward) * forward_flops(cfg)


@dataclass(frozen=True)
class Method:
    """One explanation method: what it is called, the function that computes it, and what it costs."""

    key: str  # its name in code and on the command line (bench/explain_sanity.py --methods)
    title: str  # its name in the app and the app's API
    fn: Callable[..., torch.Tensor]  # (model, images, **options) -> (B, h, w) maps: see the module docstring
    per_class: bool  # the map explains one class (fn takes target=); else it is the same for every class
    batchable: bool  # batched, a few passes per image, and fn takes return_logits=True: the Batch tab offers it
    cost: Cost
    description: str  # what it does, in one line of plain words with its paper: the app shows it where it is chosen
    options: tuple[str, ...] = ()  # fn's keywords that the app's settings give: layer, head, head_fusion, ...
    # fn on attentions already computed, (model, attentions, grid, **options) -> maps: no model pass at all
    from_attentions: Callable[..., torch.Tensor] | None = None
    progress: str | None = None  # what fn's progress= counts ("masked images"); None: fn takes no progress=

    @property
    def name(self) -> str:
        """The title without its parenthesis, for sentences and captions: "RISE", "Gradient rollout"."""
        return self.title.split(" (")[0]


RISE = Method(
    "rise",
    "RISE (random masks)",
    explain.rise,
    per_class=True,
    batchable=False,
    cost=Cost(forward=explain.RISE_MASKS),
    description="random masks over the image, each weighted by the score it leaves the class (Petsiuk et al. 2018)",
    progress="masked images",
)
ROLLOUT = Method(
    "rollout",
    "Attention rollout",
    explain.attention_rollout,
    per_class=False,
    batchable=True,
    cost=Cost(),
    description="how much each patch feeds the class token through all the layers, attention multiplied layer by "
    "layer; the same for every class (Abnar & Zuidema 2020)",
    options=("head_fusion", "discard_ratio"),
    from_attentions=explain.attention_rollout_from,
)
GRADIENT = Method(
    "gradient",
    "Gradient rollout",
    explain.gradient_rollout,
    per_class=True,
    batchable=True,
    cost=Cost(backward=1),
    description="rollout with each attention weighted by its gradient for the class (Chefer et al., ICCV 2021)",
)
RAW = Method(
    "attention",
    "Raw attention",
    explain.attention_maps,
    per_class=False,
    batchable=True,
    cost=Cost(),
    description="one layer's attention from the class token (or the mean token) to each patch, for one head or "
    "the mean of the heads; the same for every class",
    options=("layer", "head"),
    from_attentions=explain.attention_maps_from,
)

ATTNLRP = Method(
    "attnlrp",
    "AttnLRP",
    lrp.attnlrp,
    per_class=True,
    batchable=True,
    cost=Cost(backward=1),
    description="the class's score passed back through every layer, attention included, down to the patches, "
    "its total kept at each layer (Achtibat et al. 2024)",
)
CHEFER = Method(
    "chefer",
    "Chefer et al. (LRP x gradient)",
    lrp.chefer,
    per_class=True,
    batchable=True,
    cost=Cost(backward=1),
    description="LRP relevance of each layer's attention times its gradient for the class, accumulated through "
    "the layers (Chefer et al., CVPR 2021)",
)

METHODS = (RISE, ATTNLRP, ROLLOUT, GRADIENT, CHEFER, RAW)  # in the order the app lists them
# What the settings that methods take (``Method.options``) do, in the same plain words as the descriptions.
OPTIONS = {
    "layer": "whose attention raw attention shows: 0 is the first layer, nearest the pixels",
    "head": "one attention head of that layer, or the mean of them all",
    "head_fusion": "how each layer's heads are combined before rollout: their mean, max or min",
    "discard_ratio": "share of each layer's weakest attention links dropped before rollout (0: keep them all)",
}


def by_title(title: str) -> Method:
    """The method the app and its API call ``title``; ``ValueError`` naming the choices otherwise."""
    for m in METHODS:
        if m.title == title:
            return m
    raise ValueError(f"method must be one of {', '.join(m.title for m in METHODS)}, got {reprlib.repr(title)}")
