"""The training engine: recipes, timm's ingredients (checked against timm and against the formulas), a short
real MNIST run, resuming with bit-identical results (after a kill at any step of a save too), the run
folder's guards, 2-process DDP on CPU, and evaluation (with flip TTA) against a plain count."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from PIL import Image, ImageOps
from safetensors import safe_open
from safetensors.torch import load_file

import vit_core
from vit_core.data import build_transform, default_data_root
from vit_core.training.builders import build_optimizer, build_scheduler, load_init
from vit_core.training.distributed import setup_processes
from vit_core.training.engine import Recipe, RecipeError, evaluate_checkpoint, train
from vit_core.training.evaluation import evaluate, tta_views, write_eval
from vit_core.training.run_folder import stale_files

from .net import free_port

TINY = dict(img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0, crop_pct=1.0)
TIMING = {"images_per_s", "epoch_time_s", "elapsed_s"}
needs_cifar10 = pytest.mark.skipif(
    not (default_data_root() / "cifar10").is_dir(),
    reason=f"CIFAR-10 not found under {default_data_root()} (set VIT_DATA)",
)
needs_mnist = pytest.mark.skipif(
    not (default_data_root() / "mnist").is_dir(), reason=f"MNIST not found under {default_data_root()} (set VIT_DATA)"
)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: the machines running the suite are shared, and small ops gain nothing from more."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_image_folder(root: Path, n_per_class: int = 24, size: int = 8, seed: int = 0) -> Path:
    """``root/{train,test}/{blue,red}/*.png``: noisy squares whose dominant colour is the class."""
    g = torch.Generator().manual_seed(seed)
    for split, n in (("train", n_per_class), ("test", n_per_class // 2)):
        for c, name in enumerate(("blue", "red")):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = torch.rand(size, size, 3, generator=g) * 0.5
                img[..., 2 if name == "blue" else 0] += 0.5
                Image.fromarray((img * 255).byte().numpy()).save(folder / f"{c}_{i}.png")
    return root


def tiny_recipe(data: Path | str, **changes) -> dict:
    recipe = dict(model_args=dict(TINY), data=str(data), augment=dict(crop="none", hflip=False), batch_size=8)
    return recipe | dict(lr=3e-3, epochs=2, device="cpu") | changes


# ----------------------------------------------------------------------------------------- recipes


def test_recipe_rejects_unknown_keys_and_bad_values():
    with pytest.raises(RecipeError, match=r"unknown recipe key\(s\) lrr; valid keys: .*\blr\b"):
        Recipe.from_dict({"lrr": 1e-3})
    with pytest.raises(RecipeError, match="'lr' must be float"):
        Recipe.from_dict({"lr": "fast"})
    with pytest.raises(RecipeError, match="task must be one of classify, mpp"):
        Recipe.from_dict({"task": "detect"})
    with pytest.raises(RecipeError, match="not both"):
        Recipe.from_dict({"model": "vit_tiny_patch16_224", "init": "runs/x"})
    assert Recipe.from_dict({"lr": 1, "train_subset": (0, 10)}).lr == 1.0  # ints for floats, tuples for lists
    with pytest.raises(RecipeError, match=r"model_args: unknown ViTConfig field\(s\): depht; valid fields: .*depth"):
        train(tiny_recipe("unused", model_args=dict(TINY, depht=2)), "/nonexistent/never-written")
    # checked before any data is read: the augmentation, the scratch model's config, subsets
    with pytest.raises(RecipeError, match=r"augment: invalid augment: re_prob must be in \[0, 1\], got 5"):
        Recipe.from_dict({"augment": {"re_prob": 5}})
    with pytest.raises(RecipeError, match="model_args: invalid ViTConfig: .*num_heads"):
        Recipe.from_dict({"model_args": {"num_heads": 0}})
    with pytest.raises(RecipeError, match=r"train_subset must be N or \[start, stop\]"):
        Recipe.from_dict({"train_subset": [0, "10"]})
    with pytest.raises(RecipeError, match="warmup_epochs .* must be less than epochs .*--set warmup_epochs=0"):
        Recipe.from_dict({"epochs": 1, "warmup_epochs": 1})


# ------------------------------------------------------------------------------- timm ingredients


def _groups(optimizer) -> dict[int, tuple[float, float]]:
    """id(param) -> (weight decay, lr scale)."""
    return {id(p): (g["weight_decay"], g.get("lr_scale", 1.0)) for g in optimizer.param_groups for p in g["params"]}


def test_weight_decay_spares_biases_norms_and_embeddings():
    model = vit_core.create_model(vit_core.ViTConfig(**TINY, num_classes=3))
    groups = _groups(build_optimizer(model, Recipe(weight_decay=0.1)))
    for name, p in model.named_parameters():
        spared = p.ndim <= 1 or name in ("pos_embed", "cls_token")
        assert groups[id(p)][0] == (0.0 if spared else 0.1), name


def test_layer_decay_groups_match_timm():
    """Layer-wise lr decay (BEiT): embeddings get decay^(L+1), block i decay^(L-i), the head 1; same
    groups as timm builds for its own VisionTransformer."""
    import timm
    from timm.optim import create_optimizer_v2

    cfg = vit_core.ViTConfig(**dict(TINY, depth=3), num_classes=3)
    ours = vit_core.create_model(cfg)
    theirs = timm.models.VisionTransformer(
        img_size=8, patch_size=4, embed_dim=16, depth=3, num_heads=2, mlp_ratio=2.0, num_classes=3
    )
    recipe = Recipe(layer_decay=0.5, weight_decay=0.05, lr=1.0)
    got = _groups(build_optimizer(ours, recipe))
    ref = _groups(create_optimizer_v2(theirs, "adamw", lr=1.0, weight_decay=0.05, layer_decay=0.5))
    ref_by_name = {n: ref[id(p)] for n, p in theirs.named_parameters()}
    assert {n: got[id(p)] for n, p in ours.named_parameters()} == ref_by_name
    assert ref_by_name["pos_embed"] == (0.0, 0.5**4) and ref_by_name["head.weight"] == (0.05, 1.0)


def test_schedule_is_linear_warmup_then_per_step_cosine():
    model = torch.nn.Linear(2, 2)
    recipe = Recipe(lr=0.1, warmup_lr=0.001, min_lr=0.002, warmup_epochs=1.5, epochs=4)
    opt = build_optimizer(model, recipe)
    sched = build_scheduler(opt, recipe, steps_per_epoch=10)
    total, warmup = 40, 15
    for t in range(total + 1):
        if t < warmup:
            want = 0.001 + (0.1 - 0.001) * t / warmup
        else:
            want = 0.002 + 0.5 * (0.1 - 0.002) * (1 + math.cos(math.pi * (t - warmup) / (total - warmup)))
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-9, abs=1e-12), t
        sched.step_update(num_updates=t + 1)


def test_linear_schedule_is_airbench_triangle():
    """sched='linear': the same warmup, then a straight line from the peak to min_lr at the last step, in every
    group at its own peak (the stem optimizer's groups included)."""
    model = vit_core.create_model(vit_core.ViTConfig(**dict(TINY, patch_size=1, img_size=8), **_STEM, num_classes=3))
    so = {"lr": 2.0, "norm_lr_scale": 10.0}
    recipe = Recipe(lr=0.1, warmup_lr=0.0, min_lr=0.0, warmup_epochs=1, epochs=5, sched="linear", stem_optimizer=so)
    opt = build_optimizer(model, recipe)
    sched = build_scheduler(opt, recipe, steps_per_epoch=4)
    peaks = [0.1, 0.1, 2.0, 20.0]  # main (decay, no decay), stem (weights, biases)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.0] * 4)
    for t in range(1, 21):
        sched.step_update(num_updates=t)
        frac = t / 4 if t < 4 else 1 - (t - 4) / 16
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([p * frac for p in peaks], abs=1e-12), t


_STEM = dict(stem_channels=(4, 8), stem_strides=(1, 1), stem_pools=(2, 1), stem_whiten=1, stem_act="gelu")


def test_stem_optimizer_trains_the_cnn_as_airbench():
    """stem_optimizer: the CNN's conv weights and whitening bias in SGD-Nesterov at its lr and decay, BatchNorm's
    shifts at lr * scale with decay / scale, its scales frozen at 1 and the whitening filters trained by nothing;
    everything else
    in the main optimizer with timm's decay rules; every trainable parameter in exactly one group."""
    model = vit_core.create_model(vit_core.ViTConfig(**dict(TINY, patch_size=1), **_STEM, num_classes=3))
    so = {"lr": 1.5, "weight_decay": 0.002, "momentum": 0.85, "norm_lr_scale": 64}
    opt = build_optimizer(model, Recipe(lr=1e-3, weight_decay=0.05, stem_optimizer=so))
    main, cnn = opt.optimizers
    assert type(main).__name__ == "AdamW" and isinstance(cnn, torch.optim.SGD)
    assert all(g["nesterov"] and g["momentum"] == 0.85 for g in cnn.param_groups)
    where = {id(p): (g["lr"], g["weight_decay"]) for g in opt.param_groups for p in g["params"]}
    assert len(where) == sum(len(g["params"]) for g in opt.param_groups)  # no parameter twice
    for name, p in model.named_parameters():
        if name == "patch_embed.backbone.whiten.weight" or (name.endswith("norm.weight") and "backbone" in name):
            assert not p.requires_grad and id(p) not in where, name
        elif "backbone" in name:
            shift = name.endswith("norm.bias")
            assert where[id(p)] == ((96.0, pytest.approx(0.002 / 64)) if shift else (1.5, 0.002)), name
        else:
            spared = p.ndim <= 1 or name in ("pos_embed", "cls_token")
            assert where[id(p)] == (1e-3, 0.0 if spared else 0.05), name
    with pytest.raises(RecipeError, match=r"^stem_optimizer opt 'sgdd': .*list_optimizers"):
        build_optimizer(model, Recipe(stem_optimizer={"lr": 1.0, "opt": "sgdd"}))
    with pytest.raises(RecipeError, match="^stem_optimizer trains a hybrid's CNN, and this model has none$"):
        build_optimizer(vit_core.create_model(vit_core.ViTConfig(**TINY)), Recipe(stem_optimizer={"lr": 1.0}))
    with pytest.raises(RecipeError, match="stem_optimizer needs an lr"):
        Recipe.from_dict({"stem_optimizer": {"momentum": 0.9}})
    with pytest.raises(RecipeError, match=r"unknown key\(s\) nesterov"):
        Recipe.from_dict({"stem_optimizer": {"lr": 1.0, "nesterov": True}})


def test_bn_momentum_reaches_every_batchnorm():
    from vit_core.training.builders import build_network

    args = dict(model_args=dict(TINY, patch_size=1, **dict(_STEM, stem_whiten=None)))
    for momentum, want in ((None, 0.1), (0.4, 0.4)):
        net = build_network(Recipe.from_dict(args | {"bn_momentum": momentum}), None, ["a", "b"])
        norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        assert len(norms) == 2 and all(m.momentum == want for m in norms)
    with pytest.raises(RecipeError, match=r"bn_momentum must be in \(0, 1\]"):
        Recipe.from_dict({"bn_momentum": 0.0})


def test_dirac_init_passes_each_convolutions_input_through():
    """stem_init 'dirac' (airbench): each convolution of the conv stem copies its input to its first output
    channels (checked by convolving random maps, with as many, more and fewer filters than inputs); its other
    filters keep PyTorch's initialisation, drawn as without it. Refused without a conv stem and for fine-tuning."""
    from vit_core.training.builders import build_network

    stem = dict(stem_channels=(8, 16, 16, 4), stem_strides=(1, 1, 1, 1), stem_pools=(2, 1, 1, 1))
    args = dict(model_args=dict(TINY, patch_size=1, **stem), seed=5)
    nets = {i: build_network(Recipe.from_dict(args | {"stem_init": i}), None, ["a", "b"]) for i in ("pytorch", "dirac")}
    layers = zip(*(n.patch_embed.backbone.layers for n in nets.values()), strict=True)
    for plain, dirac in layers:
        w, w0 = dirac.conv.weight.detach(), plain.conv.weight.detach()
        c_out, c_in = w.shape[:2]
        x = torch.randn(2, c_in, 6, 6, generator=torch.Generator().manual_seed(c_in))
        n = min(c_in, c_out)
        assert torch.equal(torch.nn.functional.conv2d(x, w, padding=1)[:, :n], x[:, :n])
        assert torch.equal(w[c_in:], w0[c_in:]) and (w[c_in:].numel() == 0 or w[c_in:].abs().sum() > 0)
        assert not torch.equal(w0[:n], w[:n])
    with pytest.raises(RecipeError, match="stem_init 'dirac' initialises a conv stem .*none here"):
        build_network(Recipe.from_dict({"model_args": TINY, "stem_init": "dirac"}), None, ["a", "b"])
    with pytest.raises(RecipeError, match="a fine-tuned one keeps its weights"):
        Recipe.from_dict({"init": "runs/x", "stem_init": "dirac"})
    with pytest.raises(RecipeError, match="stem_init must be one of pytorch, dirac, got 'zeros'"):
        Recipe.from_dict({"stem_init": "zeros"})


def test_lookahead_follows_airbench_formula():
    """Every 5 steps slow += (1 - d)(fast - slow) with d = 0.95^5 (step / total)^3 and fast = slow; after the
    last step the model is the slow copy: against the formula applied by hand to a scalar sequence."""
    from vit_core.training.builders import Lookahead

    net = torch.nn.Linear(1, 1, bias=False)
    total = 12
    look = Lookahead(net, total)
    slow = net.weight.item()
    for step in range(1, total + 1):
        with torch.no_grad():
            net.weight.add_(1.0)  # a "training step"
        fast = net.weight.item()
        look.update(net, step)
        if step % 5 == 0 or step == total:
            d = 1.0 if step == total else 0.95**5 * (step / total) ** 3
            slow = slow + (1 - d) * (fast - slow)
            assert net.weight.item() == pytest.approx(slow), step
        else:
            assert net.weight.item() == fast, step


@needs_cifar10
def test_whitening_decorrelates_the_training_patches(tmp_path):
    """stem_whiten: the run's filters, applied to its training images, give 2x2-patch coordinates whose
    covariance is the identity (up to airbench's eps), computed here with numpy from the raw uint8 data."""
    recipe = dict(
        data="cifar10",
        train_subset=5000,
        eval_subset=10,
        epochs=1,
        batch_size=5000,
        lr=0.0,
        model_args=dict(
            img_size=32,
            patch_size=1,
            embed_dim=8,
            depth=1,
            num_heads=1,
            stem_channels=(8,),
            stem_strides=(1,),
            stem_pools=(8,),
            stem_whiten=2,
            stem_act="gelu",
            mean=(0.49, 0.48, 0.45),
            std=(0.25, 0.24, 0.26),
            crop_pct=1.0,
        ),
        device="cpu",
    )
    train(recipe | {"stem_optimizer": {"lr": 0.0}}, tmp_path / "run", progress=False)
    w = _weights(tmp_path / "run")["patch_embed.backbone.whiten.weight"].double().numpy()
    assert np.allclose(w[:12], -w[12:])
    from vit_core.data import build_dataset

    raw = build_dataset("cifar10", "train")
    idx = torch.randperm(len(raw), generator=torch.Generator().manual_seed(0))[:5000]
    x = (raw.images[idx].double().numpy() / 255 - np.array([0.49, 0.48, 0.45])[:, None, None]) / np.array(
        [0.25, 0.24, 0.26]
    )[:, None, None]
    patches = np.stack([x[:, c, i : i + 31, j : j + 31] for c in range(3) for i in (0, 1) for j in (0, 1)], -1)
    coords = patches.reshape(-1, 12) @ w[:12].reshape(12, 12).T
    cov = coords.T @ coords / len(coords)
    eigenvalues = np.linalg.eigvalsh(patches.reshape(-1, 12).T @ patches.reshape(-1, 12) / len(coords))[::-1]
    np.testing.assert_allclose(cov, np.diag(eigenvalues / (eigenvalues + 5e-4)), atol=2e-2)


def test_resume_airbench_style_run(tmp_path):
    """A run with the CNN's own optimizer, lookahead and the linear schedule, stopped and resumed: the same
    weights as one that never stopped (both optimizers' and the lookahead's state are in the checkpoint)."""
    data = make_image_folder(tmp_path / "data", size=8)
    stem = dict(TINY, patch_size=1, **dict(_STEM, stem_whiten=None))
    recipe = tiny_recipe(
        data,
        model_args=stem,
        epochs=3,
        lookahead=True,
        bn_momentum=0.4,
        sched="linear",
        warmup_epochs=1,
        stem_optimizer={"lr": 0.5, "weight_decay": 1e-3, "momentum": 0.85, "norm_lr_scale": 8},
    )
    train(recipe, tmp_path / "full", progress=False)
    train(recipe, tmp_path / "cut", stop_after=1, progress=False)
    train(recipe, tmp_path / "cut", resume=True, progress=False)
    _same_run(tmp_path / "full", tmp_path / "cut")


# ------------------------------------------------------------------------------------ real runs


@needs_mnist
def test_short_mnist_run_learns(tmp_path):
    """Two epochs on 10,000 MNIST training images (a 20k-parameter ViT): > 85% on 2,000 test images."""
    model_args = dict(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
    model_args |= dict(global_pool="avg", class_token=False, mean=(0.1307,), std=(0.3081,), crop_pct=1.0)
    recipe = dict(model_args=model_args, data="mnist", train_subset=10_000, eval_subset=2000)
    recipe |= dict(augment=dict(crop="none", hflip=False), weight_init="jax", epochs=2, batch_size=32, lr=1e-2)
    recipe |= dict(warmup_epochs=0.3, device="cpu")
    history = train(recipe, tmp_path / "run", progress=False).history
    assert history[-1]["test_top1"] > 85.0, history


@pytest.mark.slow
@needs_mnist
def test_mnist_tiny_recipe_reaches_98_percent(tmp_path):
    """The mnist_tiny recipe (<= 8,000 parameters, 15 epochs): >= 98.0% on the full MNIST test set."""
    from train import load_recipe

    recipe = load_recipe("mnist_tiny")
    history = train(recipe | {"device": "cpu"}, tmp_path / "run", progress=False).history
    assert vit_core.from_pretrained(tmp_path / "run").num_params() <= 8000
    assert history[-1]["test_top1"] >= 98.0, history[-1]


def test_mnist_tiny_recipe_is_within_the_parameter_budget():
    from train import load_recipe

    recipe = Recipe.from_dict(load_recipe("mnist_tiny"))
    cfg = vit_core.get_config(recipe.model) if recipe.model else vit_core.ViTConfig()
    model = vit_core.create_model(cfg.replace(**recipe.model_args, num_classes=10))
    assert model.num_params() <= 8000


def test_run_folder(tmp_path):
    data = make_image_folder(tmp_path / "data")
    recipe = Recipe.from_dict(tiny_recipe(data))
    history = train(recipe, tmp_path / "run", progress=False).history
    run = tmp_path / "run"
    files = ["checkpoint.pt", "config.json", "curves.png", "metrics.jsonl", "model.safetensors", "recipe.json"]
    assert sorted(p.name for p in run.iterdir()) == files
    assert json.loads((run / "recipe.json").read_text()) == recipe.to_dict()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == json.loads(json.dumps(history)) and [r["epoch"] for r in rows] == [1, 2]
    assert {"train_loss", "train_top1", "test_loss", "test_top1", "test_top5", "lr", "images_per_s"} <= set(rows[-1])
    assert Image.open(run / "curves.png").format == "PNG"
    model = vit_core.from_pretrained(run)
    assert model.label_names == ["blue", "red"] and model.config.img_size == 8
    # the training state is plain tensors and containers: loads without unpickling arbitrary objects
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 2 and set(state["model"]) == set(model.state_dict())
    _assert_consistent(run, 2)


def test_evaluate_matches_a_plain_count(tmp_path):
    data = make_image_folder(tmp_path / "data", n_per_class=40)
    train(tiny_recipe(data, epochs=1), tmp_path / "run", progress=False)
    result = evaluate_checkpoint(tmp_path / "run", str(data), device="cpu", batch_size=7, progress=False)

    model = vit_core.from_pretrained(tmp_path / "run")
    tf = build_transform(model.pretrained_cfg)
    confusion, top1 = torch.zeros(2, 2, dtype=torch.int64), 0
    files = sorted((data / "test").glob("*/*.png"))
    for path in files:
        label = ["blue", "red"].index(path.parent.name)
        with torch.no_grad():
            pred = int(model(tf(Image.open(path).convert("RGB"))[None]).argmax())
        confusion[label, pred] += 1
        top1 += pred == label
    assert torch.equal(result["confusion"], confusion)
    assert result["top1"] == pytest.approx(100 * top1 / len(files))
    assert result["top5"] == 100.0 and result["count"] == len(files)  # two classes: top-5 is everything

    json_path, png_path, reliability_path = write_eval(result, tmp_path / "eval")
    assert json.loads(json_path.read_text())["confusion"] == confusion.tolist()
    assert Image.open(png_path).format == Image.open(reliability_path).format == "PNG"

    # flip TTA: each image's softmax averaged with its mirror's (mirrored before preprocessing here)
    result = evaluate_checkpoint(tmp_path / "run", str(data), device="cpu", batch_size=7, progress=False, tta="flip")
    confusion, top1, loss = torch.zeros(2, 2, dtype=torch.int64), 0, 0.0
    for path in files:
        label = ["blue", "red"].index(path.parent.name)
        img = Image.open(path).convert("RGB")
        with torch.no_grad():
            p = sum(model(tf(im)[None]).double().softmax(-1)[0] for im in (img, ImageOps.mirror(img))) / 2
        pred = int(p.argmax())
        confusion[label, pred] += 1
        top1 += pred == label
        loss -= math.log(p[label])
    assert torch.equal(result["confusion"], confusion) and result["tta"] == "flip"
    assert result["top1"] == pytest.approx(100 * top1 / len(files))
    assert result["loss"] == pytest.approx(loss / len(files), rel=1e-5)
    names = [p.name for p in write_eval(result, tmp_path / "eval")]
    assert names == ["eval_test_flip.json", "confusion_test_flip.png", "reliability_test_flip.png"]


