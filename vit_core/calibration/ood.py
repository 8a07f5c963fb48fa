""" "None of my classes": out-of-distribution scores that need no outlier data, and how well they separate.

Every score here is computed from what a classifier already has (its probabilities, logits or pre-logit
features, and statistics of its own training images) and is oriented the same way: **higher means less like
the training data**. With test-time views (the image and its mirror) a score is the mean of the views' scores.

- ``msp``: 1 - max_k p_k, the maximum softmax probability baseline (Hendrycks & Gimpel 2017), on the
  probabilities the model returns (calibrated and averaged over views).
- ``energy``: -logsumexp_k z_k, the free energy of the logits z (Liu et al. 2020, eq. 4, T = 1).
- ``knn``: the Euclidean distance from the normalised feature f/|f| to its k-th nearest neighbour among the
  normalised features of training images (Sun et al. 2022, "Out-of-distribution detection with deep nearest
  neighbors", eq. 3); k = 10 for a bank of 10,000 images (their k = 50 for 50,000, the same fraction).
- ``mahalanobis``: min_c (f - mu_c)^T S^-1 (f - mu_c), the squared Mahalanobis distance to the closest class
  mean under one covariance S shared by the classes (Lee et al. 2018, eq. 2), on pre-logit features.
- ``relative_mahalanobis``: min_c [MD_c(f) - MD_0(f)], the Mahalanobis distance to the closest class minus the
  distance MD_0 under one Gaussian fitted to all the training features, their "background" (Ren et al. 2021, "A
  Simple Fix to Mahalanobis Distance for Improving Near-OOD Detection", section 3): what makes an image far from
  every class but is common to all images (its texture, its framing as a photo) cancels.
- ``vim``: Virtual-logit Matching (Wang et al. 2022, eqs. 4-7): the part of f - o outside the principal subspace
  of the training features (o = -W^+ b, the origin the head's logits W f + b measure from; the subspace of the
  k = D/2 largest eigenvalues of their uncentred covariance about o), its norm scaled by alpha = mean max logit
  / mean residual norm over training images into a virtual logit v; the score is v - logsumexp_k z_k, which
  orders images as the softmax probability of that virtual class does.

The scores are a table, ``SCORES``: a name, the score's function, and the statistics it fits (``Score``).
An ``OODDetector`` is one score, the statistics it needs (``fit_statistics``) and a threshold set on held-out
in-distribution images only: the ``keep`` quantile of their scores (0.95: 95% of them keep their answer).
``auroc`` and ``fpr_at_tpr`` measure a score on inside and outside images (bench/ood.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

Views = Sequence[torch.Tensor]  # one (B, C) logits or (B, D) features tensor per test-time view
ScoreFn = Callable[[torch.Tensor, Views, Views, Mapping[str, torch.Tensor]], torch.Tensor]
Head = tuple[torch.Tensor, torch.Tensor]  # the classifier's weight (C, D) and bias (C,)
FitFn = Callable[[torch.Tensor, torch.Tensor, int, Head | None], dict[str, torch.Tensor]]

KNN_K = 10
# The dimensions a statistic's shape may name: the model's classes and pre-logit features, the features outside
# vim's principal half (D - D // 2), one, or any other name for a count of stored training images (a knn bank's
# rows), which ``calibration_file`` bounds.
CLASSES, FEATURES, RESIDUAL, ONE = "classes", "features", "residual", "one"


@dataclass(frozen=True)
class Score:
    """One OOD score: its function and, when it needs statistics of the training images, how they are fitted
    and their tensors' shapes (by name, in ``CLASSES``, ``FEATURES`` or a count of images)."""

    fn: ScoreFn  # (probs, logits, features, statistics) -> (B,) float64, higher = less like the training images
    fit: FitFn | None = None  # (features (N, D), labels (N,), num_classes, head) -> statistics; None: needs none
    statistics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # tensor name -> its dimensions


