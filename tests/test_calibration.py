"""Calibration and "none of my classes": temperature scaling against a brute-force NLL search, ECE and the OOD
scores against per-sample definitions in numpy, the stored calibration through save, load, timm and bad files,
a model without one behaving as before, ``train calibrate`` / ``train eval`` on a small dataset, class subsets."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import vit_core
from train.__main__ import main
from vit_core.calibration import (
    Calibration,
    expected_calibration_error,
    fit_temperature,
    mixture_log_probs,
    ood,
    predict,
)
from vit_core.calibration.ood import (
    KEEP_RANGE,
    OODDetector,
    auroc,
    choose_with_others,
    fit_statistics,
    fpr_at_tpr,
    ood_scores,
    threshold_for,
    threshold_with_others,
)
from vit_core.data import InMemoryImageDataset, build_dataset, build_transform, class_subset, fixed_subset
from vit_core.io.calibration_file import OOD_NAME, write_calibration
from vit_core.io.model_card import CardFacts, render_model_card
from webapp.inference.model_info import UNSURE_BELOW, facts, verdict

from .test_docs import marked_block
from .test_engine import make_image_folder, one_thread  # noqa: F401  (autouse fixture)

LABELS = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _model(seed: int = 0, **changes) -> vit_core.VisionTransformer:
    torch.manual_seed(seed)
    cfg = vit_core.ViTConfig(
        img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=10, label_names=LABELS
    ).replace(**changes)
    return vit_core.create_model(cfg).eval()


def _miscalibrated(n: int = 2000, scale: float = 2.5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``scale`` times too large: labels drawn from softmax(z0), the model says softmax(scale * z0)."""
    g = torch.Generator().manual_seed(seed)
    z0 = torch.randn(n, 5, generator=g, dtype=torch.float64) * 1.5
    labels = torch.multinomial(z0.softmax(-1), 1, generator=g).squeeze(1)
    return z0 * scale, labels


# ------------------------------------------------------------------------------------ temperature, ECE


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _numpy_nll(views: list[np.ndarray], weights: list[float], labels: np.ndarray, t: float) -> float:
    p = sum(w * _softmax(z / t) for z, w in zip(views, weights, strict=True))
    return float(-np.log(p[np.arange(len(labels)), labels]).mean())


@pytest.mark.parametrize("views", [1, 2])
def test_temperature_is_the_brute_force_nll_minimum_and_lowers_ece(views):
    z, y = _miscalibrated()
    logits = [z] if views == 1 else [z, z + torch.randn(z.shape, generator=torch.Generator().manual_seed(1))]
    weights = [1 / views] * views
    fitted = fit_temperature(logits, weights, y)
    grid = np.arange(1.0, 5.0, 0.002)
    nlls = [_numpy_nll([v.numpy() for v in logits], weights, y.numpy(), t) for t in grid]
    assert fitted == pytest.approx(grid[int(np.argmin(nlls))], abs=3e-3)
    if views == 1:
        assert fitted == pytest.approx(2.5, rel=0.1)  # the scale the logits were inflated by
    before = expected_calibration_error(mixture_log_probs(logits, weights).exp(), y)
    after = expected_calibration_error(mixture_log_probs(logits, weights, fitted).exp(), y)
    assert before > 0.1 and after < 0.03 and after < before / 4


def _numpy_ece(probs: np.ndarray, labels: np.ndarray, bins: int = 15) -> float:
    conf, pred = probs.max(1), probs.argmax(1)
    total = 0.0
    for m in range(bins):
        lo, hi = m / bins, (m + 1) / bins
        inside = [i for i in range(len(conf)) if (lo < conf[i] <= hi) or (m == 0 and conf[i] == 0)]
        if inside:
            acc = np.mean([pred[i] == labels[i] for i in inside])
            total += len(inside) / len(conf) * abs(acc - np.mean(conf[inside]))
    return total