def test_flip_translate_tta_against_numpy():
    """flip-translate TTA: the image and its mirror (1/4 each) and the mirror pairs of the image shifted
    1 px down-right and up-left with reflect padding (1/8 each), here built with numpy; evaluate()'s
    prediction and loss are those of the weighted mean of the views' softmaxes."""
    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(6, 3, 32, 32, generator=g), torch.randint(0, 5, (6,), generator=g)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 5))

    a = np.pad(images.numpy(), ((0, 0), (0, 0), (1, 1), (1, 1)), mode="reflect")
    shifted = [images.numpy(), a[..., :32, :32], a[..., 2:, 2:]]  # a[..., :32, :32][i, j] = image[i - 1, j - 1]
    expected = [
        (v, w) for v, w0 in zip(shifted, (0.25, 0.125, 0.125), strict=True) for v in (v, v[..., ::-1]) for w in [w0]
    ]
    views = tta_views(images, "flip-translate")
    assert [w for _, w in views] == [w for _, w in expected] and sum(w for _, w in views) == 1
    for (view, _), (ref, _) in zip(views, expected, strict=True):
        assert np.array_equal(view.numpy(), ref)
    assert np.array_equal(expected[2][0][:, :, 5, 7], images[:, :, 4, 6].numpy())  # down-right by 1 px

    with torch.no_grad():
        p = sum(w * model(torch.from_numpy(np.ascontiguousarray(v))).double().softmax(-1) for v, w in expected)
    result = evaluate(model, [(images, labels)], 5, tta="flip-translate")
    assert result["top1"] == pytest.approx(100 * (p.argmax(-1) == labels).double().mean().item())
    assert result["loss"] == pytest.approx(-p[torch.arange(6), labels].log().mean().item(), rel=1e-5)
    with pytest.raises(RecipeError, match="tta must be"):
        evaluate(model, [(images, labels)], 5, tta="rotate")


