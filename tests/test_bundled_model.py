"""The app's bundled default model: loads offline, is the checkpoint its card describes, classifies real data
and the app's example photos, and carries the calibration its card reports."""

import json
import re

import pytest
import torch

import vit_core
from train import load_recipe
from vit_core.calibration import TTA_MODES, expected_calibration_error, predict
from vit_core.data import build_dataset, build_transform, default_data_root, load_image
from vit_core.training.recipe import Recipe
from webapp.registry.catalog import BUNDLED as BUNDLE
from webapp.registry.catalog import BUNDLED_RECIPES, ROOT


def test_bundle_is_small_and_is_the_recipes_model():
    assert sum(p.stat().st_size for p in BUNDLE.iterdir()) < 25e6
    model = vit_core.from_pretrained(BUNDLE)
    assert model.label_names == json.loads((BUNDLE / "config.json").read_text())["label_names"]
    assert len(model.label_names) == 10
    # the recipes that trained it, in order (a later stage continues from the earlier one's model)
    files = [f"stage{i}_recipe.json" for i in range(1, len(BUNDLED_RECIPES))] + ["recipe.json"]
    stages = [json.loads((BUNDLE / f).read_text()) for f in files]
    for stage, name in zip(stages, BUNDLED_RECIPES, strict=True):
        # (read back through Recipe: recipe keys added since, such as classes, take their defaults)
        assert Recipe.from_dict(stage).to_dict() == Recipe.from_dict(load_recipe(name)).to_dict()
    assert model.config.stem_channels == tuple(stages[0]["model_args"]["stem_channels"])
    assert model.config.grid_size == (8, 8)


@pytest.mark.skipif(not (default_data_root() / "cifar10").is_dir(), reason="CIFAR-10 not found under VIT_DATA")
def test_bundle_reaches_its_reported_accuracy_on_cifar10_test():
    model = vit_core.from_pretrained(BUNDLE).eval()
    test = build_dataset("cifar10", "test", transform=build_transform(model.pretrained_cfg))
    idx = torch.arange(0, 10000, 5)  # 2,000 test images, every fifth
    with torch.no_grad():
        pred = torch.cat([model(test.transform(test.images[i])).argmax(-1) for i in idx.split(500)])
    accuracy = (pred == test.targets[idx]).float().mean().item()
    reported = json.loads((BUNDLE / "eval_test.json").read_text())["top1"] / 100  # `train eval`, all 10,000
    assert accuracy == pytest.approx(reported, abs=0.02)


@pytest.mark.parametrize(
    "photo", sorted(p.name for p in (ROOT / "examples").glob("*.jpg") if not p.name.startswith("ood_"))
)
def test_bundle_classifies_the_app_examples(photo):
    """Every example photo of a CIFAR-10 class is named <class>_<what>.jpg and the default model gets it right,
    as the app predicts: the mean over the views the bundle was calibrated for."""
    model = vit_core.from_pretrained(BUNDLE).eval()
    x = build_transform(model.pretrained_cfg)(load_image(ROOT / "examples" / photo))[None]
    predicted = model.label_names[predict(model, x).probs.argmax(-1).item()]
    assert predicted == photo.split("_")[0]


@pytest.mark.skipif(not (default_data_root() / "cifar10").is_dir(), reason="CIFAR-10 not found under VIT_DATA")
@pytest.mark.slow  # 1-2 minutes on 2 cores: the bundle's stored numbers, re-derived (pytest -m slow)
def test_bundle_is_calibrated_as_its_eval_reports():
    """The stored calibration loads: a temperature and an OOD detector fitted on training images 45,000-49,999,
    which the bundle's recipe never trained on, for the views the app averages. On every fifth test image the
    ECE of those views is the one ``train eval --tta`` recorded for all 10,000 (within sampling noise), under
    the softmax's, and about a tenth of the images are flagged (the threshold keeps 90% of the held-out images)."""
    model = vit_core.from_pretrained(BUNDLE).eval()
    cal = model.calibration
    assert cal is not None and cal.temperature is not None and cal.tta in TTA_MODES and "seen" not in cal.fitted_on
    assert load_recipe(BUNDLED_RECIPES[0])["train_subset"] == [0, 45000] and "[45000, 50000)" in cal.fitted_on
    assert cal.ood is not None and cal.ood.score == "mahalanobis" and cal.ood.keep == 0.90
    test = build_dataset("cifar10", "test", transform=build_transform(model.pretrained_cfg))
    idx = torch.arange(0, 10000, 5)
    preds = [predict(model, test.transform(test.images[i])) for i in idx.split(500)]
    probs, flagged = torch.cat([p.probs for p in preds]), torch.cat([p.is_ood for p in preds])
    recorded = json.loads((BUNDLE / f"eval_test_{cal.tta}.json").read_text())
    assert recorded["temperature"] == pytest.approx(cal.temperature) and recorded["ece"] < recorded["ece_uncalibrated"]
    assert expected_calibration_error(probs, test.targets[idx]) == pytest.approx(recorded["ece"], abs=0.015)
    assert 0.05 < flagged.float().mean().item() < 0.15  # the threshold keeps 90% of held-out training images


