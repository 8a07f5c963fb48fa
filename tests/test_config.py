"""The variant registry against timm: names, parameter counts and state-dict layout."""

import pytest
import timm
import torch

import vit_core
from vit_core import ViTConfig

# Published sizes (timm's model cards; the paper's table 1 rounds them to 86M / 307M / 632M).
PUBLISHED_PARAMS = {
    "vit_base_patch16_224": 86_567_656,
    "vit_large_patch16_224": 304_326_632,
    "vit_huge_patch14_224": 632_045_800,
}


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_registry_names_are_timm_names():
    ours = vit_core.list_models()
    assert len(ours) >= 20
    assert not set(ours) - set(timm.list_models())
    for size in ("tiny", "small", "base", "large", "huge"):
        assert any(f"vit_{size}_" in n for n in ours)
    for hybrid in ("vit_base_r50_s16_224", "vit_base_r50_s16_384", "vit_large_r50_s32_224", "vit_large_r50_s32_384"):
        assert hybrid in ours


@pytest.mark.parametrize("name", vit_core.list_models())
def test_parameter_count_and_layout_equal_timm(name):
    # Built on the meta device: shapes without memory, so ViT-H costs nothing.
    with torch.device("meta"):
        ref = timm.create_model(name, num_classes=1000)
        ours = vit_core.create_model(name)
    assert ours.num_params() == sum(p.numel() for p in ref.parameters())
    assert _shapes(ours) == _shapes(ref)
    if name in PUBLISHED_PARAMS:
        assert ours.num_params() == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(global_pool="avg"),
        dict(global_pool="avg", class_token=False),
        dict(num_classes=0),
        dict(in_chans=1, mean=(0.5,), std=(0.5,)),
        dict(img_size=(224, 320)),
        dict(qkv_bias=False, mlp_ratio=2.0),
    ],
    ids=str,
)
def test_configurations_keep_timm_layout(overrides):
    timm_args = {k: v for k, v in overrides.items() if k not in ("mean", "std")}
    with torch.device("meta"):
        ref = timm.create_model("vit_small_patch16_224", **timm_args)
        ours = vit_core.create_model("vit_small_patch16_224", **overrides)
    assert _shapes(ours) == _shapes(ref)


def test_get_config_overrides_and_unknown_names():
    cfg = vit_core.get_config("vit_base_patch16_384", num_classes=10)
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.img_hw, cfg.num_classes) == (768, 12, 12, (384, 384), 10)
    assert cfg.grid_size == (24, 24) and cfg.crop_pct == 1.0
    assert vit_core.get_config("vit_base_r50_s16_224").grid_size == (14, 14)
    assert vit_core.get_config("vit_large_r50_s32_384").grid_size == (12, 12)
    with pytest.raises(KeyError, match="unknown model 'vit_base_patch15_224'.*similar"):
        vit_core.get_config("vit_base_patch15_224")
    with pytest.raises(TypeError, match="unknown ViTConfig field.*embed_size"):
        cfg.replace(embed_size=3)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(global_pool="max"), "global_pool must be"),
        (dict(class_token=False), "global_pool='token' needs class_token"),
        (dict(embed_dim=100, num_heads=3), "not divisible by num_heads"),
        (dict(img_size=30, patch_size=4), "not a multiple of patch_size"),
        (dict(in_chans=1), "mean/std need 1 values"),
        (dict(num_classes=3, label_names=("a", "b")), "2 label_names for num_classes=3"),
    ],
)
def test_invalid_configs_are_rejected_with_the_reason(bad, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**bad)
