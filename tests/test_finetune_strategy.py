"""Fine-tuning that fits its budget (``finetune.lpft``): the strategy chosen from the measured speed, the probe's
cached features and its fit, the probe's calibration from those features, LP-FT's frozen blocks; and the command
line's budget ETA, the missing bundled model and a temperature the held-out images cannot set; photos of other
things (an ``_other`` folder) setting the "none of my classes" threshold."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

import vit_core
from train.__main__ import main as train_main
from vit_core.calibration import MIN_TEMPERATURE, at_search_edge, fit_temperature, predict
from vit_core.calibration.ood import OTHERS_SCORES
from vit_core.data import build_transform, load_image
from vit_core.finetune import PROBE_NAME, FinetuneOptions, Monitor, Progress, finetune_folder
from vit_core.finetune.held_out import held_out_files
from vit_core.finetune.lpft import FeatureNet, FeaturePairs, cache_features, fit_probe
from vit_core.finetune.stages import Plan, StageRecord
from vit_core.training.evaluation import CalibrationImages, calibrate_model
from vit_core.training.progress import ProgressLine
from vit_core.training.recipe import RecipeError

from .test_engine import TINY, make_image_folder, one_thread  # noqa: F401  (autouse fixture)

REPO = Path(__file__).resolve().parents[1]
QUICK = dict(epochs=2, batch_size=8, cpu_precision="fp32", channels_last=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Two classes of 24 noisy squares (``train/``) and a tiny 2-block ViT to start from."""
    root = tmp_path_factory.mktemp("photos")
    make_image_folder(root, n_per_class=24, size=12)
    init = vit_core.create_model(vit_core.ViTConfig(**(TINY | dict(depth=2)), num_classes=10))
    vit_core.save_pretrained(init, root / "init")
    return root


def test_the_progress_line_eta_is_the_budgets(monkeypatch, capsys):
    """100 epochs of 4 one-second steps would take 400 s; a 60 s budget ends the run after 60, so after 4 steps
    the line says 56 s are left."""
    clock = iter(range(1000))
    monkeypatch.setattr("vit_core.training.progress.time.time", lambda: float(next(clock)))
    bar = ProgressLine(0, 100, 4, enabled=True, budget_s=60)
    for i in range(4):
        bar.step(0, i, torch.tensor(0.5), 0.01)
    bar.close()
    assert "ETA 0:00:56" in capsys.readouterr().err


def test_an_installed_recipe_without_its_bundled_model_says_what_to_give(folder, tmp_path, capsys):
    """The recipe file as ``pip install .`` places it (``site-packages/train/recipes/``): no ``models/`` beside it."""
    recipe = tmp_path / "site" / "train" / "recipes" / "finetune_folder.py"
    recipe.parent.mkdir(parents=True)
    shutil.copy(REPO / "train" / "recipes" / "finetune_folder.py", recipe)
    argv = ["--recipe", str(recipe), "--data", str(folder / "train"), "--out", str(tmp_path / "run")]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert "--init" in err and "timm:" in err and "bundled model cifar10_speedrun" in err
    assert "no such file" not in err and not (tmp_path / "run").exists()


def test_a_temperature_at_the_edge_of_its_search_is_not_kept(folder, tmp_path):
    """Held-out images all right with a wide margin: the fit runs to T = 0.011, the grid's end; the model keeps
    T = 1 and its calibration says why. (Three images a class, one held out; the head alone trained: a probe's
    margins on two clean training images a class are wide.)"""
    logits = [torch.tensor([[4.0, -4.0], [-4.0, 4.0]])]
    t = fit_temperature(logits, [1.0], torch.tensor([0, 1]))
    assert t < 1.2 * MIN_TEMPERATURE and at_search_edge(t) and not at_search_edge(1.0) and not at_search_edge(0.05)
    tiny = tmp_path / "tiny"
    for cls in ("blue", "red"):
        (tiny / cls).mkdir(parents=True)
        for f in sorted((folder / "train" / cls).iterdir())[:3]:
            shutil.copy(f, tiny / cls / f.name)
    r = finetune_folder(
        tiny,
        folder / "init",
        tmp_path / "run",
        options=FinetuneOptions(minutes=None, strategy="probe", overrides=dict(QUICK, batch_size=2)),
    )
    assert (r.train_images, r.val_images) == (4, 2) and r.val_accuracy == 100 and r.temperature == 1.0
    cal = vit_core.from_pretrained(tmp_path / "run").calibration
    assert cal.temperature == 1.0 and cal.fitted_on.startswith("T = 1 kept: the held-out images could not set")
    assert "could not set the temperature" in (tmp_path / "run" / "README.md").read_text()


