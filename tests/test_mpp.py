"""Masked patch prediction (paper section 4.6, appendix B.1.2): corruption statistics, colour targets
against a brute-force loop, the wrapper's forward pass, and pre-train -> fine-tune through the engine."""

from __future__ import annotations

import math

import pytest
import torch

import vit_core
from vit_core.training.mpp import KEEP, MASK, RANDOM, MaskedPatchPrediction, corrupt_patches, patch_colour_targets

from .test_engine import make_image_folder, one_thread  # noqa: F401  (autouse fixture)

TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=0)


def _within(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    """``count`` successes in ``n`` trials is within ``sigmas`` binomial standard deviations of ``p``."""
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_corruption_statistics_match_the_paper():
    """50% of the patches of every image are corrupted; of those 80% [mask], 10% another patch, 10% kept."""
    B, N, D = 1000, 64, 8
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(B, N, D, generator=g)
    mask_token = torch.randn(1, 1, D, generator=g)
    out, kind = corrupt_patches(tokens, mask_token, generator=g)

    chosen = kind > 0
    assert (chosen.sum(1) == N // 2).all()  # exactly half of every image
    n = int(chosen.sum())
    assert _within(int((kind == MASK).sum()), n, 0.8)
    assert _within(int((kind == RANDOM).sum()), n, 0.1)
    assert _within(int((kind == KEEP).sum()), n, 0.1)
    # every position is chosen about half the time (uniform choice)
    per_position = chosen.sum(0)
    assert all(_within(int(c), B, 0.5) for c in per_position)

    assert torch.equal(out[kind == MASK], mask_token.view(1, D).expand(int((kind == MASK).sum()), D))
    untouched = (kind == 0) | (kind == KEEP)
    assert torch.equal(out[untouched], tokens[untouched])
    # a RANDOM position holds some *other* patch's embedding (brute-force search over the batch)
    flat = tokens.reshape(B * N, D)
    own = torch.arange(B * N).view(B, N)[kind == RANDOM]
    dist = torch.cdist(out[kind == RANDOM], flat, compute_mode="donot_use_mm_for_euclid_dist")
    source = dist.argmin(1)
    assert torch.allclose(dist.min(1).values, torch.zeros(len(source)), atol=1e-5)
    assert (source != own).all()
    # drawn from the whole batch: mostly from other images
    other_image = (source // N) != (own // N)
    assert _within(int(other_image.sum()), len(source), (B * N - N) / (B * N - 1))


def test_colour_targets_match_brute_force():
    """3 bits per channel of each patch's mean colour, class r*64 + g*8 + b, patches in row-major order."""
    g = torch.Generator().manual_seed(1)
    images = torch.rand(3, 3, 12, 8, generator=g)
    images[0, :, :4, :4] = 1.0  # a saturated patch: class 511
    images[0, :, 4:8, :4] = 0.0  # a black one: class 0
    got = patch_colour_targets(images, patch_size=4)
    assert got.shape == (3, 6)
    for b in range(3):
        k = 0
        for py in range(3):
            for px in range(2):
                patch = images[b, :, py * 4 : py * 4 + 4, px * 4 : px * 4 + 4]
                r, gr, bl = (min(int(float(patch[c].mean()) * 8), 7) for c in range(3))
                assert got[b, k] == r * 64 + gr * 8 + bl
                k += 1
    assert got[0, 0] == 511 and got[0, 2] == 0
    # grayscale: 8 classes
    assert patch_colour_targets(torch.full((1, 1, 4, 4), 0.3), 4).item() == int(0.3 * 8)


def test_forward_predicts_the_corrupted_patches_colours():
    torch.manual_seed(0)
    vit = vit_core.create_model(vit_core.ViTConfig(**TINY))
    mpp = MaskedPatchPrediction(vit)
    mean, std = torch.tensor(vit.config.mean).view(1, 3, 1, 1), torch.tensor(vit.config.std).view(1, 3, 1, 1)
    images01 = torch.rand(4, 3, 16, 16)
    logits, targets = mpp((images01 - mean) / std, generator=torch.Generator().manual_seed(0))
    assert logits.shape == (4 * 8, 512) and targets.shape == (4 * 8,)
    # the targets are the colour classes of the chosen patches of the *unnormalised* image
    _, kind = corrupt_patches(torch.zeros(4, 16, 16), torch.zeros(1, 1, 16), generator=torch.Generator().manual_seed(0))
    assert torch.equal(targets, patch_colour_targets(images01, 4)[kind > 0])

    torch.nn.functional.cross_entropy(logits, targets).backward()
    for name in (
        "mask_token",
        "head.weight",
        "vit.patch_embed.proj.weight",
        "vit.pos_embed",
        "vit.blocks.1.mlp.fc2.weight",
    ):
        assert dict(mpp.named_parameters())[name].grad.abs().sum() > 0, name
    assert mpp.no_weight_decay() == {"mask_token", "vit.pos_embed", "vit.cls_token"}


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_uncorrupted_patches_go_through_the_models_own_forward(pool):
    """With every chosen patch kept (probs 0, 0, 1) the wrapper's encoder is the ViT's forward_features
    (plus fc_norm for average pooling, which normalises after pooling)."""
    torch.manual_seed(0)
    cfg = vit_core.ViTConfig(**TINY, global_pool=pool, class_token=pool == "token")
    vit = vit_core.create_model(cfg).eval()
    mpp = MaskedPatchPrediction(vit, probs=(0.0, 0.0, 1.0)).eval()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        logits, _ = mpp(x, generator=torch.Generator().manual_seed(0))
        _, kind = corrupt_patches(
            torch.zeros(3, 16, 16), torch.zeros(1, 1, 16), generator=torch.Generator().manual_seed(0)
        )
        tokens = vit.fc_norm(vit.forward_features(x))[:, vit.num_prefix_tokens :]
        assert torch.equal(logits, mpp.head(tokens[kind > 0]))


def test_hybrid_models_are_refused():
    vit = vit_core.create_model("vit_base_r50_s16_224", num_classes=0, img_size=64, depth=1)
    with pytest.raises(ValueError, match="hybrid"):
        MaskedPatchPrediction(vit)


def test_pretrain_then_finetune_through_the_engine(tmp_path):
    """task='mpp' trains the wrapper, saves the bare ViT (no head) as a normal checkpoint, and a classify
    run with init= fine-tunes it with a new zero-initialised head."""
    from vit_core.training.engine import train

    model_args = dict(TINY, img_size=8, crop_pct=1.0)
    del model_args["num_classes"]
    data = make_image_folder(tmp_path / "data")
    common = dict(
        data=str(data),
        model_args=model_args,
        augment=dict(crop="none", hflip=False),
        batch_size=16,
        lr=3e-3,
        device="cpu",
    )
    history = train(dict(common, task="mpp", epochs=4), tmp_path / "mpp", progress=False).history
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert {"test_loss", "test_acc"} <= set(history[-1])

    pretrained = vit_core.from_pretrained(tmp_path / "mpp")
    assert pretrained.config.num_classes == 0
    finetune = dict(common, init=str(tmp_path / "mpp"), epochs=1)
    del finetune["model_args"]
    train(finetune, tmp_path / "ft", progress=False)
    tuned = vit_core.from_pretrained(tmp_path / "ft")
    assert tuned.config.num_classes == 2 and tuned.label_names == ["blue", "red"]
    # the encoder started from the pre-trained weights (fine-tuning moved them only a little)
    w0, w1 = pretrained.patch_embed.proj.weight, tuned.patch_embed.proj.weight
    assert (w1 - w0).norm() < 0.5 * w0.norm()