def test_ece_is_the_per_bin_definition():
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(300, 4, generator=g, dtype=torch.float64) ** 3
    probs /= probs.sum(1, keepdim=True)
    labels = torch.randint(0, 4, (300,), generator=g)
    edges = torch.tensor([[1 / 3, 1 / 3, 1 / 3 - 0.0, 0.0], [0.6, 0.4, 0, 0], [0.4, 0.6, 0, 0]], dtype=torch.float64)
    probs = torch.cat([probs, edges / edges.sum(1, keepdim=True)])  # confidences on bin edges (0.6 = 9/15)
    labels = torch.cat([labels, torch.tensor([0, 1, 1])])
    assert expected_calibration_error(probs, labels) == pytest.approx(
        _numpy_ece(probs.numpy(), labels.numpy()), abs=1e-12
    )


# ------------------------------------------------------------------------------------ OOD scores


def test_ood_scores_are_their_brute_force_definitions():
    g = torch.Generator().manual_seed(0)
    C, D, N, B = 3, 5, 60, 7
    train_f, train_y = torch.randn(N, D, generator=g), torch.arange(N) % C
    views_f = [torch.randn(B, D, generator=g) for _ in range(2)]
    views_z = [torch.randn(B, C, generator=g) for _ in range(2)]
    probs = torch.stack([z.softmax(-1) for z in views_z]).mean(0)

    # mahalanobis: class means, one shared covariance, the closest class (numpy, per image and class)
    f, y = train_f.double().numpy(), train_y.numpy()
    means = np.stack([f[y == c].mean(0) for c in range(C)])
    cov = sum(np.outer(f[i] - means[y[i]], f[i] - means[y[i]]) for i in range(N)) / N
    prec = np.linalg.inv(cov)
    # relative mahalanobis: minus the distance under one Gaussian of all the training features (Ren et al. 2021)
    mean0 = f.mean(0)
    prec0 = np.linalg.inv(sum(np.outer(x - mean0, x - mean0) for x in f) / N)
    stats = {s: fit_statistics(s, train_f, train_y, C) for s in ("knn", "mahalanobis", "relative_mahalanobis")}
    np.testing.assert_allclose(stats["mahalanobis"]["means"].numpy(), means, rtol=1e-6)
    np.testing.assert_allclose(stats["mahalanobis"]["precision"].numpy(), prec, rtol=1e-4, atol=1e-5)

    def per_view(fn):
        return [np.mean([fn(v, b) for v in range(2)]) for b in range(B)]

    def mahalanobis(v, b):
        q = views_f[v][b].double().numpy()
        return min((q - m) @ prec @ (q - m) for m in means)

    def relative(v, b):
        q = views_f[v][b].double().numpy()
        return min((q - m) @ prec @ (q - m) for m in means) - (q - mean0) @ prec0 @ (q - mean0)

    unit = f / np.linalg.norm(f, axis=1, keepdims=True)

    def knn(v, b):
        q = views_f[v][b].double().numpy()
        return sorted(np.linalg.norm(unit - q / np.linalg.norm(q), axis=1))[9]  # the 10th nearest

    energy = per_view(lambda v, b: -math.log(sum(math.exp(x) for x in views_z[v][b].double().tolist())))
    expected = {
        "msp": [1 - max(p) for p in probs.tolist()],
        "energy": energy,
        "knn": per_view(knn),
        "mahalanobis": per_view(mahalanobis),
        "relative_mahalanobis": per_view(relative),
    }
    for score, want in expected.items():
        got = ood_scores(score, probs=probs, logits=views_z, features=views_f, statistics=stats.get(score, {}))
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-3, atol=2e-3, err_msg=score)


