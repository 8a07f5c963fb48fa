"""Checkpoints: round trips through timm's own reader and writer, resolution changes, clear errors."""

import json
import os

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file
from timm.models._hub import save_for_hf

import vit_core
from vit_core import CheckpointError


def _small(name="vit_tiny_patch16_224", **kw):
    torch.manual_seed(0)
    return vit_core.create_model(name, **{"img_size": 64, "depth": 2, "num_classes": 5, **kw}).eval()


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("vit_tiny_patch16_224", {}),
        ("vit_small_patch16_224", dict(global_pool="avg", class_token=False)),
        ("vit_small_patch32_224", dict(img_size=(64, 96), in_chans=1, mean=(0.1,), std=(0.3,))),
        ("vit_base_r50_s16_224", dict(embed_dim=64, num_heads=2)),
    ],
    ids=["tiny", "avg-no-cls", "non-square-gray", "hybrid"],
)
def test_ours_to_timm_local_dir_same_logits(tmp_path, name, overrides):
    model = _small(name, **overrides)
    model.reset_classifier(5)
    torch.nn.init.normal_(model.head.weight)  # a non-trivial head, so logits differ per class
    vit_core.save_pretrained(model, tmp_path)
    ref = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    c, (h, w) = model.config.in_chans, model.config.img_hw
    x = torch.randn(2, c, h, w)
    with torch.no_grad():
        assert (ref(x) - model(x)).abs().max() <= 1e-5
    # timm reads our preprocessing too
    assert tuple(ref.pretrained_cfg["input_size"]) == (c, h, w)
    assert tuple(ref.pretrained_cfg["mean"]) == pytest.approx(model.config.mean)


def test_timm_to_ours_through_timms_writer(tmp_path):
    torch.manual_seed(0)
    ref = timm.create_model("vit_small_patch16_224", num_classes=10, img_size=96, depth=2, global_pool="avg").eval()
    save_for_hf(ref, tmp_path, safe_serialization=True)
    ours = vit_core.from_pretrained(tmp_path)
    assert ours.config.global_pool == "avg" and ours.config.img_hw == (96, 96) and not ours.training
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        assert (ref(x) - ours(x)).abs().max() <= 1e-5


def test_timm_state_dict_loads_into_ours_directly():
    torch.manual_seed(0)
    ref = timm.create_model("vit_base_patch32_224", depth=2).eval()
    ours = vit_core.create_model("vit_base_patch32_224", depth=2).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.equal(ref(x), ours(x))


def test_higher_resolution_load_matches_timm(tmp_path):
    # Paper section 3.2: fine-tune at a higher resolution by interpolating E_pos in 2D.
    model = _small()
    vit_core.save_pretrained(model, tmp_path)
    hi = vit_core.from_pretrained(tmp_path, img_size=96)
    assert hi.pos_embed.shape == (1, 1 + 36, 192) and hi.config.img_hw == (96, 96)
    assert torch.equal(hi.pos_embed[:, :1], model.pos_embed[:, :1])  # class token's embedding kept
    ref = timm.create_model(f"local-dir:{tmp_path}", pretrained=True, img_size=96).eval()
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        assert (ref(x) - hi(x)).abs().max() <= 1e-5
    # the same through load_state_dict of a 224-style state dict into a bigger model
    bigger = vit_core.create_model("vit_tiny_patch16_224", img_size=96, depth=2, num_classes=5).eval()
    bigger.load_state_dict(model.state_dict())
    assert torch.equal(bigger.pos_embed, hi.pos_embed)
    # saved again, the folder says 96
    vit_core.save_pretrained(hi, tmp_path / "hi")
    assert json.loads((tmp_path / "hi" / "config.json").read_text())["pretrained_cfg"]["input_size"] == [3, 96, 96]


def test_config_json_layout_and_labels(tmp_path):
    model = _small()
    model.reset_classifier(3, label_names=["cat", "dog", "emu"])
    vit_core.save_pretrained(model, tmp_path, dtype=torch.bfloat16)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architecture"] == "vit_tiny_patch16_224"
    assert (cfg["num_classes"], cfg["num_features"], cfg["global_pool"]) == (3, 192, "token")
    assert cfg["label_names"] == ["cat", "dog", "emu"]
    assert {"input_size", "mean", "std", "interpolation", "crop_pct"} <= set(cfg["pretrained_cfg"])
    assert load_file(tmp_path / "model.safetensors")["pos_embed"].dtype == torch.bfloat16
    loaded = vit_core.from_pretrained(tmp_path)
    assert loaded.label_names == ["cat", "dog", "emu"] and loaded.pos_embed.dtype == torch.float32
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # atomic writes leave nothing
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.safetensors", "config.json"):  # readable like any file, not mkstemp's private 0600
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask


def test_representation_size_round_trips_here(tmp_path):
    model = _small(representation_size=32)
    vit_core.save_pretrained(model, tmp_path)
    loaded = vit_core.from_pretrained(tmp_path)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
        for p in loaded.parameters():  # the loaded tensors are the model's own memory, not the file's
            p.mul_(0)
    assert torch.count_nonzero(load_file(tmp_path / "model.safetensors")["pos_embed"]) > 0


def test_corrupt_weights_name_the_file(tmp_path):
    vit_core.save_pretrained(_small(), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        vit_core.from_pretrained(tmp_path)


def test_missing_files_and_bad_json(tmp_path):
    with pytest.raises(CheckpointError, match="no such file or folder"):
        vit_core.from_pretrained(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        vit_core.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        vit_core.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "resnet50"}))
    with pytest.raises(CheckpointError, match="'resnet50' is not a ViT"):
        vit_core.from_pretrained(tmp_path)
    vit_core.save_pretrained(_small(), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        vit_core.from_pretrained(tmp_path)


def test_mismatched_weights_name_every_key(tmp_path):
    model = _small()
    vit_core.save_pretrained(model, tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["blocks.5.mlp.fc1.weight"] = torch.zeros(1)
    del state["norm.weight"]
    state["head.weight"] = torch.zeros(7, 192)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as err:
        vit_core.from_pretrained(tmp_path)
    msg = str(err.value)
    assert "missing keys (1): norm.weight" in msg
    assert "unexpected keys (1): blocks.5.mlp.fc1.weight" in msg
    assert "head.weight: checkpoint (7, 192) vs model (5, 192)" in msg


@pytest.mark.parametrize("pools, airbench", [(None, False), ((2, 1), False), ((2, 1), True)])
def test_conv_stem_hybrid_round_trips_in_half_precision(tmp_path, pools, airbench):
    # the bundled model's layout: a conv stem (BatchNorm statistics included; max pools or not; airbench's
    # whitening and GELU or not), 1x1 patches, avg pooling, squashed eval crops
    torch.manual_seed(0)
    cfg = vit_core.ViTConfig(
        **(dict(stem_whiten=2, stem_act="gelu") if airbench else {}),
        img_size=32,
        patch_size=1,
        stem_channels=(8, 16),
        stem_strides=(2, 2) if pools is None else (1, 2),
        stem_pools=pools,
        crop_mode="squash",
        embed_dim=32,
        depth=2,
        num_heads=2,
        global_pool="avg",
        class_token=False,
        num_classes=10,
    )
    model = vit_core.create_model(cfg).train()
    model(torch.randn(4, 3, 32, 32))  # a training step's forward moves the BatchNorm running statistics
    vit_core.save_pretrained(model.eval(), tmp_path, dtype=torch.float16)
    loaded = vit_core.from_pretrained(tmp_path)
    assert loaded.config == cfg
    for name, p in loaded.named_parameters():  # ordinary float32 CPU parameters, writable, trainable but whitening
        assert p.dtype == torch.float32 and p.device.type == "cpu"
        assert p.requires_grad == (name != "patch_embed.backbone.whiten.weight"), name
        p.data.mul_(1.0)
    stem = loaded.patch_embed.backbone.layers[0].norm
    assert stem.num_batches_tracked.item() == 1
    reference = vit_core.create_model(cfg).eval()
    reference.load_state_dict({k: v.half().to(v.dtype) for k, v in model.state_dict().items()})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), reference(x))


def test_non_square_checkpoint_loads_at_another_size_like_timm_resamples(tmp_path):
    from timm.layers import resample_abs_pos_embed

    model = _small("vit_small_patch32_224", img_size=(64, 96))  # a 2 x 3 token grid
    vit_core.save_pretrained(model, tmp_path)
    bigger = vit_core.from_pretrained(tmp_path, img_size=(128, 96))  # 4 x 3
    expected = resample_abs_pos_embed(model.pos_embed, (4, 3), (2, 3), num_prefix_tokens=1)
    assert torch.equal(bigger.pos_embed, expected)
