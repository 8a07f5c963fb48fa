"""Weights from transformers and from the original JAX .npz files load into ours with the same logits.

References: transformers' own ViT (built with random weights, saved with ``save_pretrained``) and timm.
The JAX-layout writer below is checked against timm's independent reader (``_load_weights``) before our
loader is tested on its output, so a writer mistake cannot hide a loader mistake.
"""

from functools import partial

import numpy as np
import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import _load_weights as timm_load_npz
from timm.models.vision_transformer_hybrid import HybridEmbed, _resnetv2

import vit_core
from vit_core import CheckpointError

transformers = pytest.importorskip("transformers", reason="transformers is a test requirement (requirements-dev.txt)")


def _randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Weights far from init (norm scales around 1, everything else N(0, 0.1)), so that a transposed or
    swapped tensor changes the logits a lot instead of hiding in a near-zero init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            is_scale = p.ndim == 1 and ("norm" in name or "layernorm" in name) and name.endswith("weight")
            p.copy_(1 + 0.1 * noise if is_scale else 0.1 * noise)


def _images(n: int, size: int) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------ transformers


def _tiny_transformers_config(**kwargs):
    return transformers.ViTConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        **kwargs,
    )


def test_transformers_image_classifier_loads_with_the_same_logits(tmp_path):
    labels = ["cat", "dog", "emu", "gnu", "yak"]
    cfg = _tiny_transformers_config(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    ref = transformers.ViTForImageClassification(cfg).eval()
    _randomize(ref)
    ref.save_pretrained(tmp_path / "hf", safe_serialization=True)

    ours = vit_core.from_pretrained(tmp_path / "hf")
    x = _images(3, 32)
    with torch.no_grad():
        expected = ref(pixel_values=x).logits
        got = ours(x)
    assert expected.abs().max() > 0.5  # the comparison below is not between two near-zero tensors
    # transformers' LayerNorm eps (1e-12, not timm's 1e-6) is carried in the config: the conversion is exact
    assert ours.config.norm_eps == 1e-12
    assert (got - expected).abs().max().item() <= 1e-6
    vit_core.save_pretrained(ours, tmp_path / "ours")  # and it survives our own save and load
    with torch.no_grad():
        assert torch.equal(vit_core.from_pretrained(tmp_path / "ours")(x), got)
    c = ours.config
    assert (c.embed_dim, c.depth, c.num_heads, c.mlp_ratio, c.patch_size, c.img_hw) == (48, 2, 3, 2.0, 8, (32, 32))
    assert c.num_classes == 5 and ours.label_names == labels and c.representation_size is None


def test_transformers_backbone_pooler_becomes_the_pre_logits_layer(tmp_path):
    # ViTModel's pooler (dense + tanh on the class token) is the paper's pre-training head.
    ref = transformers.ViTModel(_tiny_transformers_config(), add_pooling_layer=True).eval()
    _randomize(ref, seed=1)
    ref.save_pretrained(tmp_path / "hf")
    ours = vit_core.from_pretrained(tmp_path / "hf")
    assert ours.config.num_classes == 0 and ours.config.representation_size == 48
    x = _images(2, 32)
    with torch.no_grad():
        assert (ours(x) - ref(pixel_values=x).pooler_output).abs().max().item() <= 1e-4


def test_non_vit_transformers_checkpoint_is_refused_before_reading_weights(tmp_path):
    bert = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    bert.save_pretrained(tmp_path / "bert")  # config only: the refusal must not depend on the weights
    with pytest.raises(CheckpointError, match="model_type 'bert' is not a Vision Transformer"):
        vit_core.from_pretrained(tmp_path / "bert")


# ------------------------------------------------------------------------------ JAX .npz


def _jax_arrays(sd: dict[str, torch.Tensor], num_heads: int, prefix: str = "") -> dict[str, np.ndarray]:
    """A timm/vit_core state dict in the Flax layout of google-research/vision_transformer."""
    n = {k: v.detach().float().numpy() for k, v in sd.items()}
    D = n["cls_token"].shape[-1]
    hd = D // num_heads
    w = {
        "embedding/kernel": n["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # (out, in, h, w) -> (h, w, in, out)
        "embedding/bias": n["patch_embed.proj.bias"],
        "cls": n["cls_token"],
        "Transformer/posembed_input/pos_embedding": n["pos_embed"],
        "Transformer/encoder_norm/scale": n["norm.weight"],
        "Transformer/encoder_norm/bias": n["norm.bias"],
    }
    depth = len({k.split(".")[1] for k in n if k.startswith("blocks.")})
    for i in range(depth):
        b, t = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        mha = b + "MultiHeadDotProductAttention_1/"
        for j, name in enumerate(("query", "key", "value")):
            w[f"{mha}{name}/kernel"] = n[t + "attn.qkv.weight"][j * D : (j + 1) * D].T.reshape(D, num_heads, hd)
            w[f"{mha}{name}/bias"] = n[t + "attn.qkv.bias"][j * D : (j + 1) * D].reshape(num_heads, hd)
        w[mha + "out/kernel"] = n[t + "attn.proj.weight"].T.reshape(num_heads, hd, D)
        w[mha + "out/bias"] = n[t + "attn.proj.bias"]
        for ln, ours in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            w[f"{b}{ln}/scale"], w[f"{b}{ln}/bias"] = n[f"{t}{ours}.weight"], n[f"{t}{ours}.bias"]
        for r in (0, 1):
            w[f"{b}MlpBlock_3/Dense_{r}/kernel"] = n[f"{t}mlp.fc{r + 1}.weight"].T
            w[f"{b}MlpBlock_3/Dense_{r}/bias"] = n[f"{t}mlp.fc{r + 1}.bias"]
    if "head.weight" in n:
        w["head/kernel"], w["head/bias"] = n["head.weight"].T, n["head.bias"]
    if "pre_logits.fc.weight" in n:
        w["pre_logits/kernel"], w["pre_logits/bias"] = n["pre_logits.fc.weight"].T, n["pre_logits.fc.bias"]
    bb = "patch_embed.backbone."
    if bb + "stem.conv.weight" in n:
        w["conv_root/kernel"] = n[bb + "stem.conv.weight"].transpose(2, 3, 1, 0)
        w["gn_root/scale"], w["gn_root/bias"] = n[bb + "stem.norm.weight"], n[bb + "stem.norm.bias"]
        for key in [k for k in n if k.startswith(bb + "stages.")]:
            *_, i, _, j, module, param = key.replace("downsample.", "downsample_").split(".")
            unit = f"block{int(i) + 1}/unit{int(j) + 1}/"  # stages.I.blocks.J -> blockI+1/unitJ+1
            name = {"downsample_conv": "conv_proj", "downsample_norm": "gn_proj"}.get(module, module)
            if name.startswith("conv"):
                w[f"{unit}{name}/kernel"] = n[key].transpose(2, 3, 1, 0)
            else:  # GroupNorm normK -> gnK
                w[f"{unit}{name.replace('norm', 'gn')}/{'scale' if param == 'weight' else 'bias'}"] = n[key]
    return {prefix + k: v for k, v in w.items()}


def _tiny_timm_hybrid():
    backbone = _resnetv2(layers=(1, 1, 1))  # the paper's R50 stem with one block per stage: stride 16
    return TimmViT(
        img_size=64,
        patch_size=1,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=5,
        embed_layer=partial(HybridEmbed, backbone=backbone),
    )


def _tiny_timm_vit():
    return timm.create_model("vit_tiny_patch16_224", img_size=64, depth=3, num_classes=7)


@pytest.mark.parametrize(
    "make, prefix, expected",
    [
        (_tiny_timm_vit, "", dict(embed_dim=192, depth=3, num_heads=3, patch_size=16, num_classes=7)),
        (_tiny_timm_vit, "opt/target/", dict(embed_dim=192, depth=3, num_heads=3, patch_size=16, num_classes=7)),
        (_tiny_timm_hybrid, "", dict(embed_dim=32, depth=2, num_heads=2, backbone_layers=(1, 1, 1), num_classes=5)),
    ],
    ids=["vit", "vit-optimizer-state-layout", "r50-hybrid"],
)
def test_jax_npz_loads_with_the_same_logits_as_timm(tmp_path, make, prefix, expected):
    ref = make().eval()
    _randomize(ref)
    path = tmp_path / "ViT.npz"
    np.savez(path, **_jax_arrays(ref.state_dict(), expected["num_heads"], prefix))

    # The writer is right iff timm's own npz reader rebuilds the same weights from the file.
    check = make().eval()
    timm_load_npz(check, str(path))
    for k, v in ref.state_dict().items():
        assert torch.equal(check.state_dict()[k], v), k

    ours = vit_core.from_pretrained(path)  # the architecture is read from the arrays alone
    assert {k: getattr(ours.config, k) for k in expected} == expected
    assert ours.config.img_hw == (64, 64)
    x = _images(2, 64)
    with torch.no_grad():
        assert (ours(x) - ref(x)).abs().max().item() <= 1e-5


def test_npz_pre_logits_become_representation_size(tmp_path):
    # ImageNet-21k releases keep the paper's pre-training head; timm drops it, we load it.
    src = vit_core.create_model(
        vit_core.ViTConfig(
            img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4, representation_size=24
        )
    ).eval()
    _randomize(src)
    np.savez(tmp_path / "ViT-21k.npz", **_jax_arrays(src.state_dict(), num_heads=2))
    ours = vit_core.from_pretrained(tmp_path / "ViT-21k.npz")
    assert ours.config.representation_size == 24
    x = _images(2, 32)
    with torch.no_grad():
        assert torch.allclose(ours(x), src(x), atol=1e-6)


def test_bad_npz_files_are_refused_clearly(tmp_path):
    src = vit_core.create_model(vit_core.ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2))
    arrays = _jax_arrays(src.state_dict(), num_heads=2)
    np.savez(tmp_path / "gap.npz", **{k: v for k, v in arrays.items() if k != "cls"})
    with pytest.raises(CheckpointError, match="no class token"):
        vit_core.from_pretrained(tmp_path / "gap.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(CheckpointError, match="not a google-research ViT"):
        vit_core.from_pretrained(tmp_path / "other.npz")
    np.savez(tmp_path / "pickled.npz", embedding=np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="not a readable .npz"):
        vit_core.from_pretrained(tmp_path / "pickled.npz")