def test_evaluate_accumulates_over_batches():
    """evaluate() over uneven batches equals a per-sample count (top-1, top-5, loss, confusion)."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(50, 7, generator=g)  # the "model": sample id -> logits
    labels = torch.randint(0, 7, (50,), generator=g)

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(table.clone())

        def forward(self, ids):
            return self.table[ids]

    ids = torch.arange(50)
    batches = [(ids[i : i + 16], labels[i : i + 16]) for i in range(0, 50, 16)]
    result = evaluate(Lookup(), batches, 7)
    confusion = [[0] * 7 for _ in range(7)]
    top1 = top5 = loss = 0.0
    for logits, y in zip(table.tolist(), labels.tolist(), strict=True):
        ranked = sorted(range(7), key=lambda c: -logits[c])
        confusion[y][ranked[0]] += 1
        top1 += ranked[0] == y
        top5 += y in ranked[:5]
        loss += math.log(sum(math.exp(v) for v in logits)) - logits[y]
    assert result["confusion"].tolist() == confusion
    assert result["top1"] == pytest.approx(100 * top1 / 50)
    assert result["top5"] == pytest.approx(100 * top5 / 50)
    assert result["loss"] == pytest.approx(loss / 50, rel=1e-5)


# ---------------------------------------------------------------------------------------- resume


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


def _assert_consistent(run: Path, epoch: int) -> None:
    """Every file of ``run`` holds ``epoch``: the checkpoint, the weights (its header, and its tensors equal to
    the checkpoint's exported model), the metrics and the curves; no temporary file is left."""
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == epoch
    exported = state["ema"] if state["ema"] is not None else state["model"]
    weights = _weights(run)
    assert weights.keys() == exported.keys() and all(torch.equal(weights[k], exported[k]) for k in weights)
    with safe_open(run / "model.safetensors", "pt") as f:
        assert f.metadata()["epoch"] == str(epoch)
    assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").open()] == list(range(1, epoch + 1))
    assert Image.open(run / "curves.png").text["epoch"] == str(epoch)
    vit_core.from_pretrained(run)  # config.json and the weights load together, strictly
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def _same_run(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    rows = [
        [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in (r / "metrics.jsonl").open()]
        for r in (a, b)
    ]
    assert rows[0] == rows[1]


def test_resume_gives_the_uninterrupted_result(tmp_path):
    """Stop after epoch 1, resume: same weights and metrics as a run that never stopped. The recipe draws
    from every RNG the state saves: torch (crops, flips), python (RandAugment), numpy (Mixup), with EMA."""
    data = make_image_folder(tmp_path / "data")
    recipe = tiny_recipe(
        data,
        epochs=3,
        augment=dict(crop="pad", padding=1, hflip=True, rand_augment="rand-m9-mstd0.5"),
        mixup=0.8,
        cutmix=1.0,
        label_smoothing=0.1,
        ema_decay=0.9,
        warmup_epochs=1,
        model_args=dict(TINY, drop_path_rate=0.1),
    )
    train(recipe, tmp_path / "full", progress=False)
    assert len(train(recipe, tmp_path / "cut", stop_after=1, progress=False).history) == 1
    assert len(train(recipe, tmp_path / "cut", resume=True, progress=False).history) == 3
    _same_run(tmp_path / "full", tmp_path / "cut")


@needs_mnist
def test_resume_in_memory_fast_path(tmp_path):
    """The same on MNIST's in-memory uint8 batch path, with grad checkpointing switched on when resuming."""
    recipe = dict(
        model_args=dict(TINY, img_size=28, patch_size=7, in_chans=1, mean=(0.5,), std=(0.5,)),
        data="mnist",
        train_subset=512,
        eval_subset=256,
        augment=dict(crop="pad", padding=2, hflip=False),
        batch_size=64,
        epochs=2,
        device="cpu",
    )
    train(recipe, tmp_path / "full", progress=False)
    train(recipe, tmp_path / "cut", stop_after=1, progress=False)
    train(recipe | {"grad_checkpointing": True}, tmp_path / "cut", resume=True, progress=False)
    _same_run(tmp_path / "full", tmp_path / "cut")


def test_channels_last_trains_the_same_model(tmp_path):
    """channels_last (NHWC convolutions) is a runtime key: a pooled conv-stem hybrid trained with it ends with
    the weights of the run without it (up to float rounding), writes contiguous safetensors that load, and a
    run may switch it when resuming."""
    data = make_image_folder(tmp_path / "data")
    stem = dict(TINY, patch_size=1, stem_channels=(4, 8), stem_strides=(1, 1), stem_pools=(2, 2))
    recipe = tiny_recipe(data, model_args=stem)
    train(recipe, tmp_path / "nchw", progress=False)
    train(recipe | {"channels_last": True}, tmp_path / "nhwc", stop_after=1, progress=False)
    conv = torch.load(tmp_path / "nhwc" / "checkpoint.pt", weights_only=True)["model"][
        "patch_embed.backbone.layers.1.conv.weight"
    ]
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()  # it did run NHWC
    train(recipe, tmp_path / "nhwc", resume=True, progress=False)
    _assert_consistent(tmp_path / "nhwc", 2)
    a, b = _weights(tmp_path / "nchw"), _weights(tmp_path / "nhwc")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-3, msg=k)


def test_cpu_precision_bf16_trains_in_bf16_only_where_the_cpu_has_bf16_units(tmp_path, monkeypatch, capsys):
    """cpu_precision bf16 on a CPU with bf16 units: the passes run in bf16, so a conv-stem hybrid's losses are
    fp32's to within bf16's rounding but not bit for bit. Without the units (emulated bf16 would be far
    slower) the run says so and trains exactly as in fp32."""
    data = make_image_folder(tmp_path / "data")
    stem = dict(TINY, patch_size=1, stem_channels=(4, 8), stem_strides=(1, 1), stem_pools=(2, 2))
    recipe = tiny_recipe(data, model_args=stem, epochs=1, cpu_precision="bf16")

    def loss(name: str, **changes) -> float:
        return train(recipe | changes, tmp_path / name, progress=False).history[0]["train_loss"]

    fp32 = loss("fp32", cpu_precision="fp32")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)  # emulated on a CPU without
    bf16 = loss("bf16")
    assert bf16 != fp32 and bf16 == pytest.approx(fp32, rel=0.02), (bf16, fp32)
    capsys.readouterr()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert loss("no_units") == fp32
    assert "this CPU has no bf16 units (AVX-512 BF16 or AMX), so the run trains in fp32" in capsys.readouterr().out