@pytest.mark.skipif(not (default_data_root() / "cifar10").is_dir(), reason="CIFAR-10 not found under VIT_DATA")
@pytest.mark.slow  # 1-2 minutes on 2 cores: the bundle's stored numbers, re-derived (pytest -m slow)
def test_the_ood_bench_fits_the_detector_the_bundle_stores():
    """``bench.ood`` and ``bench.detector_choice`` refit every score as ``train calibrate`` fitted the stored one:
    on training images 0-9,999 and the recipe's photos. Their Mahalanobis statistics are the bundle's own, so
    their decisions are the app's."""
    from bench.ood import fit_all

    model = vit_core.from_pretrained(BUNDLE).eval()
    stored = model.calibration.ood.statistics
    with torch.no_grad():
        refit = fit_all(model, "cifar10", BUNDLE)["mahalanobis"]
    for key, value in stored.items():
        torch.testing.assert_close(refit[key], value, rtol=1e-3, atol=1e-3, msg=key)


# Where the docs quote the bundle's measured numbers: (file, pattern); each pattern matches once, its groups named
# for the number they quote (SOURCES), which comes from the files `train eval` and `train calibrate` wrote.
CARD = "models/cifar10_speedrun/README.md"
NUMBER = r"(?P<{}>[\d.,]+)"
CLAIMS = [
    (
        "README.md",
        r"\[\*\*{app}%\*\*\]\([^)]*\) CIFAR-10 test top-1 as the app predicts "
        r"\(six views; {single}% single view\); calibrated ECE {ece};",
    ),
    ("docs/app.md", r"for the bundle {single}% → {app}% on\s+CIFAR-10, flips alone {flip}%"),
    (
        "docs/app.md",
        r"bundled model {single}% on the 10,000 CIFAR-10 test images, {app}% with its flip-translate views",
    ),
    ("docs/training.md", r"\*\*{app}%\*\* as the app predicts \({single}%\s+single view, ECE {ece}\)"),
    ("docs/calibration.md", r"\| bundled model \([^)]*\) \| single \| 10,000 \| {single}% \|"),
    (
        "docs/calibration.md",
        r"\| bundled model \([^)]*\) \| flip-translate \(the app\) \| 10,000 \| {app}% "
        r"\| [\d.]+ \| \*\*{ece}\*\* \| {temperature} \|",
    ),
    (CARD, r"value: {app}\n"),
    (CARD, r"\*\*{app}%\*\* on the 10,000 test images as\s+the app predicts"),
    (CARD, r"\| single view \| \*\*{single}%\*\*"),
    (CARD, r"\| `--tta flip` \(the mean with the mirrored image\) \| \*\*{flip}%\*\*"),
    (CARD, r"six views: what the app shows\) \| \*\*{app}%\*\*"),
    (CARD, r"\| with flip-translate \(what the app shows\) \| [\d.]+ \| \*\*{ece}\*\* \|"),
    (CARD, r"\*\*Temperature {temperature}\*\*"),
    (CARD, r"Above \*\*{threshold}\*\* an image is out of distribution"),
    (
        "train/recipes/README.md",
        r"\*\*the app's bundled model\*\*[^\n]*\| \*\*{single}%\*\* \({flip}% flip TTA, "
        r"\*\*{app}% flip-translate\*\*, as the app predicts; calibrated flip-translate ECE {ece};",
    ),
]


def test_the_bundles_numbers_are_quoted_as_measured_everywhere():
    """Every place the docs quote the bundle's accuracy (single view, flips, the app's six views), ECE, temperature
    or threshold says what ``train eval`` and ``train calibrate`` wrote beside the weights (the one source; the app's
    Inspect tab reads those files itself): a copy left behind when the bundle changes fails here."""
    evals = {tta: json.loads((BUNDLE / f"eval_test{tta}.json").read_text()) for tta in ("", "_flip", "_flip-translate")}
    cal = vit_core.from_pretrained(BUNDLE).calibration
    sources = {
        "single": evals[""]["top1"],
        "flip": evals["_flip"]["top1"],
        "app": evals["_flip-translate"]["top1"],
        "ece": evals["_flip-translate"]["ece"],
        "temperature": cal.temperature,
        "threshold": cal.ood.threshold,
    }
    checked = set()
    for doc, claim in CLAIMS:
        pattern = claim.format(**{name: NUMBER.format(name) for name in sources})
        found = list(re.finditer(pattern, (ROOT / doc).read_text()))
        assert len(found) == 1, f"{doc}: {len(found)} matches of {pattern}"
        for name, quoted in found[0].groupdict().items():
            decimals = len(quoted.partition(".")[2])
            assert float(quoted.replace(",", "")) == round(sources[name], decimals), f"{doc}: {name} {quoted}"
            checked.add(name)
    assert checked == set(sources)
