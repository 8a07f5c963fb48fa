"""The first answer and the full answer (``vit_core.explain.answer``) against the library's own one-call paths:
the first is the image alone through ``model`` (its softmax over the temperature, its attention rollout), the
full one is ``calibration.predict`` and ``lrp.attnlrp`` exactly, whichever pass the first answer kept."""

from __future__ import annotations

import pytest
import torch

from vit_core import explain
from vit_core.calibration import Calibration, OODDetector, calibrated_views, predict, tta_views
from vit_core.calibration.ood import fit_statistics
from vit_core.explain import answer, lrp

from .test_lrp import KINDS, image, make_model

CASES = ["token", "avg", "pre_logits", "conv_stem"]


def _calibrated(model, tta: str | None) -> None:
    """A temperature, views and a Mahalanobis detector fitted on random images (as ``test_calibration``)."""
    x = image(model, batch=40, seed=7)
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
    C = model.config.num_classes
    stats = fit_statistics("mahalanobis", features, torch.arange(40) % C, C, (model.head.weight, model.head.bias))
    model.calibration = Calibration(0.6, tta, "test", OODDetector("mahalanobis", 30.0, 0.95, stats, "test"))


@pytest.mark.parametrize("kind", CASES)
@pytest.mark.parametrize("tta", [None, "flip", "flip-translate"])
@pytest.mark.parametrize("shared", [None, True, False])
def test_full_answer_is_predict_and_attnlrp(kind, tta, shared):
    model = make_model(**KINDS[kind])
    _calibrated(model, tta)
    x = image(model, batch=4)
    first = answer.first_answer(model, x, relevance=shared)
    assert (first.graph is not None) == (answer.shares_forward(model) if shared is None else shared)
    with torch.no_grad():
        logits, attentions = model(x, return_attention=True)
    torch.testing.assert_close(first.probs, (logits / 0.6).softmax(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first.rollout, explain.attention_rollout(model, x), rtol=1e-4, atol=1e-5)
    assert first.views == len(tta_views(x, calibrated_views(model)))

    full = answer.full_answer(model, x, first)
    want = predict(model, x, return_attention=True)
    torch.testing.assert_close(full.prediction.probs, want.probs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(full.prediction.ood_score, want.ood_score, rtol=1e-4, atol=1e-4)
    assert torch.equal(full.prediction.is_ood, want.is_ood)
    for got, a in zip(full.prediction.attentions, attentions, strict=True):
        torch.testing.assert_close(got, a, rtol=1e-5, atol=1e-6)
    assert torch.equal(full.target, want.probs.argmax(-1))
    torch.testing.assert_close(full.relevance, lrp.attnlrp(model, x, want.probs.argmax(-1)), rtol=1e-4, atol=1e-5)
    assert torch.equal(full.changed, want.probs.argmax(-1) != logits.argmax(-1))
    assert first.graph is None  # released


def test_a_chosen_class_and_no_map():
    model = make_model()
    _calibrated(model, "flip")
    x = image(model, batch=3)
    full = answer.full_answer(model, x, answer.first_answer(model, x), target=[4, 0, 2])
    torch.testing.assert_close(full.relevance, lrp.attnlrp(model, x, [4, 0, 2]), rtol=1e-4, atol=1e-5)
    first = answer.first_answer(model, x)
    assert answer.full_answer(model, x, first, relevance=False).relevance is None and first.graph is None


def test_the_full_answer_can_change_the_first_and_says_so():
    """Images whose mirror outvotes them: among 64 random images of a random model some change class."""
    model = make_model(seed=3)
    _calibrated(model, "flip-translate")
    x = image(model, batch=64, seed=5)
    first = answer.first_answer(model, x)
    full = answer.full_answer(model, x, first)
    changed = first.probs.argmax(-1) != predict(model, x).probs.argmax(-1)
    assert changed.any() and not changed.all()
    assert torch.equal(full.changed, changed)