def test_micro_batches_give_the_whole_batchs_step(tmp_path):
    """micro_batch: a batch of 8 as 4 passes of 2 images whose gradients add up, then one step. Without
    BatchNorm that is the whole batch's step, so the weights and the loss end as in the run without it (up
    to float rounding); a micro-batch that does not split the batch is refused."""
    data = make_image_folder(tmp_path / "data")
    recipe = tiny_recipe(data, batch_size=8, opt="sgd", lr=0.05, label_smoothing=0.1)
    whole = train(recipe, tmp_path / "whole", progress=False)
    parts = train(recipe | {"micro_batch": 2}, tmp_path / "parts", progress=False)
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "parts")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)
    for epoch_a, epoch_b in zip(whole.history, parts.history, strict=True):
        assert epoch_a["train_loss"] == pytest.approx(epoch_b["train_loss"], rel=1e-5)
        assert epoch_a["train_top1"] == epoch_b["train_top1"]
    with pytest.raises(RecipeError, match="micro_batch 3 does not split the batch of 8 per process"):
        train(recipe | {"micro_batch": 3}, tmp_path / "three", progress=False)


def test_resume_guards(tmp_path):
    data = make_image_folder(tmp_path / "data")
    recipe = tiny_recipe(data, epochs=2, model_args=dict(TINY, mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2)))
    with pytest.raises(RecipeError, match="no checkpoint.pt to resume from"):
        train(recipe, tmp_path / "run", resume=True, progress=False)
    train(recipe, tmp_path / "run", stop_after=1, progress=False)
    with pytest.raises(RecipeError, match="already holds a run; pass --resume"):
        train(recipe, tmp_path / "run", progress=False)
    with pytest.raises(RecipeError, match=r"another recipe \(lr: 0.003 -> 0.1\)"):
        train(recipe | {"lr": 0.1}, tmp_path / "run", resume=True, progress=False)
    # the run's recipe.json (lists for tuples) is the same recipe; runtime keys may change
    saved = json.loads((tmp_path / "run" / "recipe.json").read_text())
    train(saved | {"workers": 1}, tmp_path / "run", resume=True, progress=False)
    with pytest.raises(RecipeError, match="all 2 epochs are done"):
        train(recipe, tmp_path / "run", resume=True, progress=False)