@pytest.mark.parametrize("per_class", [1, 2])
def test_mahalanobis_fits_the_smallest_training_sets_as_its_brute_force_definition(per_class):
    """The app's smallest training set (2 classes of 2 photos) trains on one image a class: no spread within the
    classes, S = 0, which ``linalg.inv`` refused (the job failed with a traceback). The ridge is then the
    features' variance about their overall mean (squared Euclidean distances in units of it); with two images a
    class (N < D), S is singular and the ridge is a millionth of its mean variance. Both against numpy, per image
    and class."""
    g = torch.Generator().manual_seed(1)
    C, D = 2, 6
    train_y = torch.arange(C).repeat(per_class)
    train_f = torch.randn(len(train_y), D, generator=g, dtype=torch.float64)
    f, y = train_f.numpy(), train_y.numpy()
    means = np.stack([f[y == c].mean(0) for c in range(C)])
    cov = sum(np.outer(f[i] - means[y[i]], f[i] - means[y[i]]) for i in range(len(f))) / len(f)
    ridge = 1e-6 * np.trace(cov) / D if per_class > 1 else ((f - f.mean(0)) ** 2).mean()
    prec = np.linalg.inv(cov + ridge * np.eye(D))
    stats = fit_statistics("mahalanobis", train_f.float(), train_y, C)
    assert torch.isfinite(stats["precision"]).all()
    query = torch.randn(5, D, generator=g)
    got = ood_scores("mahalanobis", probs=torch.zeros(5, C), logits=[], features=[query], statistics=stats)
    want = [min((q - m) @ prec @ (q - m) for m in means) for q in query.double().numpy()]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-3)
    if per_class == 1:  # Euclidean over the overall spread
        euclid = [min(((q - m) ** 2).sum() for m in means) / ridge for q in query.double().numpy()]
        np.testing.assert_allclose(got.numpy(), euclid, rtol=1e-4)


def test_auroc_and_fpr_are_their_pairwise_definitions():
    g = torch.Generator().manual_seed(0)
    inside = torch.randint(0, 20, (50,), generator=g).double()  # many ties
    outside = torch.randint(5, 30, (40,), generator=g).double()
    pairs = [(o > i) + 0.5 * (o == i) for o in outside.tolist() for i in inside.tolist()]
    assert auroc(inside, outside) == pytest.approx(float(np.mean(pairs)))
    t = threshold_for(inside, 0.95)
    assert (inside <= t).double().mean() >= 0.95
    assert fpr_at_tpr(inside, outside) == pytest.approx(float(np.mean([o <= t for o in outside.tolist()])))
    assert auroc(inside, inside + 100) == 1.0 and auroc(inside, inside) == pytest.approx(0.5)


def test_photos_of_other_things_set_the_threshold_that_gets_the_most_of_both_right():
    """Against a brute force over every threshold between any two scores: the chosen one keeps a share of the
    held-out scores within the range, and no threshold in range gets more of both right (kept + turned away)."""
    g = torch.Generator().manual_seed(1)
    for trial in range(20):
        inside = torch.randn(40 + trial, generator=g, dtype=torch.float64)
        others = torch.randn(10 + trial, generator=g, dtype=torch.float64) * 1.5 + trial / 8  # near, then far
        t, kept = threshold_with_others(inside, others, 0.95)
        assert kept == pytest.approx(float((inside <= t).double().mean()))
        assert KEEP_RANGE[0] <= kept <= KEEP_RANGE[1]
        values = sorted(set(inside.tolist() + others.tolist()))
        grid = values + [(a + b) / 2 for a, b in itertools.pairwise(values)]
        best = max(
            float((inside <= u).double().mean() + (others > u).double().mean())
            for u in grid
            if KEEP_RANGE[0] <= float((inside <= u).double().mean()) <= KEEP_RANGE[1]
        )
        assert float((inside <= t).double().mean() + (others > t).double().mean()) == pytest.approx(best)
    # others far above every held-out score: all turned away whatever the threshold, so it keeps the most it may
    inside = torch.arange(100, dtype=torch.float64)
    t, kept = threshold_with_others(inside, inside + 1000, 0.95)
    assert kept == pytest.approx(KEEP_RANGE[1], abs=0.01) and t < 1000
    # others among the held-out scores, one each: no threshold turns away more than it drops; ties: nearest 95%
    t, kept = threshold_with_others(inside, inside + 0.5, 0.95)
    assert kept == pytest.approx(0.95, abs=0.01)
    # others among the 8% highest held-out scores: the threshold goes down to turn them away, to the range's end
    t, kept = threshold_with_others(inside, torch.tensor([95.5, 96.5, 97.5, 98.5]), 0.95)
    assert t == 95 and kept == pytest.approx(0.96)  # 0 to 95 kept, all four turned away
    t, kept = threshold_with_others(inside, torch.tensor([92.5, 93.5, 94.5, 95.5, 96.5]), 0.95)
    assert t == 94 and kept == pytest.approx(KEEP_RANGE[0])  # no lower: 95% kept at least


