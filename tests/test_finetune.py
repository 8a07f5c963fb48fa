"""Fine-tuning a folder (``vit_core.finetune``): the run folder it writes, its progress, cancellation, the time
budget, the held-out split and the calibration; and the engine hooks and recipe keys it stands on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image

import vit_core
from train.__main__ import main as train_main
from vit_core.data import build_transform, load_image, storage_transform, stratified_split
from vit_core.finetune import FinetuneOptions, Monitor, Progress, finetune_folder

from .test_engine import TINY, make_image_folder, one_thread  # noqa: F401  (autouse fixture)

QUICK = dict(epochs=2, batch_size=8, cpu_precision="fp32", channels_last=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Two classes of 24 noisy squares each (``train/``), and a tiny pure ViT to start from (timm loads both)."""
    root = tmp_path_factory.mktemp("photos")
    make_image_folder(root, n_per_class=24, size=12)
    init = vit_core.create_model(vit_core.ViTConfig(**TINY, num_classes=10))
    vit_core.save_pretrained(init, root / "init")
    return root


def test_finetune_writes_a_calibrated_run_folder_that_vit_core_and_timm_load(folder, tmp_path):
    events: list[Progress] = []
    out = tmp_path / "run"
    r = finetune_folder(
        folder / "train",
        folder / "init",
        out,
        options=FinetuneOptions(minutes=None, image_size=16, overrides=QUICK),
        monitor=Monitor(on_progress=events.append),
    )
    assert r.complete and r.classes == ["blue", "red"]
    # 20% of each class held out (24 -> 5 held out, 19 kept), the batch of 8 taking 2 steps an epoch
    assert (r.train_images, r.val_images) == (38, 10)
    assert r.steps == 2 * (38 // 8) and len(r.history) == 2
    model = vit_core.from_pretrained(out)
    assert model.label_names == ["blue", "red"] and model.config.img_hw == (16, 16)
    assert model.pos_embed.shape[1] == 1 + (16 // 4) ** 2  # interpolated from the 2x2 grid at 8 px to 4x4
    cal = model.calibration
    assert cal is not None and cal.temperature == pytest.approx(r.temperature) and cal.tta == "flip"
    assert cal.ood is not None and cal.ood.threshold == pytest.approx(r.ood_threshold) and "held out" in cal.fitted_on
    held_out = json.loads((out / "eval_held-out_flip.json").read_text())
    assert held_out["count"] == 10 and held_out["top1"] == pytest.approx(r.val_accuracy)
    card = (out / "README.md").read_text()
    assert "## Calibration" in card and f"T = {r.temperature:.4g}" in card and "Incomplete" not in card
    # timm's layout: timm loads the folder and computes the same logits (it ignores the calibration)
    ref = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ref(x), model.eval()(x), rtol=1e-5, atol=1e-5)
    # progress: loading, then every step in order with its loss, the held-out accuracy after each epoch, then done
    phases = [e.phase for e in events]
    assert phases[0] == "loading" and phases[-1] == "done" and "calibrating" in phases
    steps = [e.step for e in events if e.phase == "training"]
    assert steps == sorted(steps) and set(steps) == set(range(1, r.steps + 1))
    training = [e for e in events if e.phase == "training"]
    assert all(e.loss is not None and e.total_steps >= e.step and e.eta_s >= 0 for e in training)
    assert training[-1].val_accuracy == pytest.approx(r.history[-1]["test_top1"])
    assert events[-1].val_accuracy == pytest.approx(r.val_accuracy) and events[-1].eta_s == 0


def test_the_new_head_starts_at_zero_and_the_body_from_the_checkpoint(folder, tmp_path):
    """With a learning rate of 0 nothing moves: the saved head is the zero-initialised one for the folder's
    classes, every other weight the checkpoint's."""
    zero = dict(QUICK, lr=0.0, warmup_lr=0.0, min_lr=0.0)
    finetune_folder(
        folder / "train", folder / "init", tmp_path / "run", options=FinetuneOptions(minutes=None, overrides=zero)
    )
    tuned, init = vit_core.from_pretrained(tmp_path / "run"), vit_core.from_pretrained(folder / "init")
    assert tuned.head.weight.shape == (2, 16) and not tuned.head.weight.any() and not tuned.head.bias.any()
    body = {k: v for k, v in init.state_dict().items() if not k.startswith("head.")}
    for k, v in body.items():
        torch.testing.assert_close(tuned.state_dict()[k], v, rtol=0, atol=0, msg=k)


def test_cancel_stops_after_the_step_and_leaves_a_loadable_folder_marked_incomplete(folder, tmp_path):
    events: list[Progress] = []
    stop_after = 6  # 4 steps an epoch: in the 2nd
    out = tmp_path / "run"
    r = finetune_folder(
        folder / "train",
        folder / "init",
        out,
        options=FinetuneOptions(minutes=None, overrides=dict(QUICK, epochs=50)),
        monitor=Monitor(on_progress=events.append, should_stop=lambda: events[-1].step >= stop_after),
    )
    assert not r.complete and r.steps == stop_after and r.temperature is None and r.val_accuracy is None
    assert r.history[-1]["stopped"] == "asked" and r.history[-1]["steps"] == stop_after - 4
    model = vit_core.from_pretrained(out)
    assert model.label_names == ["blue", "red"] and model.calibration is None
    assert not (out / "ood.safetensors").exists()
    assert "**Incomplete**: the training was cancelled in epoch 2" in (out / "README.md").read_text()
    assert events[-1].phase == "cancelled"


def test_a_spent_budget_ends_the_run_with_its_schedule_annealed(folder, tmp_path):
    """A budget far shorter than one step: the run stops after its first step, and the learning rate, which runs
    on the clock, has reached its end (min_lr) however few steps were taken."""
    quick = dict(QUICK, epochs=50, min_lr=1e-4)
    r = finetune_folder(
        folder / "train",
        folder / "init",
        tmp_path / "run",
        options=FinetuneOptions(minutes=1e-6, strategy="full", overrides=quick),
    )
    last = r.history[-1]
    assert r.complete and r.steps == 1 and last["stopped"] == "budget" and last["lr"] == pytest.approx(1e-4)
    assert "ended when its time budget was spent" in (tmp_path / "run" / "README.md").read_text()


def test_frozen_modules_keep_their_weights(folder, tmp_path):
    overrides = dict(QUICK, freeze=["patch_embed", "blocks.0.attn"])
    finetune_folder(
        folder / "train", folder / "init", tmp_path / "run", options=FinetuneOptions(minutes=None, overrides=overrides)
    )
    tuned, init = vit_core.from_pretrained(tmp_path / "run").state_dict(), vit_core.from_pretrained(folder / "init")
    for k, v in init.state_dict().items():
        frozen = k.startswith(("patch_embed.", "blocks.0.attn."))
        assert torch.equal(tuned[k], v) == frozen or k.startswith("head."), k


def test_the_recipe_from_the_command_line_calibrates_and_writes_the_card(folder, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--recipe", "finetune_folder", "--data", str(folder / "train"), "--init", str(folder / "init")]
    argv += ["--minutes", "0.3", "--out", str(out), "--no-progress", "--set", "epochs=1", "batch_size=8"]
    assert train_main(argv) == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["budget_minutes"] == 0.3 and recipe["val_fraction"] == 0.2 and recipe["in_memory"]
    assert vit_core.from_pretrained(out).calibration.ood is not None
    assert "## Calibration" in (out / "README.md").read_text()


def test_stratified_split_holds_out_each_class_share_the_same_way_every_time():
    targets = torch.tensor([0] * 10 + [1] * 5 + [2] * 2 + [3])
    kept, held = stratified_split(targets, 0.2)
    assert sorted(torch.cat([kept, held]).tolist()) == list(range(len(targets)))
    assert torch.bincount(targets[held], minlength=4).tolist() == [2, 1, 1, 0]  # at least 1 of 2, none of 1
    assert torch.equal(held, stratified_split(targets, 0.2)[1])
    assert not torch.equal(held, stratified_split(targets, 0.2, seed=1)[1])


@pytest.mark.parametrize("cfg", [dict(crop_pct=0.875, crop_mode="center"), dict(crop_pct=1.0, crop_mode="squash")])
def test_the_stored_copy_gives_the_eval_transform_the_pixels_of_the_original(tmp_path, cfg):
    """``decode_all`` keeps each image resized as the eval transform resizes it, before the crop: evaluating the
    stored copy gives what evaluating the original file gives."""
    pretrained_cfg = dict(input_size=(3, 32, 32), mean=(0.5,) * 3, std=(0.25,) * 3, interpolation="bicubic") | cfg
    g = torch.Generator().manual_seed(0)
    Image.fromarray((torch.rand(57, 83, 3, generator=g) * 255).byte().numpy()).save(tmp_path / "x.png")
    img = load_image(tmp_path / "x.png")
    stored = storage_transform(pretrained_cfg)(img)
    assert stored.dtype == torch.uint8 and stored.shape == (3, int(32 / cfg["crop_pct"]), int(32 / cfg["crop_pct"]))
    tf = build_transform(pretrained_cfg)
    torch.testing.assert_close(tf(stored), tf(img), rtol=0, atol=0)