def test_out_folder_guards(tmp_path):
    """A run never writes into a folder with files in it unless told to (``overwrite``, which replaces a run's
    own files and keeps every other, an earlier evaluation included); temporary files of a killed save are
    removed."""
    data = make_image_folder(tmp_path / "data")
    recipe = tiny_recipe(data, epochs=1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "model.safetensors").write_bytes(b"someone else's weights")
    with pytest.raises(RecipeError, match=r"is not empty \(it holds model.safetensors, notes.txt\)"):
        train(recipe, mine, progress=False)
    assert sorted(p.name for p in mine.iterdir()) == ["model.safetensors", "notes.txt"]
    with pytest.raises(RecipeError, match="is a file, not a folder"):
        train(recipe, mine / "notes.txt", progress=False)
    train(recipe, mine, overwrite=True, progress=False)
    assert (mine / "notes.txt").read_text() == "keep me"
    _assert_consistent(mine, 1)

    # a finished run: refused, then started again with overwrite (the old run's files replaced)
    with pytest.raises(RecipeError, match="already holds a run; pass --resume to continue it, --overwrite"):
        train(recipe, mine, progress=False)
    (mine / "eval_test.json").write_text("{}")  # an evaluation of the old model: not the run's to delete
    (mine / ".checkpoint.pt.tmp").write_bytes(b"half a checkpoint")  # a kill while saving
    history = train(recipe | {"lr": 1e-3}, mine, overwrite=True, progress=False).history
    assert len(history) == 1 and json.loads((mine / "recipe.json").read_text())["lr"] == 1e-3
    assert sorted(p.name for p in mine.iterdir()) == [
        "checkpoint.pt",
        "config.json",
        "curves.png",
        "eval_test.json",
        "metrics.jsonl",
        "model.safetensors",
        "notes.txt",
        "recipe.json",
    ]