def test_the_stages_follow_what_is_left_and_the_epochs_they_ran():
    """After the probe: the last half of the blocks for a third of what is left where the whole model affords 2
    epochs in the rest, else all of it to the most blocks that afford theirs, else nothing; after a stage, the
    whole model where it affords 2 epochs at the speed that stage measured, else the blocks it trained."""
    probe = StageRecord("linear probe", "probe", 0, 1, 1, 400, 1.0, 70.0)
    # an epoch of k of 12 blocks: 200 * 0.01 * (1 + 2 k / 12) + 50 * 0.01 = 2.5 + k / 3 s; decoding 250 * 4 ms = 1 s
    plan = Plan(0.01, 200, 50, 12)
    plan.measured(probe)
    assert plan.next_stage(180) == (6, 60)  # the whole model: 6.5 s an epoch, 13 s in 2/3 of 179 s
    assert plan.next_stage(12) == (6, 12)  # 2/3 of 11 s is under 13 s: all of it to the last 6 blocks (4.5 s)
    assert plan.next_stage(9) == (4, 9)  # 8 s left: 6 blocks need 9 s, 4 need 7.7
    assert plan.next_stage(5) is None  # even one block needs 5.7 s
    plan.measured(StageRecord("last 6 of 12 blocks", "lp-ft", 6, 4, 24, 768, 37.0, 75.0), setup_s=1.0)
    assert plan.scale == pytest.approx(2.0)  # 36 s for 4 epochs estimated at 4.5 s: twice as slow as thought
    assert plan.next_stage(30) == (12, 30) and plan.next_stage(20) == (6, 20) and plan.next_stage(10) is None


def test_cached_features_equal_a_fresh_forward_of_each_file(folder):
    model = vit_core.from_pretrained(folder / "init").eval()
    dataset = vit_core.data.build_dataset(
        str(folder / "train"), "train", transform=build_transform(model.pretrained_cfg)
    )
    plain = cache_features(model, dataset, batch_size=7)
    mirror = cache_features(model, dataset, batch_size=7, mirror=True)
    tf = build_transform(model.pretrained_cfg)
    for i, (path, _) in enumerate(dataset.samples):
        x = tf(load_image(path))[None]
        with torch.no_grad():
            ref = model.forward_head(model.forward_features(x), pre_logits=True)
            ref_mirror = model.forward_head(model.forward_features(x.flip(-1)), pre_logits=True)
        torch.testing.assert_close(plain[i], ref[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mirror[i], ref_mirror[0], rtol=1e-5, atol=1e-5)


def test_the_probe_minimises_its_objective_and_separates_about_as_well_as_any_line():
    """Two overlapping Gaussian blobs in 2-D. Its objective is no higher than the least of a brute-force grid over
    every two-class logistic model (the logit difference v.x + c; the L2 term then wd/4 |v|^2), and its training
    accuracy is within 3 points of the best line (3,600 directions x every cut along each)."""
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(100, 2, generator=g) + torch.tensor([2.0, 1.0]), torch.randn(100, 2, generator=g)])
    y = torch.cat([torch.zeros(100), torch.ones(100)]).long()
    w, b = fit_probe(x, y, 2, weight_decay=1e-2)
    z = x.double() @ w.double().T + b.double()
    loss = torch.nn.functional.cross_entropy(z, y).item() + 1e-2 / 2 * w.double().square().sum().item()
    axis = torch.linspace(-4, 4, 81, dtype=torch.float64)
    v1, v2, c = torch.meshgrid(axis, axis, axis, indexing="ij")
    d = v1.reshape(-1, 1) * x[:, 0].double() + v2.reshape(-1, 1) * x[:, 1].double() + c.reshape(-1, 1)
    sign = 2 * y.double() - 1  # class 1's logit minus class 0's is d
    grid = torch.nn.functional.softplus(-sign * d).mean(1) + 1e-2 / 4 * (v1.square() + v2.square()).reshape(-1)
    assert loss <= grid.min().item() + 1e-9
    probe = ((z.argmax(-1) == y).double().mean()).item()
    best = 0.0
    for k in range(3600):
        a = 2 * math.pi * k / 3600
        order = (x @ torch.tensor([math.cos(a), math.sin(a)])).argsort()
        ones_below = torch.cat([torch.zeros(1), (y[order] == 1).cumsum(0).float()])  # class 1 below each cut
        zeros_above = (y == 0).sum() - torch.cat([torch.zeros(1), (y[order] == 0).cumsum(0).float()])
        best = max(best, ((ones_below + zeros_above).max() / len(y)).item())
    assert best - 0.03 <= probe <= best