def test_photos_of_other_things_choose_the_score_with_half_of_them_and_the_rest_measure_it():
    """Score "a" tells the even-indexed photos of other things from the held-out images, "b" the odd ones: the
    even ones choose, so "a" is chosen, and the odd ones, which "a" does not separate, measure it."""
    g = torch.Generator().manual_seed(2)
    inside = {"a": torch.randn(60, generator=g, dtype=torch.float64), "b": torch.randn(60, generator=g).double()}
    near, far = torch.randn(20, generator=g).double(), torch.randn(20, generator=g).double() + 10
    others = {"a": torch.stack([far, near], 1).flatten(), "b": torch.stack([near, far], 1).flatten()}
    c = choose_with_others(inside, others, 0.95)
    assert c.score == "a" and c.others_auroc == 1.0 and (c.others, c.others_chose, c.others_measured) == (40, 20, 20)
    assert c.others_turned_away == pytest.approx(float((near > c.threshold).double().mean()))
    assert (c.threshold, c.kept) == threshold_with_others(inside["a"], far, 0.95)
    one = choose_with_others({"a": inside["a"]}, {"a": far[:1]}, 0.95)  # one photo: it chooses and measures
    assert (one.others, one.others_chose, one.others_measured, one.others_turned_away) == (1, 1, 1, 1.0)


