"""What a request asks a map to be drawn with, checked against the model, and which methods this server runs.

Requests are untrusted: a request's map settings are read once into ``MapSettings`` (the page's controls and the
API's parameters alike), carried whole, and checked against the model once (``MapSettings.checked``, through
``parse_settings``), which gives ``Settings`` or a ``ValueError`` that names the bad value and the valid range;
``Settings`` key the analysis's cache of maps (``analysis.map_key``). The methods are ``vit_core.methods``'s table;
this server runs a method that needs no forward pass beyond the prediction's (the attention maps; a backward pass)
for every model it loads, and one of many forward passes (RISE) when they fit ``MAP_BUDGET`` (``affordable``); the
default method, ``DEFAULT_METHOD`` unless the server was started with another (``--default-method``), is one it
always runs. The methods built on LRP carry the notice of its authors (``LRP_NOTICE``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import torch

from vit_core import VisionTransformer, ViTConfig, explain, methods
from vit_core.explain import lrp
from vit_core.explain.methods import Method

from ..errors import quote

# What the forward passes of one map may cost (RISE: explain.RISE_MASKS of them), in FLOPs: the bundled model's
# RISE (500 x 0.50 GFLOP) measured 1.0 s a map on a 2-core CPU; on a GPU, ViT-L/16 at 384 px fits.
MAP_BUDGET = {"cpu": 3e11, "cuda": 2e14}
# The default map (bench/results/explain_cifar10_speedrun.md, 300 images): on the bundled model AttnLRP, one
# backward pass (1/43 of RISE's time there, 2 cores), scores better than RISE on all six deletion, insertion
# and ROAD scores, by 1.5-6 paired standard errors, and is the only map that beats the centre-Gaussian baseline under
# all three ways of removing pixels; on the previous bundle it was within 2.1 standard errors of RISE on each.
DEFAULT_METHOD = methods.ATTNLRP
PREDICTED = "(predicted class)"


def lrp_based() -> list[Method]:
    """The methods of the table built on layer-wise relevance propagation (``vit_core.explain.lrp``'s functions)."""
    return [m for m in methods.METHODS if m.fn.__module__ == lrp.__name__]


def lrp_notice() -> str:
    """What the LRP authors say of its use (the lxt package's README), shown where LRP-based maps are offered."""
    names = " and ".join(m.name for m in lrp_based())
    return (
        f"{names} are based on layer-wise relevance propagation (LRP). LRP's authors (the lxt package) state that "
        "LRP is a patented technology that may be used free of charge for personal and scientific purposes only."
    )


def legend(shown: Sequence[Method]) -> str:
    """What each method of ``shown`` does (its ``description`` in ``vit_core.methods``'s table), one line each as
    Markdown, for under the place they are chosen."""
    return "\n".join(f"- **{m.name}**: {m.description}" for m in shown)


def affordable(method: Method, model: VisionTransformer | ViTConfig, device: torch.device) -> bool:
    """Whether this server draws ``method``'s maps for ``model`` (or a model of that config): always when the
    map needs no forward pass beyond the prediction's (a backward pass costs about what the prediction does,
    which the limits on loading bound); when it needs more (RISE), if their FLOPs fit ``MAP_BUDGET`` on
    ``device``."""
    budget = MAP_BUDGET.get(device.type, MAP_BUDGET["cpu"])
    config = model if isinstance(model, ViTConfig) else model.config
    return method.cost.forward == 0 or method.cost.flops(config) <= budget


def refusal(method: Method, model: VisionTransformer, device: torch.device) -> str:
    """Why ``method`` is not run for ``model`` here, and what to choose instead (the default first)."""
    ordered = sorted(methods.METHODS, key=lambda m: m is not DEFAULT_METHOD)
    others = [m.title for m in ordered if m is not method and affordable(m, model, device)]
    choices = others[0] if len(others) == 1 else f"{', '.join(others[:-1])} or {others[-1]}"
    gflop = method.cost.flops(model.config) / 1e9
    return (
        f"{method.name} needs {method.cost.forward} forward passes of this model ({gflop:,.0f} GFLOP), more than "
        f"this server allows on its {device.type.upper()}; choose {choices}"
    )


@dataclass(frozen=True)
class Settings:
    """What a map is drawn with, checked against the model."""

    method: Method = DEFAULT_METHOD
    target: int | None = None  # class index; None: the predicted class
    layer: int = -1  # raw attention's block, from 0 (``parse_settings`` turns negative, from the end, into that)
    head: int | None = None  # None: mean over heads
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    opacity: float = 0.5

    def options(self) -> dict[str, object]:
        """The keywords of the method's function that these settings give (``Method.options``)."""
        return {name: getattr(self, name) for name in self.method.options}


def _integer(value: object, what: str) -> int:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a whole number, got {quote(value)}") from None
    if not math.isfinite(f) or f != int(f):
        raise ValueError(f"{what} must be a whole number, got {quote(value)}")
    return int(f)


def check_layer(model: VisionTransformer, layer: object) -> int:
    """A block index from 0 (the first) to depth - 1 (the last); negative counts from the end (-1: the last)."""
    depth = model.config.depth
    i = _integer(layer, "layer")
    if not -depth <= i < depth:
        raise ValueError(
            f"layer must be 0..{depth - 1} for this {depth}-layer model (0 = first), or -1..{-depth} from the end; "
            f"got {quote(layer)}"
        )
    return i % depth


def layer_name(layer: int, depth: int) -> str:
    """A block as the app names it everywhere (tabs, API, docs): numbered from 0, as in ``vit_core``, with the
    first and last said in words: "layer 11 (the last)"."""
    where = " (the last)" if layer == depth - 1 else " (the first)" if layer == 0 else ""
    return f"layer {layer}{where}"


def head_name(head: int | None) -> str:
    """A head as the app names it, numbered from 0 like layers: "head 2", or "mean of heads"."""
    return "mean of heads" if head is None else f"head {head}"


def check_head(model: VisionTransformer, head: object) -> int | None:
    if head in (None, "", "mean"):
        return None
    heads = model.config.num_heads
    i = _integer(head, "head")
    if not 0 <= i < heads:
        raise ValueError(f"head must be 'mean' or 0..{heads - 1}, got {quote(head)}")
    return i


def check_target(model: VisionTransformer, target: object) -> int | None:
    if target in (None, "", PREDICTED):
        return None
    names = model.class_names
    if target not in names:
        raise ValueError(f"{quote(target)} is not a class of this model; choose one of {', '.join(names[:20])}...")
    return names.index(target)  # type: ignore[arg-type]


def check_top_k(top_k: object, num_classes: int) -> int:
    """How many classes to list: at least 1, at most the model's classes."""
    k = _integer(top_k, "top-k")
    if k < 1:
        raise ValueError(f"top-k must be at least 1, got {quote(top_k)}")
    return min(k, num_classes)


def _unit(value: object, what: str, hi: float) -> float:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {quote(value)}") from None
    if not 0.0 <= f <= hi:
        raise ValueError(f"{what} must be in [0, {hi}], got {quote(value)}")
    return f


def parse_settings(
    model: VisionTransformer,
    method: Method | None = None,
    target: str | None = PREDICTED,
    layer: object = -1,
    head: object = "mean",
    head_fusion: str = "mean",
    discard_ratio: object = 0.0,
    opacity: object = 0.5,
) -> Settings:
    """Settings from a request's raw values (``method``: parsed from its title, ``webapp.ui.endpoints.Prepared``;
    None: the table's first); ``ValueError`` naming the bad one and the valid range."""
    chosen = methods.METHODS[0] if method is None else method
    if head_fusion not in explain.HEAD_FUSIONS:
        raise ValueError(f"head fusion must be one of {', '.join(explain.HEAD_FUSIONS)}, got {quote(head_fusion)}")
    return Settings(
        method=chosen,
        target=check_target(model, target),
        layer=check_layer(model, layer),
        head=check_head(model, head),
        head_fusion=head_fusion,
        discard_ratio=_unit(discard_ratio, "discard ratio", 0.99),
        opacity=_unit(opacity, "opacity", 1.0),
    )


@dataclass(frozen=True)
class MapSettings:
    """A request's map settings as sent (the page's controls or the API's parameters, by the API's names): read
    once, carried whole from the handler to the map, and checked once, against the model the request uses
    (``checked``). The defaults are the API's."""

    method: str | None = None  # a title of ``vit_core.methods``'s table; None: the server's default
    target: str | None = PREDICTED
    layer: object = -1
    head: object = "mean"
    head_fusion: str = "mean"
    discard_ratio: object = 0.0
    opacity: object = 0.5
    top_k: object = 5

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings' names: the API parameters (and page inputs) they are read from."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, values: Mapping[str, object]) -> MapSettings:
        """The settings among a request's ``values`` (by name); those it does not send at their defaults."""
        return cls(**{name: values[name] for name in cls.names() if name in values})

    def checked(self, model: VisionTransformer, method: Method) -> Settings:
        """The settings checked against ``model`` (``parse_settings``), drawing ``method`` (``self.method`` parsed,
        or a default: ``webapp.ui.endpoints.Prepared.checked``)."""
        return parse_settings(
            model, method, self.target, self.layer, self.head, self.head_fusion, self.discard_ratio, self.opacity
        )

    def top(self, model: VisionTransformer) -> int:
        """How many classes to list for ``model`` (``check_top_k``)."""
        return check_top_k(self.top_k, model.config.num_classes)