_COMMITTED = ("checkpoint.pt", "model.safetensors", "config.json", "metrics.jsonl", "curves.png")


def _resume_and_die(recipe: dict, run: Path, rename: int | None) -> None:
    """In a forked process: resume ``run`` to epoch 2 and SIGKILL this process while saving it: before the
    ``rename``-th rename of an epoch file, or (None) half-way through writing the checkpoint."""

    def die(*_):
        os.kill(os.getpid(), signal.SIGKILL)

    if rename is None:
        torch.save = lambda obj, f, *a, **kw: (f.write(b"half a checkpoint"), f.flush(), die())
    else:
        real, count = os.replace, [0]

        def replace(src, dst):
            if Path(dst).name in _COMMITTED:
                if count[0] == rename:
                    die()
                count[0] += 1
            real(src, dst)

        os.replace = replace
    train(recipe, run, resume=True, stop_after=2, progress=False)
    os._exit(0)  # not killed: the caller's exit-code check fails


def test_kill_at_every_step_of_a_save_then_resume(tmp_path):
    """kill -9 at each step of saving epoch 2 (half-way through writing the checkpoint, and before each of the
    renames that put the epoch's files in place), then resume: the folder is consistent again (every file at
    one epoch, no temporary files) and the final weights equal an uninterrupted run's, bit for bit."""
    data = make_image_folder(tmp_path / "data")
    recipe = tiny_recipe(data, epochs=3, augment=dict(crop="pad", padding=1, hflip=True), ema_decay=0.9)
    train(recipe, tmp_path / "straight", progress=False)
    train(recipe, tmp_path / "base", stop_after=1, progress=False)
    torn = []
    for rename in (None, *range(len(_COMMITTED))):
        run = tmp_path / f"killed-{rename}"
        shutil.copytree(tmp_path / "base", run)
        child = multiprocessing.get_context("fork").Process(target=_resume_and_die, args=(recipe, run, rename))
        child.start()
        child.join(timeout=300)
        if child.is_alive():  # hung: do not leave it behind
            child.kill()
        assert child.exitcode == -signal.SIGKILL, (rename, child.exitcode)
        epoch = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
        assert epoch in (1, 2), rename
        torn.append(bool(stale_files(run, epoch)))
        train(recipe, run, resume=True, stop_after=2, progress=False)  # repairs, or redoes epoch 2
        _assert_consistent(run, 2)
        train(recipe, run, resume=True, progress=False)
        _assert_consistent(run, 3)
        _same_run(tmp_path / "straight", run)
    assert any(torn), "no kill left files behind the checkpoint: the repair was not exercised"