def test_the_probe_calibrated_from_cached_features_as_from_the_model_itself(folder):
    """``FeatureNet`` over (image, mirror) feature pairs gives ``calibrate_model`` what the model gives it from
    the images: the same temperature, OOD statistics and threshold."""
    model = vit_core.from_pretrained(folder / "init").eval()
    model.reset_classifier(2, ["blue", "red"])
    torch.nn.init.normal_(model.head.weight, generator=torch.Generator().manual_seed(0))
    tf = build_transform(model.pretrained_cfg)
    data = vit_core.data.build_dataset(str(folder / "train"), "train", transform=tf)
    held, fit = torch.utils.data.Subset(data, range(0, 48, 3)), torch.utils.data.Subset(data, range(1, 48, 3))
    held.transform = fit.transform = None
    held_pairs, fit_pairs = (
        FeaturePairs(cache_features(model, d), cache_features(model, d, mirror=True), data.targets[d.indices])
        for d in (held, fit)
    )
    direct, report = calibrate_model(model, CalibrationImages(held, "h", fit, "f"), progress=False)
    cached_images = CalibrationImages(held_pairs, "h", fit_pairs, "f")
    cached, report_cached = calibrate_model(FeatureNet(model), cached_images, progress=False)
    assert cached.temperature == pytest.approx(direct.temperature, rel=1e-4)
    assert report_cached["threshold"] == pytest.approx(report["threshold"], rel=1e-4)
    for k, v in direct.ood.statistics.items():
        torch.testing.assert_close(cached.ood.statistics[k], v, rtol=1e-4, atol=1e-4)


def test_a_probe_run_reports_its_strategy_and_writes_the_result_page_data(folder, tmp_path):
    events: list[Progress] = []
    out = tmp_path / "run"
    r = finetune_folder(
        folder / "train",
        folder / "init",
        out,
        options=FinetuneOptions(minutes=None, strategy="probe", overrides=QUICK),
        monitor=Monitor(on_progress=events.append),
    )
    assert r.complete and r.strategy == "probe" and r.steps == 0 and r.temperature is not None
    assert r.strategy_reason.startswith("1 stage in ") and "linear probe" in r.strategy_reason
    assert [e.phase for e in events] == ["loading", "features", "training", "calibrating", "done"]
    assert events[2].stage == "linear probe" and events[2].val_accuracy == r.details["stages"][0]["held_out_top1"]
    d = r.details
    assert sum(map(sum, d["confusion"])) == r.val_images == 10 and d["ece"] >= 0 and d["threshold"] == r.ood_threshold
    right = sum(d["confusion"][k][k] for k in range(2))
    assert 100 * right / 10 == pytest.approx(r.val_accuracy) and len(d["misclassified"]) == 10 - right
    assert all((folder / "train" / m["file"]).is_file() and m["label"] != m["predicted"] for m in d["misclassified"])
    model = vit_core.from_pretrained(out)
    assert model.calibration.ood is not None and model.label_names == ["blue", "red"]
    card = (out / "README.md").read_text()
    assert "## Held-out results" in card and "| linear probe (kept) | 1 | 1 | 76 |" in card
    held = json.loads((out / "eval_held-out_flip.json").read_text())
    assert held["top1"] == pytest.approx(r.val_accuracy)


def test_lp_ft_fine_tunes_the_whole_model_from_the_probes_head(folder, tmp_path):
    """With a learning rate of 0 the fine-tuning moves nothing: the result is the probe's checkpoint, whose head
    is the probe fitted on the cached features of every training image and its mirror."""
    out = tmp_path / "run"
    zero = dict(QUICK, lr=0.0, warmup_lr=0.0, min_lr=0.0)
    r = finetune_folder(
        folder / "train", folder / "init", out, options=FinetuneOptions(minutes=None, strategy="lp-ft", overrides=zero)
    )
    assert r.strategy == "full" and r.steps > 0  # every block: the whole model, from the probe's head
    probe, tuned = vit_core.from_pretrained(out / PROBE_NAME), vit_core.from_pretrained(out)
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["keep_head"] and recipe["freeze"] == [] and recipe["init"] == str(out / PROBE_NAME)
    for k, v in probe.state_dict().items():
        torch.testing.assert_close(tuned.state_dict()[k], v, rtol=0, atol=0, msg=k)
    assert probe.head.weight.abs().sum() > 0


def test_an_unknown_strategy_is_refused_where_it_is_chosen():
    """``FinetuneOptions`` checks its strategy when it is made, before any photo is read."""
    with pytest.raises(RecipeError, match="strategy must be one of auto, full, lp-ft, probe, got 'fast'"):
        FinetuneOptions(strategy="fast")