def test_vim_matches_the_papers_reference_code():
    """ViM (Wang et al. 2022) against their published numpy recipe (haoqiwang/vim, benchmark.py): the origin
    u = -pinv(W) b, the eigenvectors of the uncentred covariance of f - u beyond the k = D/2 largest eigenvalues,
    alpha = mean max logit / mean residual norm on training features, score_id = -alpha |(f - u) NS| + logsumexp z
    (ours is its negative: higher = less like the training images)."""
    g = torch.Generator().manual_seed(4)
    D, C = 12, 5
    W, b = torch.randn(C, D, generator=g), torch.randn(C, generator=g)
    train = torch.randn(300, D, generator=g) * torch.linspace(3, 0.2, D)  # a clear principal subspace
    test = torch.randn(20, D, generator=g)
    stats = fit_statistics("vim", train, torch.arange(300) % C, C, (W, b))
    ours = ood_scores("vim", probs=torch.ones(20, C) / C, logits=[test @ W.T + b], features=[test], statistics=stats)

    Wn, bn, tr, te = (t.double().numpy() for t in (W, b, train, test))
    u = -np.matmul(np.linalg.pinv(Wn), bn)
    cov = (tr - u).T @ (tr - u) / len(tr)  # sklearn's EmpiricalCovariance(assume_centered=True)
    eig_vals, eigen_vectors = np.linalg.eig(cov)
    NS = np.ascontiguousarray((eigen_vectors.T[np.argsort(eig_vals * -1)[D // 2 :]]).T)
    alpha = (tr @ Wn.T + bn).max(axis=-1).mean() / np.linalg.norm(np.matmul(tr - u, NS), axis=-1).mean()
    logits = te @ Wn.T + bn
    energy = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    score_id = -np.linalg.norm(np.matmul(te - u, NS), axis=-1) * alpha + energy
    assert np.allclose(ours.numpy(), -score_id, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="head"):
        fit_statistics("vim", train, torch.arange(300) % C, C)


# ------------------------------------------------------------------------------------ stored with the checkpoint


def _calibrated(model: vit_core.VisionTransformer, score: str = "mahalanobis") -> Calibration:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 3, 16, 16, generator=g)
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
    stats = fit_statistics(score, features, torch.arange(40) % 10, 10, (model.head.weight, model.head.bias))
    detector = OODDetector(score, 12.5, 0.95, stats, "40 random images")
    return Calibration(0.75, "flip", "flip views of 40 random images", detector)


@pytest.mark.parametrize("score", ["mahalanobis", "relative_mahalanobis", "knn", "energy", "vim"])
def test_calibration_survives_save_and_load_and_timm_still_loads(tmp_path, score):
    model = _model()
    model.calibration = _calibrated(model, score)
    vit_core.save_pretrained(model, tmp_path / "m")
    d = json.loads((tmp_path / "m" / "config.json").read_text())
    assert d["calibration"]["temperature"] == 0.75 and d["calibration"]["ood"]["score"] == score
    assert (tmp_path / "m" / OOD_NAME).is_file() == (score != "energy")

    loaded = vit_core.from_pretrained(tmp_path / "m")
    cal, want = loaded.calibration, model.calibration
    assert (cal.temperature, cal.tta, cal.fitted_on) == (0.75, "flip", want.fitted_on)
    assert (cal.ood.score, cal.ood.threshold, cal.ood.keep, cal.ood.fitted_on) == (
        score,
        12.5,
        0.95,
        "40 random images",
    )
    assert cal.ood.statistics.keys() == want.ood.statistics.keys()
    for k, v in want.ood.statistics.items():
        assert torch.equal(cal.ood.statistics[k], v)
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    a, b = predict(model, x), predict(loaded, x)
    assert torch.equal(a.probs, b.probs) and torch.equal(a.ood_score, b.ood_score) and torch.equal(a.is_ood, b.is_ood)

    ref = timm.create_model(f"local-dir:{tmp_path / 'm'}", pretrained=True).eval()  # ignores the calibration
    with torch.no_grad():
        assert torch.allclose(ref(x), loaded(x), atol=1e-5)
    assert vit_core.from_pretrained(tmp_path / "m", img_size=32).calibration is None  # other outputs: not calibrated
    assert vit_core.from_pretrained(tmp_path / "m", drop_path_rate=0.1).calibration is not None


def test_predict_applies_the_temperature_and_the_threshold():
    model = _model()
    model.calibration = _calibrated(model)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    p = predict(model, x)
    with torch.no_grad():
        z, zm = model(x).double(), model(x.flip(-1)).double()
        f, fm = (model.forward_head(model.forward_features(v), pre_logits=True) for v in (x, x.flip(-1)))
    assert torch.allclose(p.probs.double(), ((z / 0.75).softmax(-1) + (zm / 0.75).softmax(-1)) / 2, atol=1e-6)
    stats = model.calibration.ood.statistics
    want = ood_scores("mahalanobis", probs=p.probs, logits=[z, zm], features=[f, fm], statistics=stats)
    assert torch.allclose(p.ood_score, want) and torch.equal(p.is_ood, want > 12.5)


def test_a_model_without_calibration_behaves_as_before(tmp_path):
    model = _model()
    vit_core.save_pretrained(model, tmp_path / "m")
    assert "calibration" not in json.loads((tmp_path / "m" / "config.json").read_text())
    loaded = vit_core.from_pretrained(tmp_path / "m")
    assert loaded.calibration is None
    x = torch.randn(5, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    p = predict(loaded, x, return_attention=True)
    with torch.no_grad():
        logits, attentions = loaded(x, return_attention=True)
        mirror = (logits.softmax(-1) + loaded(x.flip(-1)).softmax(-1)) / 2  # as the app: the image and its mirror
    assert torch.allclose(p.probs, mirror, atol=1e-6) and p.ood_score is None and p.is_ood is None
    assert all(torch.equal(a, b) for a, b in zip(p.attentions, attentions, strict=True))
    names = loaded.class_names
    for probs in p.probs:  # the verdict without a detector is today's rule
        top = float(probs.max())
        text = verdict(probs, names)
        assert text == verdict(probs, names, is_ood=None)
        assert text.startswith("Not sure") == (top < UNSURE_BELOW)
    said = facts(loaded)  # what the Classify tab says about the model
    assert "not calibrated" in said and "whatever the image shows" in said


def test_a_detector_without_a_temperature_keeps_the_plain_softmax(tmp_path):
    """A model that saw its held-out images stores no temperature: its probabilities stay the softmax (calibration
    unknown) while its OOD detector works."""
    model = _model()
    cal = _calibrated(model)
    model.calibration = Calibration(None, "flip", "no temperature: seen", cal.ood)
    vit_core.save_pretrained(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["calibration"]["temperature"] is None
    loaded = vit_core.from_pretrained(tmp_path / "m")
    assert loaded.calibration.temperature is None and loaded.calibration.ood.threshold == 12.5
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(6))
    p = predict(loaded, x)
    with torch.no_grad():
        mirror = (loaded(x).softmax(-1) + loaded(x.flip(-1)).softmax(-1)) / 2
    assert torch.allclose(p.probs, mirror, atol=1e-6) and p.is_ood is not None
    said = facts(loaded)
    assert "not calibrated" in said and "says so when an image looks like none of them" in said


def test_the_ood_verdict_names_the_closest_class():
    probs = torch.tensor([0.05, 0.02, 0.31, 0.12, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05])
    text = verdict(probs, list(LABELS), is_ood=True)
    assert text == "Not one of my 10 classes — most like: bird"
    assert verdict(probs, list(LABELS), is_ood=False).startswith("Not sure — maybe bird (31%)")
    model = _model()
    model.calibration = _calibrated(model)
    said = facts(model)
    assert "calibrated (temperature 0.75" in said and "not calibrated" not in said and "none of them" in said


def test_bad_calibrations_are_refused_naming_the_problem(tmp_path):
    model = _model()
    model.calibration = _calibrated(model)
    vit_core.save_pretrained(model, tmp_path / "m")
    config = tmp_path / "m" / "config.json"
    good = json.loads(config.read_text())

    def refused(change, match):
        d = json.loads(json.dumps(good))
        change(d)
        config.write_text(json.dumps(d))
        with pytest.raises(vit_core.CheckpointError, match=match):
            vit_core.from_pretrained(tmp_path / "m")

    refused(lambda d: d["calibration"].update(temperature=-1), "temperature must be null or a number")
    refused(lambda d: d["calibration"].update(temperature="hot"), "temperature must be null or a number")
    refused(lambda d: d["calibration"]["ood"].update(score="vibes"), "ood.score must be one of")
    refused(lambda d: d["calibration"]["ood"].update(threshold=float("nan")), "threshold must be a finite number")
    refused(lambda d: d["calibration"]["ood"].update(file="../model.safetensors"), "must be 'ood.safetensors'")
    refused(lambda d: d["calibration"]["ood"].update(sha256="0" * 64), "SHA-256 differs")
    refused(lambda d: d.update(calibration=[1]), "calibration must be a JSON object")
    # statistics of another model (other feature width) do not fit
    other = _model(embed_dim=16)
    write_calibration(tmp_path / "m", _calibrated(other))
    config_other = json.loads(config.read_text())
    config.write_text(json.dumps(good | {"calibration": config_other["calibration"]}))
    with pytest.raises(vit_core.CheckpointError, match="does not fit the mahalanobis score of this model"):
        vit_core.from_pretrained(tmp_path / "m")
    (tmp_path / "m" / OOD_NAME).unlink()
    with pytest.raises(vit_core.CheckpointError, match="no ood.safetensors"):
        vit_core.from_pretrained(tmp_path / "m")


def test_write_calibration_keeps_the_rest_of_the_config_and_a_new_head_drops_it(tmp_path):
    model = _model()
    vit_core.save_pretrained(model, tmp_path / "m")
    before = json.loads((tmp_path / "m" / "config.json").read_text())
    weights = (tmp_path / "m" / "model.safetensors").read_bytes()
    write_calibration(tmp_path / "m", _calibrated(model))
    after = json.loads((tmp_path / "m" / "config.json").read_text())
    assert {k: v for k, v in after.items() if k != "calibration"} == before
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == weights
    loaded = vit_core.from_pretrained(tmp_path / "m")
    assert loaded.calibration is not None
    loaded.reset_classifier(3, ["a", "b", "c"])
    assert loaded.calibration is None
    write_calibration(tmp_path / "m", None)
    assert "calibration" not in json.loads((tmp_path / "m" / "config.json").read_text())


def test_model_card_shows_calibration_or_says_it_is_unknown():
    cfg = _model().config
    evals = [{"data": "cifar10", "split": "test", "tta": "flip", "count": 10000, "top1": 91.0, "ece": 0.0123}]
    cal = {
        "temperature": 0.76,
        "tta": "flip",
        "fitted_on": "held-out images",
        "ood": {"score": "mahalanobis", "threshold": 738.1, "keep": 0.95, "fitted_on": "training images"},
    }
    calibrated = [e | {"temperature": 0.76, "ece_uncalibrated": 0.065} for e in evals]
    images = ["curves.png", "reliability_test_flip.png"]
    card = render_model_card(cfg, "me/m", CardFacts(calibration=cal, evals=calibrated, images=images))
    section = card.split("## Calibration")[1].split("\n## ")[0]
    assert "T = 0.76" in section and "| cifar10 test, flip views | 10000 | 91.00% | 0.0650 | 0.0123 |" in section
    assert "738" not in section and "less like the training images than 95% of the held-out" in section  # no raw score
    assert "![reliability_test_flip](reliability_test_flip.png)" in section
    assert "reliability_test_flip" not in card.split("## Training curves")[1]
    card = render_model_card(cfg, "me/m", CardFacts(evals=evals))
    assert "Calibration unknown" in card and "| 0.0123 | - |" in card


# ------------------------------------------------------------------------------------ command line, data


def test_train_calibrate_then_eval_writes_ece_and_the_reliability_diagram(tmp_path, capsys):
    data = make_image_folder(tmp_path / "data", n_per_class=30)
    for i in range(0, 30, 4):  # label noise: a quarter of the training images in the other class's folder
        (data / "train" / "blue" / f"0_{i}.png").rename(data / "train" / "red" / f"x0_{i}.png")
        (data / "train" / "red" / f"1_{i}.png").rename(data / "train" / "blue" / f"x1_{i}.png")
    run = tmp_path / "run"
    recipe = ["--recipe", "mnist_tiny", "--data", str(data), "--out", str(run), "--device", "cpu", "--no-progress"]
    tiny = "{'img_size': 8, 'patch_size': 4, 'embed_dim': 16, 'depth': 1, 'num_heads': 2, 'crop_pct': 1.0}"
    sets = ["--set", f"model_args={tiny}", "augment={'crop': 'none', 'hflip': False}", "model=None"]
    assert main([*recipe, "--epochs", "2", "--batch-size", "8", "--subset", "40", *sets, "warmup_epochs=0"]) == 0
    capsys.readouterr()
    cal = ["calibrate", "--model", str(run), "--held-out", "40", "60", "--fit", "0", "40", "--device", "cpu"]
    assert main([*cal, "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "note:" not in out.err  # trained on images [0, 40): the held-out ones were not seen
    model = vit_core.from_pretrained(run)
    assert model.calibration.ood.score == "mahalanobis" and "[40, 60)" in model.calibration.fitted_on

    # the stored temperature is the NLL minimum of the flip views of held-out images 40..59 (brute force)
    from vit_core.data import build_transform, fixed_subset

    held = fixed_subset(build_dataset(str(data), "train", build_transform(model.pretrained_cfg)), [40, 60])
    x, y = torch.stack([held[i][0] for i in range(20)]), torch.tensor([held[i][1] for i in range(20)])
    with torch.no_grad():
        views = [model(x).double().numpy(), model(x.flip(-1)).double().numpy()]
    grid = np.exp(np.linspace(math.log(0.05), math.log(20), 3000))
    best = grid[int(np.argmin([_numpy_nll(views, [0.5, 0.5], y.numpy(), t) for t in grid]))]
    assert 0.1 < best < 10 and model.calibration.temperature == pytest.approx(best, rel=5e-3)

    # images the run trained on: the temperature is measured and reported, not stored; the OOD detector is
    seen = ["calibrate", "--model", str(run), "--held-out", "0", "20", "--fit", "20", "40", "--device", "cpu"]
    assert main([*seen, "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "note: the run's recipe trained on the held-out images 0..19" in out.err and "(not stored)" in out.out
    calibration = vit_core.from_pretrained(run).calibration
    assert calibration.temperature is None and "not stored" in calibration.fitted_on and calibration.ood is not None
    assert main([*cal, "--no-progress"]) == 0  # back to the unseen images
    capsys.readouterr()

    assert (
        main(["eval", "--model", str(run), "--data", str(data), "--device", "cpu", "--no-progress", "--tta", "flip"])
        == 0
    )
    out = capsys.readouterr().out
    saved = json.loads((run / "eval_test_flip.json").read_text())
    assert saved["temperature"] == pytest.approx(model.calibration.temperature)
    assert f"calibration error (ECE, 15 bins): {saved['ece']:.4f}" in out
    test = build_dataset(str(data), "test", build_transform(model.pretrained_cfg))
    xt, yt = torch.stack([test[i][0] for i in range(len(test))]), test.targets
    assert saved["ece"] == pytest.approx(expected_calibration_error(predict(model, xt).probs, yt), abs=1e-6)
    assert sum(saved["reliability"]["count"]) == len(test)
    assert Image.open(run / "reliability_test_flip.png").format == "PNG"


def test_class_subset_keeps_and_relabels_the_named_classes(tmp_path):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (30, 1, 4, 4), generator=g, dtype=torch.uint8)
    targets = torch.arange(30) % 5
    ds = InMemoryImageDataset(images, targets, ["a", "b", "c", "d", "e"])
    sub = class_subset(ds, ["d", "b"])
    keep = [i for i in range(30) if targets[i] in (3, 1)]
    assert sub.classes == ["d", "b"] and torch.equal(sub.images, images[keep])
    assert sub.targets.tolist() == [0 if targets[i] == 3 else 1 for i in keep]
    folder = build_dataset(str(make_image_folder(tmp_path / "data", n_per_class=4)), "train")
    only_red = class_subset(folder, ["red"])
    assert len(only_red) == 4 and {only_red[i][1] for i in range(4)} == {0} and only_red.classes == ["red"]
    with pytest.raises(vit_core.data.ImageDataError, match="distinct names of the data's classes"):
        class_subset(ds, ["z"])


def test_a_new_ood_score_is_one_entry_of_the_table(tmp_path, monkeypatch, capsys):
    """Adding a score is an entry of ``ood.SCORES`` plus its functions, and no other code (docs/extending.md's
    example, run from the page): here the distance to
    the mean of the training images' features, through ``train calibrate`` (its statistic fitted on training
    images [0, 40), its threshold the 95% quantile of held-out images [40, 60)), the checks on loading (the
    file's shapes against the entry's), ``from_pretrained`` and ``predict``, each against brute force."""

    doc: dict = {}
    exec(marked_block("score"), doc)  # docs/extending.md's example score, added as the page says
    monkeypatch.setitem(ood.SCORES, "centre", doc["CENTRE"])
    data = make_image_folder(tmp_path / "data", n_per_class=30)
    folder = tmp_path / "m"
    vit_core.save_pretrained(_model(img_size=8, patch_size=4, num_classes=2, label_names=("blue", "red")), folder)
    cal = ["calibrate", "--model", str(folder), "--data", str(data), "--ood", "centre", "--device", "cpu"]
    assert main([*cal, "--held-out", "40", "60", "--fit", "0", "40", "--no-progress"]) == 0
    capsys.readouterr()

    model = vit_core.from_pretrained(folder)
    detector = model.calibration.ood
    assert detector.score == "centre" and detector.keep == 0.95

    def images(lo: int, hi: int) -> torch.Tensor:
        subset = fixed_subset(build_dataset(str(data), "train", build_transform(model.pretrained_cfg)), [lo, hi])
        return torch.stack([subset[i][0] for i in range(hi - lo)])

    with torch.no_grad():
        fitted = model.forward_head(model.forward_features(images(0, 40)), pre_logits=True).double()
    assert torch.allclose(detector.statistics["centre"].double(), fitted.mean(0), atol=1e-6)
    held = images(40, 60)
    p = predict(model, held)
    with torch.no_grad():
        views = [model.forward_head(model.forward_features(v), pre_logits=True) for v in (held, held.flip(-1))]
    want = torch.stack([(f.double() - fitted.mean(0)).norm(dim=-1) for f in views]).mean(0)
    assert torch.allclose(p.ood_score, want, atol=1e-5)
    assert detector.threshold == pytest.approx(float(torch.quantile(want, 0.95)), rel=1e-5)
    assert torch.equal(p.is_ood, p.ood_score > detector.threshold) and int(p.is_ood.sum()) == 1  # 1 of 20 above

    from safetensors.torch import save_file

    save_file({"centre": torch.zeros(3)}, str(folder / OOD_NAME))  # the wrong shape for this model's features
    with pytest.raises(vit_core.CheckpointError, match=r"does not fit the centre score.*centre: checkpoint \(3,\)"):
        vit_core.from_pretrained(folder)