# ---------------------------------------------------------------------------------- fine-tuning


def test_finetune_at_higher_resolution(tmp_path):
    """init= loads a checkpoint at a new img_size (position embeddings interpolated, paper section 3.2)
    with a zero-initialised head for the new data's classes."""
    data = make_image_folder(tmp_path / "data")
    train(tiny_recipe(data, epochs=1), tmp_path / "base", progress=False)
    base = vit_core.from_pretrained(tmp_path / "base")

    model = load_init(str(tmp_path / "base"), img_size=12, drop_path_rate=0.1)
    assert model.config.img_size == 12 and model.config.drop_path_rate == 0.1
    want = vit_core.resample_pos_embed(base.pos_embed, (3, 3), (2, 2), base.num_prefix_tokens)
    assert torch.equal(model.pos_embed, want)

    recipe = dict(
        data=str(data),
        init=str(tmp_path / "base"),
        model_args=dict(img_size=12),
        batch_size=8,
        epochs=1,
        lr=1e-3,
        augment=dict(crop="none", hflip=False),
        device="cpu",
    )
    torch.manual_seed(0)
    history = train(recipe | {"lr": 0.0, "min_lr": 0.0, "warmup_lr": 0.0}, tmp_path / "lr0", progress=False).history
    tuned = vit_core.from_pretrained(tmp_path / "lr0")
    assert tuned.config.img_size == 12 and tuned.label_names == ["blue", "red"]
    assert torch.count_nonzero(tuned.head.weight) == 0  # lr 0: the new head stays at its zero init
    assert torch.equal(tuned.pos_embed, want) and history[0]["test_loss"] == pytest.approx(math.log(2))
    train(recipe, tmp_path / "ft", progress=False)
    assert vit_core.from_pretrained(tmp_path / "ft").config.img_size == 12


