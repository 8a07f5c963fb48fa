"""CNN baselines (``vit_core.models.cnn``) trained by the engine, and the small-scale figure 5 built from such runs
(``bench.figure5``)."""

import json
import math

import pytest
import timm
import torch
from PIL import Image

from bench import figure5
from tests.test_engine import make_image_folder, one_thread  # noqa: F401 (an autouse fixture: one thread here too)
from train import load_recipe
from vit_core.io.files import CHECKPOINT_NAME, CONFIG_NAME, METRICS_NAME, WEIGHTS_NAME
from vit_core.models.cnn import create_cnn
from vit_core.training import engine
from vit_core.training.builders import build_network
from vit_core.training.recipe import Recipe, RecipeError


def _stage_sizes(net: torch.nn.Module, size: int) -> list[tuple[int, int, int]]:
    """(channels, height, width) after each of a ResNet's four stages for a size x size image."""
    shapes = []
    hooks = [
        getattr(net, f"layer{i}").register_forward_hook(lambda m, i, o: shapes.append(o.shape[1:]))
        for i in (1, 2, 3, 4)
    ]
    with torch.no_grad():
        net.eval()(torch.zeros(1, 3, size, size))
    for h in hooks:
        h.remove()
    return [tuple(s) for s in shapes]


def test_small_input_resnet_keeps_the_resolution_and_timms_layout():
    """At 32 px the stem is He et al.'s CIFAR stem (3x3, stride 1, no pool): the stages see 32, 16, 8, 4 pixels,
    where timm's ImageNet stem would give them 8, 4, 2, 1. Every other weight has timm's name and shape."""
    ours = create_cnn("timm:resnet18", 10, 3, (32, 32))
    theirs = timm.create_model("resnet18", num_classes=10)
    assert _stage_sizes(ours, 32) == [(64, 32, 32), (128, 16, 16), (256, 8, 8), (512, 4, 4)]
    assert _stage_sizes(theirs, 32) == [(64, 8, 8), (128, 4, 4), (256, 2, 2), (512, 1, 1)]
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    assert {k for k in a if a[k].shape != b[k].shape} == {"conv1.weight"}
    assert a["conv1.weight"].shape == (64, 3, 3, 3)
    # large inputs keep timm's stem; channels sets the stage widths
    big = create_cnn("timm:resnet18", 10, 3, (224, 224), channels=(8, 16, 32, 64))
    assert big.conv1.kernel_size == (7, 7) and _stage_sizes(big, 64)[-1] == (64, 2, 2)


def test_cnn_recipes_are_checked():
    base = dict(model="timm:resnet18", model_args=dict(img_size=32), data="cifar10")
    with pytest.raises(RecipeError, match="model_args depth: a timm CNN takes its input"):
        Recipe.from_dict(base | dict(model_args=dict(img_size=32, depth=2)))
    with pytest.raises(RecipeError, match="channels must be a list of positive stage widths"):
        Recipe.from_dict(base | dict(model_args=dict(channels=[8, 0])))
    with pytest.raises(RecipeError, match="CNN baseline: task='classify' only"):
        Recipe.from_dict(base | dict(task="mpp"))
    with pytest.raises(RecipeError, match="timm has no model 'resnet_nope'"):
        build_network(Recipe.from_dict(base | dict(model="timm:resnet_nope")), None, ["a", "b"])
    with pytest.raises(RecipeError, match="timm ResNets"):
        build_network(Recipe.from_dict(base | dict(model="timm:vit_tiny_patch16_224")), None, ["a", "b"])
    recipe = Recipe.from_dict(load_recipe("cifar10_resnet18"))  # the figure's ResNet
    net = build_network(recipe, None, [str(i) for i in range(10)])
    assert _stage_sizes(net, 32) == [(48, 32, 32), (96, 16, 16), (192, 8, 8), (384, 4, 4)]


def _tiny_resnet(tmp_path, channels: list[int]) -> dict:
    """A recipe for a ResNet-18 of ``channels`` widths on a two-colour 16 px image folder, on the CPU."""
    return dict(
        model="timm:resnet18",
        model_args=dict(img_size=16, channels=channels, crop_pct=1.0),
        data=str(make_image_folder(tmp_path / "data", size=16)),
        augment=dict(crop="none", hflip=False),
        batch_size=8,
        device="cpu",
    )