def test_the_command_line_fine_tunes_a_folder_with_the_strategy_asked_for(folder, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--recipe", "finetune_folder", "--data", str(folder / "train"), "--init", str(folder / "init")]
    argv += ["--minutes", "2", "--strategy", "probe", "--out", str(out), "--no-progress", "--set", "batch_size=8"]
    assert train_main(argv) == 0
    assert "1 stage in " in (said := capsys.readouterr().out) and "calibrated on the held-out images" in said
    assert str(tmp_path) not in said  # no absolute path: the card's file is named relative or by name
    assert json.loads((out / "recipe.json").read_text())["budget_minutes"] == 2
    assert vit_core.from_pretrained(out).calibration.ood is not None
    assert "| linear probe (kept) |" in (out / "README.md").read_text()


def test_photos_of_other_things_are_no_class_and_set_the_threshold(folder, tmp_path):
    """A folder ``_other`` of green squares next to the blue and red classes: no class of the model, for the probe
    and for whole-model fine-tuning; every other one of its photos sets the threshold, and the saved model's own
    answers (``predict``) turn away the share of the rest that the details say, keeping the share they say of the
    held-out photos."""
    data = tmp_path / "data"
    shutil.copytree(folder / "train", data)
    (data / "_other").mkdir()
    g = torch.Generator().manual_seed(5)
    for i in range(12):
        img = torch.rand(12, 12, 3, generator=g) * 0.5
        img[..., 1] += 0.5
        Image.fromarray((img * 255).byte().numpy()).save(data / "_other" / f"{i:02d}.png")
    for strategy in ("probe", "full"):
        out = tmp_path / strategy
        r = finetune_folder(
            data, folder / "init", out, options=FinetuneOptions(minutes=None, strategy=strategy, overrides=QUICK)
        )
        assert r.classes == ["blue", "red"] and r.train_images + r.val_images == 48
        d = r.details
        assert (d["others"], d["others_chose"], d["others_measured"]) == (
            12,
            6,
            6,
        )  # kept: below (10 held out: none of 95-98%)
        model = vit_core.from_pretrained(out).eval()
        tf = build_transform(model.pretrained_cfg)

        def scores(paths: list[Path], model=model, tf=tf) -> torch.Tensor:
            return predict(model, torch.stack([tf(load_image(p)) for p in paths])).ood_score

        threshold = model.calibration.ood.threshold
        assert (
            threshold == pytest.approx(r.ood_threshold)
            and "6 photos of other things" in model.calibration.ood.fitted_on
        )
        measures = scores(sorted((data / "_other").iterdir())[1::2])
        assert float((measures > threshold).double().mean()) == pytest.approx(d["others_turned_away"])
        held = scores([data / f for f in held_out_files(str(data), 0.2)])
        assert abs(float((held <= threshold).double().mean()) - d["kept"]) <= 1 / len(held) + 1e-9  # one at the edge
        assert d["score"] in OTHERS_SCORES and model.calibration.ood.score == d["score"]
        assert (
            f"6 of 12 photos of other things (`_other`) chose how photos are scored ({d['score']})"
            in (out / "README.md").read_text()
        )


def test_the_docs_show_bench_other_photos_numbers_from_its_results_file():
    """docs/training.md's table and the recipe notes' sentence carry ``bench/results/other_photos.txt``'s shares,
    row by row (with, without), so that a re-run cannot leave them behind."""
    rows = re.findall(
        r"^\| [^|]+ \| [\d,]+ \| ([\d.]+)% \| ([\d.]+)% \|$",
        (REPO / "bench/results/other_photos.txt").read_text(),
        re.M,
    )
    assert len(rows) == 4
    training = (REPO / "docs/training.md").read_text()
    section = training[training.index("### Photos of other things (`_other`)") :]
    shown = re.findall(
        r"^\| [^|]+ \| [\d,]+ \| (?:\*\*)?([\d.]+)%(?:\*\*)? \| (?:\*\*)?([\d.]+)%(?:\*\*)? \|$", section, re.M
    )
    assert shown[: len(rows)] == rows
    recipes = (REPO / "train/recipes/README.md").read_text()
    sentence = recipes[recipes.index("**Photos of other things**") :].split("\n\n")[0]
    for with_, without in (rows[1], rows[0], rows[3]):  # cats and dogs, ants and bees, ood_photos: in that order
        assert re.search(rf"{re.escape(with_)}%.*?\({re.escape(without)}%", sentence, re.S), (with_, without)
