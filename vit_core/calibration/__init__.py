"""Probabilities that mean what they say: temperature scaling, calibration error, and one prediction call.

Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks", section 4.2) divides the
logits z by one scalar T > 0 before the softmax, q = softmax(z / T), with T chosen to minimise the negative
log-likelihood of held-out images. T < 1 sharpens, T > 1 softens; one view's argmax never changes. With
test-time views (the app's image and its mirror) the probabilities are the weighted mean
p = sum_v w_v softmax(z_v / T), and T is fitted for that mean: calibrate what is shown.

Calibration error (Naeini et al. 2015; Guo et al. eq. 3): the predictions are put into M = 15 equal-width
bins by confidence (the top probability), and ECE = sum_m |B_m| / n * |acc(B_m) - conf(B_m)|. A reliability
diagram draws acc(B_m) against conf(B_m) (``vit_core.figures.reliability_figure``).

A model's ``calibration`` attribute (a ``Calibration``, None when unknown) holds its temperature (None when
none could be fitted) and, for "none of my classes", an ``OODDetector`` (``vit_core.calibration.ood``); ``checkpoint``
stores both with the weights (``config.json`` "calibration", ``ood.safetensors``). ``predict`` is the one call
that turns images into what the library returns: calibrated probabilities and, where the model has a detector,
an OOD score and decision. Models without a temperature get today's softmax (T = 1), without a detector no
OOD decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .ood import OODDetector

if TYPE_CHECKING:
    from torch import nn

TTA_MODES = ("flip", "flip-translate")
ECE_BINS = 15
# The temperatures a fit searches (and a config.json may hold): far beyond any a trained classifier needs.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-2, 1e2
_GRID = 97  # points of fit_temperature's search grid over log T
VIEW_BATCH = 32  # the most images of test-time views one call of the model takes together (``view_outputs``)


def tta_views(images: torch.Tensor, tta: str | None) -> list[tuple[torch.Tensor, float]]:
    """The (view, weight) pairs whose softmaxes are averaged for a prediction; the weights sum to 1.

    ``None``: the image alone. ``"flip"``: the image and its horizontal mirror, 1/2 each.
    ``"flip-translate"`` (airbench's, Jordan 2024): those two at 1/4 each, and the mirror pair of the
    image shifted by s = side/32 px (1 px at 32 px) down-right and up-left, reflect-padded, at 1/8 each.
    """
    if tta not in (None, *TTA_MODES):
        raise ValueError(f"tta must be None or one of {', '.join(TTA_MODES)}, got {tta!r}")
    if tta is None:
        return [(images, 1.0)]
    views = [(images, 1.0)]
    if tta == "flip-translate":
        H, W = images.shape[-2:]
        s = max(1, round(W / 32))
        padded = F.pad(images, (s, s, s, s), mode="reflect")
        views = [(images, 0.5), (padded[..., :H, :W], 0.25), (padded[..., 2 * s :, 2 * s :], 0.25)]
    return [(v, w / 2) for view, w in views for v in (view, view.flip(-1))]


def mixture_log_probs(
    logits: Sequence[torch.Tensor], weights: Sequence[float], temperature: float = 1.0
) -> torch.Tensor:
    """log sum_v w_v softmax(z_v / T): the log of the views' weighted mean probabilities, computed stably."""
    parts = [
        (z.to(torch.promote_types(z.dtype, torch.float32)) / temperature).log_softmax(-1) + math.log(w)
        for z, w in zip(logits, weights, strict=True)
    ]
    return torch.logsumexp(torch.stack(parts), dim=0)


def fit_temperature(logits: Sequence[torch.Tensor], weights: Sequence[float], labels: torch.Tensor) -> float:
    """The T minimising the mean negative log-likelihood of ``labels`` under ``mixture_log_probs``.

    A 1-D search over log T: a grid of 97 points on [1e-2, 1e2] brackets the minimum, then golden-section
    search narrows it to 1e-5 relative. (For one view the NLL is convex in 1/T; the grid keeps a mixture of
    views, which need not be, from stopping in a shallow local minimum.)"""
    z = [v.double() for v in logits]

    def nll(log_t: float) -> float:
        logp = mixture_log_probs(z, weights, math.exp(log_t)).double()
        return float(F.nll_loss(logp, labels))

    lo, hi = math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)
    grid = [lo + (hi - lo) * i / (_GRID - 1) for i in range(_GRID)]
    best = min(range(len(grid)), key=lambda i: nll(grid[i]))
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = nll(c), nll(d)
    while b - a > 1e-5:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = nll(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = nll(d)
    return math.exp((a + b) / 2)


def at_search_edge(t: float) -> bool:
    """Whether a temperature from ``fit_temperature`` lies within two steps of either end of its grid: the
    negative log-likelihood still fell (or was flat, every probability rounding to 1) towards the end of the
    search range, as when every held-out image is right with a wide margin, which any T -> 0 rewards; so the
    images did not set the temperature."""
    lo, hi = math.log(MIN_TEMPERATURE), math.log(MAX_TEMPERATURE)
    step = (hi - lo) / (_GRID - 1)
    return not lo + 2 * step < math.log(t) < hi - 2 * step


# ------------------------------------------------------------------------------------ calibration error


def bin_counts(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """(3, bins) float64 sums per confidence bin: images, confidence, correct predictions. Bins are
    (m/M, (m+1)/M], the first one closed at 0. Sums add up over batches and processes."""
    conf, pred = probs.double().max(-1)
    index = (conf * bins).ceil().long().clamp(1, bins) - 1
    out = torch.zeros(3, bins, dtype=torch.float64, device=probs.device)
    out[0].index_add_(0, index, torch.ones_like(conf))
    out[1].index_add_(0, index, conf)
    out[2].index_add_(0, index, (pred == labels).double())
    return out


def ece_from_counts(counts: torch.Tensor) -> float:
    """ECE = sum_m |B_m| / n * |acc(B_m) - conf(B_m)| = sum_m |correct_m - confidence_m| / n."""
    return float((counts[2] - counts[1]).abs().sum() / counts[0].sum().clamp_min(1))


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> float:
    """ECE of probabilities (N, C) for ``labels`` (N,) over ``bins`` equal-width confidence bins."""
    return ece_from_counts(bin_counts(probs, labels, bins))


# ------------------------------------------------------------------------------------ the stored record


TEMPERATURE_NOT_SET = "T = 1 kept"  # how ``fitted_on`` starts when the held-out images could not set the temperature


@dataclass(frozen=True)
class Calibration:
    """What a checkpoint knows about its own probabilities: the temperature fitted for the ``tta`` views it
    is used with (None: none could be fitted, e.g. the only held-out images were seen in training, so the
    probabilities are the plain softmax and their calibration is unknown), what it was fitted on, and an OOD
    detector (None: no "none of my classes" decision)."""

    temperature: float | None
    tta: str | None = "flip"
    fitted_on: str = ""
    ood: OODDetector | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        number = isinstance(t, float | int) and not isinstance(t, bool)
        if t is not None and not (number and MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):
            raise ValueError(
                f"temperature must be null or a number in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {t!r}"
            )
        if self.tta not in (None, *TTA_MODES):
            raise ValueError(f"calibration tta must be null or one of {', '.join(TTA_MODES)}, got {self.tta!r}")
        if not isinstance(self.fitted_on, str):
            raise ValueError(f"calibration fitted_on must be a string, got {self.fitted_on!r}")

    @property
    def temperature_fitted(self) -> bool:
        """Whether the temperature was fitted: not when there is none, nor when T = 1 was kept because the
        held-out images could not set it (``fitted_on`` starts with ``TEMPERATURE_NOT_SET``; a fine-tuning's
        ``finish_run`` does that, its card says so, and so must whatever describes the model)."""
        return self.temperature is not None and not self.fitted_on.startswith(TEMPERATURE_NOT_SET)


@dataclass(frozen=True)
class CalibrationOptions:
    """How a ``Calibration`` is fitted (``vit_core.training.evaluation.calibrate_model``), apart from the images it
    is fitted on: one value, so that the command line's ``calibrate`` and a fine-tuning's ``finish_run`` state their
    choices once and ``calibrate_checkpoint`` passes them on whole. The defaults are what the app predicts with."""

    tta: str | None = "flip"  # the views the temperature is fitted for (``TTA_MODES``; None: the image alone)
    ood: str | None = "mahalanobis"  # the "none of my classes" score (``ood.SCORES``; None: no detector)
    keep: float = 0.95  # the share of the held-out images the detector's threshold keeps (its quantile)
    # False: the temperature is measured and reported but the calibration holds none (the plain softmax,
    # calibration unknown), e.g. for a model that saw its held-out images in training, where it comes out too low
    store_temperature: bool = True


def calibrated_views(model: nn.Module) -> str | None:
    """The views a prediction averages (:func:`tta_views`): those the model's temperature was fitted for
    (``python -m train calibrate --tta``), or the image and its mirror for a model never calibrated."""
    cal = getattr(model, "calibration", None)
    return cal.tta if cal is not None else "flip"


def temperature(model: nn.Module) -> float:
    """The model's temperature; 1 (the plain softmax) for a model without one."""
    cal = getattr(model, "calibration", None)
    return cal.temperature if cal is not None and cal.temperature is not None else 1.0


# ------------------------------------------------------------------------------------ predictions


@dataclass
class Prediction:
    """What ``predict`` returns for a batch of B images."""

    probs: torch.Tensor  # (B, C) float32: calibrated (where the model has a temperature) mean over the views
    ood_score: torch.Tensor | None  # (B,) float64, higher: less like the training images; None: no detector
    is_ood: torch.Tensor | None  # (B,) bool: ood_score above the stored threshold; None: no detector
    attentions: list[torch.Tensor] | None = None  # the first view's attention per block (return_attention)


@torch.no_grad()
def view_outputs(model: nn.Module, views: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(logits per view, pre-logit features per view), float32, of ``views`` (each (B, C, H, W)), as many views
    to a call of the model as keep it within ``VIEW_BATCH`` images: for a few images (the app's one), one pass
    of larger matrices costs less than a pass per view (the bundled model's 6 views: about 4 passes' time); an
    evaluation's batches go one view at a time, as large as they came."""
    logits: list[torch.Tensor] = []
    features: list[torch.Tensor] = []
    if not views:
        return logits, features
    per_call = max(1, VIEW_BATCH // len(views[0]))
    for i in range(0, len(views), per_call):
        group = views[i : i + per_call]
        f = model.forward_head(model.forward_features(torch.cat(list(group))), pre_logits=True)
        logits += model.head(f).float().chunk(len(group))
        features += f.float().chunk(len(group))
    return logits, features


@torch.no_grad()
def forward_views(
    model: nn.Module, images: torch.Tensor, tta: str | None, return_attention: bool = False
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float], list[torch.Tensor] | None]:
    """(logits per view, pre-logit features per view, view weights, the first view's attentions or None) for
    the ``tta`` views; ``"model"``: the views the model was calibrated for (:func:`calibrated_views`). The views
    go through the model in one call (``view_outputs``); with ``return_attention`` the first view goes alone
    first, its attention probabilities computed (they cost about 9% of a ViT-B/16 pass)."""
    tta = calibrated_views(model) if tta == "model" else tta
    views = tta_views(images, tta)
    weights = [w for _, w in views]
    if not return_attention:
        return *view_outputs(model, [v for v, _ in views]), weights, None
    tokens, attentions = model.forward_features(views[0][0], return_attention=True)
    f = model.forward_head(tokens, pre_logits=True)
    logits, features = view_outputs(model, [v for v, _ in views[1:]])
    return [model.head(f).float(), *logits], [f.float(), *features], weights, attentions


def combine(
    model: nn.Module,
    logits: Sequence[torch.Tensor],
    features: Sequence[torch.Tensor],
    weights: Sequence[float],
    attentions: list[torch.Tensor] | None = None,
) -> Prediction:
    """The ``Prediction`` of the views' logits and pre-logit features (``forward_views``, or a caller that ran
    some of the views its own way: ``vit_core.explain.answer``): the calibrated mixture and the OOD decision."""
    probs = mixture_log_probs(logits, weights, temperature(model)).exp()
    cal = getattr(model, "calibration", None)
    if cal is None or cal.ood is None:
        return Prediction(probs, None, None, attentions)
    scores = cal.ood.scores(probs=probs, logits=list(logits), features=list(features))
    return Prediction(probs, scores, cal.ood.is_ood(scores), attentions)


@torch.no_grad()
def predict(
    model: nn.Module, images: torch.Tensor, *, tta: str | None = "model", return_attention: bool = False
) -> Prediction:
    """Class probabilities and the "none of my classes" decision for ``images`` (B, C, H, W), model-ready.

    ``tta="model"`` (the default, as the app) averages the softmaxes of the views the model was calibrated
    for (:func:`calibrated_views`: flips unless ``train calibrate --tta`` said otherwise); ``None`` or a mode of
    :data:`TTA_MODES` picks them. The model's temperature divides each view's logits first. With an OOD
    detector, its score is computed on the same views and compared with the stored threshold; without one,
    ``ood_score`` and ``is_ood`` are None and callers fall back to the confidence alone
    (``webapp.inference.model_info.decide``)."""
    logits, features, weights, attentions = forward_views(model, images, tta, return_attention)
    return combine(model, logits, features, weights, attentions)


def to_json(cal: Calibration, ood_file: str, ood_sha256: str | None) -> dict[str, Any]:
    """The ``config.json`` "calibration" section of ``cal``; its OOD statistics go in ``ood_file``."""
    d: dict[str, Any] = {"temperature": cal.temperature, "tta": cal.tta, "fitted_on": cal.fitted_on}
    if cal.ood is not None:
        d["ood"] = {
            "score": cal.ood.score,
            "threshold": cal.ood.threshold,
            "keep": cal.ood.keep,
            "fitted_on": cal.ood.fitted_on,
            "file": ood_file if cal.ood.statistics else None,
            "sha256": ood_sha256 if cal.ood.statistics else None,
            "held_out_quantiles": None if cal.ood.held_out_quantiles is None else list(cal.ood.held_out_quantiles),
        }
    return d


def unlikeness(detector: OODDetector, score: float) -> str:
    """An OOD score in words a person can read, relative to the model's own held-out photos (``OODDetector.
    percentile``), never the raw number: "less like the photos it learned than 97 of 100 of its held-out photos"."""
    p = detector.percentile(score)
    if p is None:  # a detector stored without its held-out scores: only its decision can be said
        side = "beyond" if detector.is_ood(torch.tensor(score)) else "within"
        return f"{side} what it answers for (its held-out photos' scores were not stored)"
    if p >= 100:
        return "less like the photos it learned than every one of its held-out photos"
    if p < 1:
        return "more like the photos it learned than any of its held-out photos"
    return f"less like the photos it learned than {math.floor(p)} of 100 of its held-out photos"