def test_cnn_run_trains_resumes_and_writes_no_app_files(tmp_path):
    """A ResNet trained by the engine: it learns the two colours, a run stopped after one epoch and resumed ends
    with the weights of one that never stopped, and its folder holds the checkpoint and metrics but no
    model.safetensors + config.json (the app loads ViTs)."""
    recipe = _tiny_resnet(tmp_path, channels=[8, 16, 16, 16]) | dict(opt="sgd", lr=0.05, epochs=3)
    whole = engine.train(recipe, tmp_path / "whole", progress=False)
    engine.train(recipe, tmp_path / "sliced", stop_after=1, progress=False)
    engine.train(recipe, tmp_path / "sliced", resume=True, progress=False)
    weights = [torch.load(tmp_path / r / CHECKPOINT_NAME, weights_only=True)["model"] for r in ("whole", "sliced")]
    for k in weights[0]:
        torch.testing.assert_close(weights[0][k], weights[1][k], rtol=0, atol=0)
    assert whole.history[-1]["test_top1"] == 100.0
    files = {p.name for p in (tmp_path / "sliced").iterdir()}
    assert {CHECKPOINT_NAME, METRICS_NAME} <= files and not {WEIGHTS_NAME, CONFIG_NAME} & files
    assert len((tmp_path / "sliced" / METRICS_NAME).read_text().splitlines()) == 3


def test_figure5_runs_a_budget_again_after_a_kill_before_its_first_epoch(tmp_path, monkeypatch):
    """A figure-5 run killed before its first epoch ended leaves a folder with only its recipe: the bench starts
    that run again (the folder is its own), where ``python -m train`` would ask for --overwrite."""
    tiny = _tiny_resnet(tmp_path, channels=[8, 8, 8, 8])
    monkeypatch.setattr(figure5, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(figure5, "budget_recipe", lambda name, epochs: tiny | dict(epochs=epochs))
    killed = tmp_path / "runs" / "tiny_1ep"
    killed.mkdir(parents=True)
    (killed / "recipe.json").write_text(json.dumps(tiny | dict(epochs=1)))
    p = figure5.run_point("ResNet", "tiny", 1)
    assert p["epochs"] == 1 and p["minutes"] > 0 and (killed / CHECKPOINT_NAME).is_file()
    assert figure5.run_point("ResNet", "tiny", 1) == p  # finished: read back, not trained again


def _pt(family, minutes, top1, epochs=1):
    return {"family": family, "recipe": family, "epochs": epochs, "minutes": minutes, "top1": top1}


def test_figure5_ratios_interpolate_in_log_minutes(tmp_path):
    points = [
        _pt("ViT", 4.0, 60.0),
        _pt("ViT", 16.0, 70.0),
        _pt("ResNet", 2.0, 50.0),
        _pt("ResNet", 32.0, 90.0),
        _pt("hybrid", 8.0, 80.0),
        _pt("hybrid", 64.0, 95.0),
    ]
    # at 8 minutes: ViT halfway between log 4 and log 16 -> 65; ResNet halfway from log 2 to log 32 -> 70
    assert figure5.accuracy_at(points[:2], 8.0) == pytest.approx(65.0)
    assert figure5.accuracy_at(points[2:4], 8.0) == pytest.approx(50 + 40 * math.log(8 / 2) / math.log(32 / 2))
    assert figure5.accuracy_at(points[2:4], 8.0) == pytest.approx(70.0)
    assert figure5.accuracy_at(points[:2], 20.0) is None  # no extrapolation
    first, last = figure5.ratios(points)
    assert first["best_other"] == "ResNet" and first["ratio"] == pytest.approx(80 / 70)
    assert last["best_other"] is None and last["ratio"] is None  # 64 minutes: beyond every other family
    (tmp_path / "points.json").write_text(json.dumps(points))
    figure5.main(["--plot-only", "--results", str(tmp_path / "points.json"), "--plot", str(tmp_path / "f.png")])
    assert Image.open(tmp_path / "f.png").size == (700, 450)


def test_figure5_budget_recipes_keep_the_warmup_share_in_fp32():
    for name, budgets in figure5.FAMILIES.values():
        base = load_recipe(name)
        for epochs in budgets:
            r = Recipe.from_dict(figure5.budget_recipe(name, epochs))
            assert r.epochs == epochs and r.train_subset == [0, 45000] and r.eval_subset is None
            assert r.cpu_precision == "fp32"  # the same compute per CPU-minute for every family
            share = base.get("warmup_epochs", 0.0) / base["epochs"]  # every family's recipe sets its epochs
            assert r.warmup_epochs == pytest.approx(share * epochs, abs=1e-4)
