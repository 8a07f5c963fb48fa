"""The variant registry against timm: names, parameter counts and state-dict layout."""

import numpy as np
import pytest
import timm
import torch

import vit_core
from tests.test_docs import marked_block
from vit_core import ViTConfig
from vit_core.models.variants import size_name

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
def test_defaults_build_what_timm_builds(name):
    # The name alone, in both libraries: timm sizes the head for the name's default pretrained weights
    # (ImageNet-21k backbones such as vit_huge_patch14_224 have none). Built on the meta device: shapes
    # without memory, so ViT-H costs nothing.
    with torch.device("meta"):
        ref = timm.create_model(name)
        ours = vit_core.create_model(name)
    assert ours.num_params() == sum(p.numel() for p in ref.parameters())
    assert _shapes(ours) == _shapes(ref)
    # and the preprocessing of those weights
    pretrained = timm.models.get_pretrained_cfg(name)
    cfg = ours.config
    assert (cfg.num_classes, cfg.mean, cfg.std) == (pretrained.num_classes, pretrained.mean, pretrained.std)
    assert (cfg.crop_pct, cfg.interpolation) == (pretrained.crop_pct, pretrained.interpolation)
    assert (cfg.in_chans, *cfg.img_hw) == pretrained.input_size


@pytest.mark.parametrize("name", PUBLISHED_PARAMS)
def test_published_parameter_counts(name):
    with torch.device("meta"):
        assert vit_core.create_model(name, num_classes=1000).num_params() == PUBLISHED_PARAMS[name]


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
        (dict(global_pool="max"), "global_pool must be 'token' or 'avg'"),
        (dict(class_token=False), "global_pool='token' needs class_token"),
        (dict(embed_dim=100, num_heads=3), "not divisible by num_heads"),
        (dict(img_size=30, patch_size=4), "not a multiple of patch_size"),
        (dict(in_chans=1), "mean/std need 1 values"),
        (dict(num_classes=3, label_names=("a", "b")), "2 label_names for num_classes=3"),
        (dict(depth="six"), "depth must be an integer, got 'six'"),
        (dict(depth=True), "depth must be an integer, got True"),
        (dict(depth=2000), r"depth must be in 1\.\.1024"),
        (dict(num_heads=0), "num_heads must be >= 1, got 0"),
        (dict(patch_size=0), "patch_size must be >= 1, got 0"),
        (dict(embed_dim=-64), "embed_dim must be >= 1, got -64"),
        (dict(num_classes=-1), "num_classes must be >= 0"),
        (dict(img_size=(0, 16)), "img_size must be >= 1"),
        (dict(img_size=(16, 16, 16)), r"img_size must be an integer or \[h, w\]"),
        (dict(mlp_ratio=0.0), "mlp_ratio must give an MLP"),
        (dict(norm_eps=0.0), "norm_eps must be > 0"),
        (dict(drop_path_rate=1.0), r"drop_path_rate must be in \[0, 1\)"),
        (dict(mean="abc"), "mean must be a list of numbers, got 'abc'"),
        (dict(std=(0.5, 0.0, 0.5)), "std must be > 0"),
        (dict(crop_pct=0.0), r"crop_pct must be in \(0, 1\]"),
        (dict(interpolation="lanczos"), "interpolation must be one of nearest, bilinear, bicubic"),
        (dict(label_names=12345), "label_names must be a list of strings or null, got 12345"),
        (dict(backbone_layers=(3, 4, 9), patch_size=2), "ResNet hybrid takes 1x1 patches"),
        (dict(backbone_layers=(3, 4, 9), stem_channels=(8,), stem_strides=(2,)), "either a ResNet"),
        (dict(stem_channels=(8, 16), stem_strides=(2,)), r"one stride \(and pool\) per channel count"),
        (dict(stem_channels=(8, 16), stem_strides=(1, 1), stem_pools=(2,)), r"one stride \(and pool\)"),
        (dict(stem_channels=(8,), stem_strides=(1,), stem_pools=(0,)), "strides and pools >= 1"),
        (dict(stem_channels=(8,), stem_strides=(1,), stem_pools=(4,), img_size=40, patch_size=4), "10x10 feature"),
        (dict(crop_mode="border"), "crop_mode must be 'center' or 'squash'"),
        (dict(stem_channels=(8,), stem_strides=(1,), stem_act="swish"), "stem_act must be one of relu, gelu"),
        (dict(stem_whiten=2), "stem_whiten and stem_act belong to a conv stem"),
        (dict(stem_channels=(8,), stem_strides=(1,), stem_whiten=0), "stem_whiten is the whitening convolution"),
        (dict(stem_channels=(8,), stem_strides=(2,), img_size=30, patch_size=2), "15x15 feature map is not a multiple"),
    ],
)
def test_invalid_configs_are_rejected_with_the_reason(bad, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**bad)


def test_values_from_json_are_normalised():
    cfg = ViTConfig(
        img_size=[32, 48],
        mean=[0.1, 0.2, 0.3],
        std=[1, 1, 1],
        stem_channels=[8],
        stem_strides=[2],
        patch_size=np.int64(1),
        mlp_ratio=np.float32(2.0),
    )
    assert cfg.img_size == (32, 48) and cfg.mean == (0.1, 0.2, 0.3) and cfg.stem_channels == (8,)
    assert type(cfg.patch_size) is int and type(cfg.mlp_ratio) is float
    assert cfg.grid_size == (16, 24)
    hash(cfg)  # lists would make it unhashable


def test_size_names_are_the_papers():
    names = ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224"]
    assert [size_name(vit_core.get_config(n)) for n in names] == ["Ti", "S", "B", "L"]
    assert size_name(vit_core.get_config("vit_huge_patch14_224")) == "H"
    assert size_name(ViTConfig(embed_dim=64, depth=2, num_heads=2)) is None


def test_every_stem_activation_the_config_accepts_is_built():
    from vit_core.models.config import STEM_ACTS
    from vit_core.models.hybrid import ACTIVATIONS

    assert set(ACTIVATIONS) == set(STEM_ACTS)
    for act in STEM_ACTS:
        cfg = ViTConfig(
            img_size=8,
            patch_size=1,
            embed_dim=8,
            depth=1,
            num_heads=1,
            stem_channels=(4,),
            stem_strides=(2,),
            stem_act=act,
        )
        stem = vit_core.create_model(cfg).patch_embed.backbone
        assert stem.layers[0].act is ACTIVATIONS[act]


def test_the_variant_docs_extending_md_shows_runs():
    """docs/extending.md's "A model variant" example: a registered name against timm's, as the page says."""
    exec(compile(marked_block("variant"), "docs/extending.md", "exec"), {})