def test_timm_init_names_resolve_to_the_hub(monkeypatch):
    """timm:<name> loads timm's default pretrained weights for <name> from the Hub (mocked: no network)."""
    import vit_core.io.hub

    seen = {}
    monkeypatch.setattr(vit_core.io.hub, "from_pretrained", lambda spec, **kw: seen.setdefault("spec", (spec, kw)))
    load_init("timm:vit_tiny_patch16_224", img_size=32)
    assert seen["spec"] == ("timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", {"img_size": 32})
    with pytest.raises(vit_core.CheckpointError, match="timm has no Hub weights for 'vit_nonexistent'"):
        load_init("timm:vit_nonexistent")


# ------------------------------------------------------------------------------------------ DDP


def _ddp_worker(rank: int, world: int, port: int, recipe: dict, root: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        GLOO_SOCKET_IFNAME="lo",
    )
    torch.set_num_threads(1)
    out = Path(root) / ("ddp" if rank == 0 else f"rank{rank}-must-not-exist")
    result = train(recipe, out, progress=False)
    # every process reports its own final parameters (the test's file, not the run's)
    torch.save({"params": result.model.state_dict(), "history": result.history}, Path(root) / f"rank{rank}.pt")


def test_one_process_under_torchrun_joins_the_group(monkeypatch):
    """torchrun --nproc_per_node 1 sets RANK: the process joins a group (gloo here, NCCL on a GPU), so one GPU
    runs the DDP path that eight do; without torchrun's variables there is no group."""
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert not setup_processes("cpu").distributed
    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    procs = setup_processes("cpu")
    try:
        assert procs.distributed and procs.owns_group and (procs.rank, procs.world) == (0, 1)
        assert torch.distributed.get_backend() == "gloo"
    finally:
        procs.close()
    assert not torch.distributed.is_initialized()


def test_one_process_ddp_is_bit_identical_to_a_plain_process(tmp_path):
    """DDP with one process sums the gradients over one process: the same weights, bit for bit."""
    data = make_image_folder(tmp_path / "data", n_per_class=16)
    recipe = tiny_recipe(data, epochs=2, batch_size=8)
    mp.spawn(_ddp_worker, args=(1, free_port(), recipe, str(tmp_path)), nprocs=1, join=True)
    ddp = torch.load(tmp_path / "rank0.pt", weights_only=True)["params"]
    train(recipe, tmp_path / "single", progress=False)
    for k, v in _weights(tmp_path / "single").items():
        assert torch.equal(ddp[k], v), k


def test_two_process_ddp_matches_one_process(tmp_path):
    """gloo on CPU: both processes end with identical parameters, only rank 0 writes, and the result matches
    one process with the same global batch (float rounding aside). SGD, because Adam turns the float noise
    in gradients that are zero in exact arithmetic (attention's key bias) into full-size steps."""
    data = make_image_folder(tmp_path / "data", n_per_class=32)
    recipe = tiny_recipe(
        data, epochs=2, batch_size=16, opt="sgd", lr=0.05, warmup_epochs=0.5, model_args=dict(TINY, depth=2)
    )
    mp.spawn(_ddp_worker, args=(2, free_port(), recipe, str(tmp_path)), nprocs=2, join=True)

    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), k
    assert not (tmp_path / "rank1-must-not-exist").exists()
    assert (tmp_path / "ddp" / "model.safetensors").is_file()

    torch.manual_seed(0)
    history = train(recipe, tmp_path / "single", progress=False).history
    single = _weights(tmp_path / "single")
    for k, v in single.items():
        torch.testing.assert_close(r0["params"][k], v, rtol=1e-4, atol=1e-5, msg=k)
    assert r0["history"][-1]["test_top1"] == history[-1]["test_top1"]
    assert r0["history"][-1]["train_loss"] == pytest.approx(history[-1]["train_loss"], rel=1e-4)