def _msp(probs: torch.Tensor, logits: Views, features: Views, statistics: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return 1 - probs.double().max(-1).values


def _energy(
    probs: torch.Tensor, logits: Views, features: Views, statistics: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    return torch.stack([-torch.logsumexp(z.double(), -1) for z in logits]).mean(0)


def _fit_knn(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, head: Head | None
) -> dict[str, torch.Tensor]:
    """The normalised features, in fp16 (a bank of 10,000 x 192 is 3.8 MB)."""
    return {"bank": F.normalize(features.double(), dim=-1).half().contiguous()}


def _knn(probs: torch.Tensor, logits: Views, features: Views, statistics: Mapping[str, torch.Tensor]) -> torch.Tensor:
    bank = statistics["bank"].to(features[0].device, torch.float32)
    k = min(KNN_K, len(bank))
    # |a - b|^2 = 2 - 2 a.b for unit vectors: the k-th largest similarity is the k-th nearest neighbour
    sims = [(F.normalize(f.float(), dim=-1) @ bank.T).topk(k, dim=-1).values[:, -1] for f in features]
    return torch.stack([(2 - 2 * s.double()).clamp_min(0).sqrt() for s in sims]).mean(0)


def _fit_mahalanobis(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, head: Head | None
) -> dict[str, torch.Tensor]:
    """The class means (C, D) and the inverse of the shared covariance S = 1/N sum_i (f_i - mu_{y_i})(f_i -
    mu_{y_i})^T (D, D) plus a ridge (``_ridge``), computed in float64 and stored in float32."""
    f = features.double()
    counts = torch.bincount(labels, minlength=num_classes)
    if (counts == 0).any():
        raise ValueError(f"mahalanobis needs images of every class; none of class {int((counts == 0).nonzero()[0])}")
    means = torch.zeros(num_classes, f.shape[1], dtype=torch.float64).index_add_(0, labels, f) / counts[:, None]
    centred = f - means[labels]
    cov = centred.T @ centred / len(f)
    cov += _ridge(cov, f) * torch.eye(len(cov), dtype=cov.dtype)
    return {"means": means.float().contiguous(), "precision": torch.linalg.inv(cov).float().contiguous()}


def _ridge(cov: torch.Tensor, features: torch.Tensor) -> float:
    """What is added to S's diagonal so that it can be inverted. Normally a millionth of its mean variance (a
    feature nearly constant over the training images). With no spread within the classes at all (one image per
    class: the smallest training set the app takes, 2 classes of 2 photos, trains on 1 each), S is zero and says
    nothing of the features' shape: the ridge is then the features' mean variance about their overall mean, so
    the score is the squared Euclidean distance in units of that spread; with no spread at all, 1."""
    within = float(cov.diagonal().mean())
    if within > 0:
        return 1e-6 * within
    overall = float(features.var(0, unbiased=False).mean()) if len(features) > 1 else 0.0
    return overall if overall > 0 else 1.0


def _distances(f: torch.Tensor, means: torch.Tensor, precision: torch.Tensor) -> torch.Tensor:
    """(B, C): the squared Mahalanobis distance (f - mu_c)^T P (f - mu_c) of each feature (B, D) to each of the
    means (C, D) under the precision P (D, D), in float64."""
    d = f.double()[:, None, :] - means.to(f.device, torch.float64)  # (B, C, D)
    return torch.einsum("bcd,de,bce->bc", d, precision.to(f.device, torch.float64), d)


def _mahalanobis(
    probs: torch.Tensor, logits: Views, features: Views, statistics: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    means, precision = statistics["means"], statistics["precision"]
    return torch.stack([_distances(f, means, precision).min(-1).values for f in features]).mean(0)


def _fit_relative_mahalanobis(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, head: Head | None
) -> dict[str, torch.Tensor]:
    """Mahalanobis's class means and shared precision, and the background: the mean of all the features and the
    inverse of their covariance about it (plus ``_ridge``), in float64 and stored in float32."""
    f = features.double()
    mean = f.mean(0)
    cov = (f - mean).T @ (f - mean) / len(f)
    cov += _ridge(cov, f) * torch.eye(len(cov), dtype=cov.dtype)
    background = {"background_mean": mean.float(), "background_precision": torch.linalg.inv(cov).float().contiguous()}
    return _fit_mahalanobis(features, labels, num_classes, head) | background


def _relative_mahalanobis(
    probs: torch.Tensor, logits: Views, features: Views, statistics: Mapping[str, torch.Tensor]
) -> torch.Tensor:
    means, precision = statistics["means"], statistics["precision"]
    mean0, precision0 = statistics["background_mean"][None], statistics["background_precision"]
    relative = [_distances(f, means, precision) - _distances(f, mean0, precision0) for f in features]  # (B, C) each
    return torch.stack([r.min(-1).values for r in relative]).mean(0)


def _fit_vim(
    features: torch.Tensor, labels: torch.Tensor, num_classes: int, head: Head | None
) -> dict[str, torch.Tensor]:
    """The origin o = -W^+ b, the basis of the features' residual space about it (the eigenvectors of the D - D/2
    smallest eigenvalues of their uncentred covariance) and alpha (mean max logit / mean residual norm)."""
    if head is None:
        raise ValueError("the vim score needs the classifier's head (weight, bias)")
    W, b = (t.detach().double().cpu() for t in head)
    f = features.double().cpu()
    origin = -torch.linalg.pinv(W) @ b
    centred = f - origin
    _, vectors = torch.linalg.eigh(centred.T @ centred / len(f))  # eigenvalues ascending
    residual = vectors[:, : f.shape[1] - f.shape[1] // 2]  # outside the k = D/2 principal directions
    alpha = (f @ W.T + b).max(-1).values.mean() / (centred @ residual).norm(dim=-1).mean()
    return {
        "origin": origin.float().contiguous(),
        "residual": residual.float().contiguous(),
        "alpha": alpha.reshape(1).float(),
    }


def _vim(probs: torch.Tensor, logits: Views, features: Views, statistics: Mapping[str, torch.Tensor]) -> torch.Tensor:
    origin, residual, alpha = (
        statistics[k].to(features[0].device, torch.float64) for k in ("origin", "residual", "alpha")
    )
    virtual = [alpha * ((f.double() - origin) @ residual).norm(dim=-1) for f in features]
    return torch.stack([v - torch.logsumexp(z.double(), -1) for v, z in zip(virtual, logits, strict=True)]).mean(0)


# The scores by name: what ``--ood`` offers, what a checkpoint's calibration may name. Adding a score is one
# entry here plus its functions.
SCORES: dict[str, Score] = {
    "msp": Score(_msp),
    "energy": Score(_energy),
    "knn": Score(_knn, _fit_knn, {"bank": ("images", FEATURES)}),
    "mahalanobis": Score(
        _mahalanobis, _fit_mahalanobis, {"means": (CLASSES, FEATURES), "precision": (FEATURES, FEATURES)}
    ),
    "relative_mahalanobis": Score(
        _relative_mahalanobis,
        _fit_relative_mahalanobis,
        {
            "means": (CLASSES, FEATURES),
            "precision": (FEATURES, FEATURES),
            "background_mean": (FEATURES,),
            "background_precision": (FEATURES, FEATURES),
        },
    ),
    "vim": Score(_vim, _fit_vim, {"origin": (FEATURES,), "residual": (FEATURES, RESIDUAL), "alpha": (ONE,)}),
}


def score_named(name: str) -> Score:
    """The entry of ``SCORES`` called ``name``; ``ValueError`` naming the choices otherwise."""
    if name not in SCORES:
        raise ValueError(f"unknown OOD score {name!r}; one of {', '.join(SCORES)}")
    return SCORES[name]


def fit_statistics(
    score: str, features: torch.Tensor, labels: torch.Tensor, num_classes: int, head: Head | None = None
) -> dict[str, torch.Tensor]:
    """What ``score`` needs from training images: their pre-logit ``features`` (N, D) and ``labels`` (N,), and
    the classifier's ``head`` for scores that read it (knn: the normalised features; mahalanobis: the class means
    and the shared covariance's inverse; vim: the origin, the residual basis and alpha)."""
    fit = score_named(score).fit
    return {} if fit is None else fit(features, labels, num_classes, head)


def ood_scores(
    score: str,
    *,
    probs: torch.Tensor,
    logits: Views,
    features: Views,
    statistics: Mapping[str, torch.Tensor],
) -> torch.Tensor:
    """(B,) scores, higher = less like the training images: ``probs`` (B, C) are the returned probabilities
    (mean over the views), ``logits`` and ``features`` one (B, C) / (B, D) tensor per view."""
    return score_named(score).fn(probs, logits, features, statistics)


@dataclass(frozen=True)
class OODDetector:
    """One score with its statistics, and the threshold above which an image is out of distribution."""

    score: str
    threshold: float
    keep: float  # the fraction of held-out in-distribution images at or under the threshold
    statistics: dict[str, torch.Tensor] = field(default_factory=dict)
    fitted_on: str = ""  # what the statistics and the threshold were computed on, in words
    # the held-out in-distribution images' scores at the quantiles 0, 1/(n-1), ..., 1 (``score_quantiles``), which
    # say a score in words (``percentile``); None for a detector stored before they were (its score has no words)
    held_out_quantiles: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        entry = score_named(self.score)
        if not (isinstance(self.threshold, float | int) and math.isfinite(self.threshold)):
            raise ValueError(f"OOD threshold must be a finite number, got {self.threshold!r}")
        q = self.held_out_quantiles
        numbers = isinstance(q, list | tuple) and all(isinstance(v, float | int) and math.isfinite(v) for v in q)
        if q is not None and not (numbers and 2 <= len(q) <= MAX_QUANTILES and list(q) == sorted(q)):
            raise ValueError(f"OOD held_out_quantiles must be 2..{MAX_QUANTILES} ascending finite numbers, got {q!r}")
        if not (isinstance(self.keep, float | int) and 0 < self.keep <= 1):
            raise ValueError(f"OOD keep must be in (0, 1], got {self.keep!r}")
        names = set(entry.statistics)
        if set(self.statistics) != names:
            raise ValueError(
                f"the {self.score} score needs the statistics {sorted(names)}, got {sorted(self.statistics)}"
            )

    def scores(
        self, *, probs: torch.Tensor, logits: Sequence[torch.Tensor], features: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        return ood_scores(self.score, probs=probs, logits=logits, features=features, statistics=self.statistics)

    def is_ood(self, scores: torch.Tensor) -> torch.Tensor:
        return scores > self.threshold

    def percentile(self, score: float) -> float | None:
        """The share (%) of the held-out in-distribution images whose score is under ``score``, read from
        ``held_out_quantiles`` by linear interpolation (0 under the lowest, 100 over the highest); None without
        them."""
        if self.held_out_quantiles is None:
            return None
        q = torch.tensor(self.held_out_quantiles, dtype=torch.float64)
        i = int(torch.searchsorted(q, torch.tensor(float(score), dtype=torch.float64), right=True))
        if i == 0 or i == len(q):
            return 0.0 if i == 0 else 100.0
        lo, hi = q[i - 1].item(), q[i].item()
        within = 1.0 if hi == lo else (score - lo) / (hi - lo)
        return 100 * (i - 1 + within) / (len(q) - 1)


QUANTILES = 101  # the held-out scores a detector keeps: every percentile, 0 to 100
MAX_QUANTILES = 1001  # the most a stored detector may hold


def score_quantiles(scores: torch.Tensor, n: int = QUANTILES) -> tuple[float, ...]:
    """The held-out in-distribution ``scores`` at ``n`` evenly spaced quantiles, 0 (the lowest) to 1 (the highest)."""
    return tuple(torch.quantile(scores.double(), torch.linspace(0, 1, n, dtype=torch.float64)).tolist())


def threshold_for(scores: torch.Tensor, keep: float) -> float:
    """The ``keep`` quantile of held-out in-distribution ``scores``: that fraction of them is at or under it."""
    return float(torch.quantile(scores.double(), keep))


# the share of held-out photos a threshold set with photos of other things may keep: never fewer than the
# default's 95% (bench.other_photos: from 90%, ants and bees lost 11% of their val photos, against 6%)
KEEP_RANGE = (0.95, 0.98)
# the scores photos of other things choose from (``choose_with_others``): none reads the temperature, which a fit
# at its search's edge replaces after the threshold is set
OTHERS_SCORES = ("mahalanobis", "relative_mahalanobis", "knn", "energy")


@dataclass(frozen=True)
class OthersChoice:
    """What photos of other things chose (``choose_with_others``) and what the rest of them measured."""

    score: str
    threshold: float
    kept: float  # the share of the held-out in-distribution images at or under the threshold
    others: int  # photos of other things
    others_chose: int  # those that chose the score and set its threshold: every other one, from the first
    others_auroc: float  # the score's, held-out images against the photos that chose it
    others_measured: int  # those that measure it: the rest (all of them when there is only one)
    others_turned_away: float  # the share of those over the threshold


def choose_with_others(
    inside: Mapping[str, torch.Tensor], others: Mapping[str, torch.Tensor], keep: float
) -> OthersChoice:
    """The score and threshold that photos of other things (none of the classes) choose, from every score's
    held-out in-distribution ``inside`` and ``others`` scores (by name, in order of preference): every other one of
    them (from the first) picks the score that tells them from the held-out images best (AUROC; ties: the first)
    and sets its threshold (``threshold_with_others``); the rest measure the share it turns away (all of them when
    there is only one)."""
    n = len(next(iter(others.values())))
    sets, measures = (slice(0, None, 2), slice(1, None, 2)) if n > 1 else (slice(None), slice(None))
    aurocs = {name: auroc(inside[name], scores[sets]) for name, scores in others.items()}
    best = max(aurocs, key=aurocs.__getitem__)
    threshold, kept = threshold_with_others(inside[best], others[best][sets], keep)
    measured = others[best][measures]
    turned_away = float((measured > threshold).double().mean())
    return OthersChoice(best, threshold, kept, n, len(others[best][sets]), aurocs[best], len(measured), turned_away)


def threshold_with_others(
    inside: torch.Tensor, others: torch.Tensor, keep: float, keep_range: tuple[float, float] = KEEP_RANGE
) -> tuple[float, float]:
    """(threshold, share of ``inside`` at or under it) when photos of other things (``others``: none of the
    classes) help set the threshold: of the thresholds that keep a share of the held-out in-distribution
    ``inside`` scores within ``keep_range``, the one that gets the most of both right, the share of ``inside``
    kept plus the share of ``others`` turned away (above it); ties go to the share nearest ``keep``. Outlier
    exposure (Hendrycks et al. 2019) used for the threshold only: the statistics stay the classes' own."""
    inside, others = inside.double(), others.double()
    low, high = keep_range
    candidates = torch.cat([inside, torch.quantile(inside, torch.tensor([low, keep, high], dtype=torch.float64))])
    kept = (inside[None, :] <= candidates[:, None]).double().mean(1)
    allowed = (kept >= low) & (kept <= high)
    if not allowed.any():  # too few held-out scores to land in the range: the plain quantile
        plain = threshold_for(inside, keep)
        return plain, float((inside <= plain).double().mean())
    right = kept + (others[None, :] > candidates[:, None]).double().mean(1)
    rank = torch.where(allowed, right - 1e-6 * (kept - keep).abs(), torch.tensor(-math.inf, dtype=torch.float64))
    best = int(rank.argmax())
    return float(candidates[best]), float(kept[best])


# ------------------------------------------------------------------------------------ measuring a score


def auroc(inside: torch.Tensor, outside: torch.Tensor) -> float:
    """Area under the ROC curve of telling ``outside`` from ``inside`` images by score (higher = outside):
    the probability that an outside image scores higher than an inside one, ties counting 1/2 (the
    Mann-Whitney U statistic divided by n_in * n_out)."""
    s = torch.cat([inside, outside]).double()
    order = s.argsort()
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.float64)
    # tied scores share their mean rank
    uniq, inverse = torch.unique(s, return_inverse=True)
    mean_rank = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, ranks)
    mean_rank /= torch.bincount(inverse, minlength=len(uniq)).double()
    r_out = mean_rank[inverse[len(inside) :]].sum()
    n_in, n_out = len(inside), len(outside)
    return float((r_out - n_out * (n_out + 1) / 2) / (n_in * n_out))


def fpr_at_tpr(inside: torch.Tensor, outside: torch.Tensor, tpr: float = 0.95) -> float:
    """The fraction of ``outside`` images taken for inside ones (score at or under the threshold) when the
    threshold keeps the fraction ``tpr`` of ``inside`` images: "FPR at 95% TPR" with inside as positives."""
    return float((outside.double() <= threshold_for(inside, tpr)).double().mean())
