"""The model against timm (same weights, same logits) and against the paper's equations written out."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

import vit_core
from vit_core.models.cost import state_shapes


def _pair(name: str, seed: int = 0, timm_kwargs: dict | None = None, **kwargs):
    """A timm model with random weights and ours holding the same weights."""
    torch.manual_seed(seed)
    ref = timm.create_model(name, pretrained=False, **kwargs, **(timm_kwargs or {})).eval()
    ours = vit_core.create_model(name, **kwargs).eval()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize(
    "name, kwargs, size",
    [
        ("vit_tiny_patch16_224", {}, (224, 224)),
        ("vit_small_patch16_224", dict(global_pool="avg"), (224, 224)),
        ("vit_base_patch16_224", {}, (224, 224)),
        ("vit_base_patch32_224", {}, (224, 224)),
        ("vit_tiny_patch16_384", {}, (384, 384)),
        ("vit_base_r50_s16_224", dict(num_classes=10, img_size=128, depth=2), (128, 128)),
    ],
)
def test_logits_match_timm(name, kwargs, size):
    ref, ours = _pair(name, **kwargs)
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        diff = (ref(x) - ours(x)).abs().max().item()
    assert diff <= 1e-5


@pytest.mark.parametrize("name, img_size", [("vit_small_patch16_224", 224), ("vit_base_r50_s16_224", 96)])
def test_non_square_input_interpolates_position_embeddings_like_timm(name, img_size):
    # timm's dynamic_img_size resamples pos_embed per call, as ours always does.
    ref, ours = _pair(name, num_classes=10, img_size=img_size, depth=2, timm_kwargs=dict(dynamic_img_size=True))
    x = torch.randn(2, 3, 64, 128) if img_size == 96 else torch.randn(2, 3, 160, 256)
    with torch.no_grad():
        assert (ref(x) - ours(x)).abs().max().item() <= 1e-5


def test_patch_embedding_is_the_linear_projection_of_flattened_patches():
    # Eq. 1: x_p^i E with x_p^i the flattened P x P x C patch; the conv must equal unfold + matmul.
    model = vit_core.create_model("vit_tiny_patch16_224").eval()
    x = torch.randn(2, 3, 224, 224)
    P, D = 16, 192
    patches = F.unfold(x, kernel_size=P, stride=P).transpose(1, 2)  # (B, N, C*P*P), row-major patches
    E = model.patch_embed.proj.weight.reshape(D, -1).T
    expected = patches @ E + model.patch_embed.proj.bias
    got = model.patch_embed(x).reshape(2, -1, D)
    assert torch.allclose(got, expected, atol=1e-5)


def _brute_force_forward(model, x):
    """Eq. 1-4 written out with explicit per-head attention loops: the reference for logits and maps."""
    blocks_attn = []
    B = x.shape[0]
    z = model.patch_embed(x).flatten(1, 2)
    z = torch.cat([model.cls_token.expand(B, -1, -1), z], dim=1) + model.pos_embed  # eq. 1
    for blk in model.blocks:
        a = blk.attn
        h = F.layer_norm(z, (z.shape[-1],), blk.norm1.weight, blk.norm1.bias, eps=1e-6)
        qkv = h @ a.qkv.weight.T + a.qkv.bias
        q, k, v = qkv.chunk(3, dim=-1)
        hd = [slice(i * a.head_dim, (i + 1) * a.head_dim) for i in range(a.num_heads)]
        A = torch.stack(
            [torch.softmax(q[..., s] @ k[..., s].transpose(1, 2) / math.sqrt(a.head_dim), -1) for s in hd], 1
        )
        blocks_attn.append(A)  # (B, heads, T, T)
        heads = [A[:, i] @ v[..., s] for i, s in enumerate(hd)]
        z = z + torch.cat(heads, dim=-1) @ a.proj.weight.T + a.proj.bias  # eq. 2
        h = F.layer_norm(z, (z.shape[-1],), blk.norm2.weight, blk.norm2.bias, eps=1e-6)
        z = z + blk.mlp.fc2(F.gelu(blk.mlp.fc1(h)))  # eq. 3
    y = F.layer_norm(z[:, 0], (z.shape[-1],), model.norm.weight, model.norm.bias, eps=1e-6)  # eq. 4
    return model.head(y), blocks_attn


def test_return_attention_gives_same_logits_and_true_softmax_maps():
    torch.manual_seed(0)
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=64, depth=3, num_classes=7).eval()
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        plain = model(x)
        logits, attentions = model(x, return_attention=True)
        ref_logits, ref_maps = _brute_force_forward(model, x)
    assert torch.equal(plain, logits)  # the same bits, not merely close
    assert torch.allclose(logits, ref_logits, atol=1e-5)
    assert len(attentions) == 3
    for got, ref in zip(attentions, ref_maps, strict=True):
        assert got.shape == (3, 3, 17, 17)
        assert torch.allclose(got, ref, atol=1e-6)
        assert torch.allclose(got.sum(-1), torch.ones(3, 3, 17), atol=1e-6)
    # With gradients enabled the value is unchanged too.
    logits_grad, _ = model(x, return_attention=True)
    assert torch.equal(plain, logits_grad)


def test_gradients_through_returned_attention_equal_the_unfused_formula():
    torch.manual_seed(0)
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=5).eval()
    x = torch.randn(2, 3, 32, 32)
    w = model.blocks[0].attn.qkv.weight
    logits, attentions = model(x, return_attention=True)
    *grads, g_w = torch.autograd.grad(logits[:, 1].sum(), [*attentions, w])
    # Reference: the brute-force forward, differentiated against its own maps and the same weight.
    ref_logits, ref_maps = _brute_force_forward(model, x)
    *ref_grads, ref_g_w = torch.autograd.grad(ref_logits[:, 1].sum(), [*ref_maps, w])
    for g, r in zip(grads, ref_grads, strict=True):
        assert torch.allclose(g, r, atol=1e-6)
    assert torch.allclose(g_w, ref_g_w, atol=1e-6)  # parameters get the unfused model's gradient


def test_forward_features_and_head_compose_to_forward():
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32, depth=2, global_pool="avg").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        assert tokens.shape == (2, 1 + 4, 192)
        assert torch.equal(model.forward_head(tokens), model(x))


def test_bad_inputs_are_named():
    model = vit_core.create_model("vit_tiny_patch16_224")
    with pytest.raises(ValueError, match="not a multiple of the patch size 16"):
        model(torch.randn(1, 3, 224, 230))
    with pytest.raises(ValueError, match=r"expected images shaped \(B, 3, H, W\)"):
        model(torch.randn(1, 1, 224, 224))


def test_reset_classifier_is_zero_and_predicts_uniform():
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32).eval()
    model.reset_classifier(4, label_names=["a", "b", "c", "d"])
    assert model.config.num_classes == 4 and model.label_names == ["a", "b", "c", "d"]
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    with torch.no_grad():
        probs = model(torch.randn(2, 3, 32, 32)).softmax(-1)
    assert torch.allclose(probs, torch.full((2, 4), 0.25))


def test_init_schemes_follow_the_references():
    torch.manual_seed(0)
    model = vit_core.create_model("vit_small_patch16_224")
    w = model.blocks[0].mlp.fc1.weight
    assert abs(w.std().item() - 0.02) < 0.001 and model.blocks[0].mlp.fc1.bias.abs().max() == 0
    assert model.cls_token.abs().max() < 1e-4
    model.init_weights("jax")
    fan_in, fan_out = w.shape[1], w.shape[0]
    assert abs(w.std().item() - math.sqrt(2 / (fan_in + fan_out))) < 0.002  # Xavier-uniform
    assert torch.count_nonzero(model.head.weight) == 0
    pw = model.patch_embed.proj.weight
    assert abs(pw.std().item() - math.sqrt(1 / pw[0].numel())) < 0.002  # LeCun normal
    with pytest.raises(ValueError, match="init mode"):
        model.init_weights("xavier")


def test_representation_size_adds_tanh_pre_logits():
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32, representation_size=64, num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        pre = model.forward_head(model.forward_features(x), pre_logits=True)
        expected = torch.tanh(model.forward_features(x)[:, 0] @ model.pre_logits.fc.weight.T + model.pre_logits.fc.bias)
    assert pre.shape == (2, 64) and torch.allclose(pre, expected, atol=1e-6)
    assert model.head.in_features == 64


def test_grad_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32, depth=3, num_classes=4)
    x = torch.randn(2, 3, 32, 32)
    g1 = torch.autograd.grad(model(x).sum(), model.blocks[1].mlp.fc1.weight)[0]
    model.set_grad_checkpointing()
    g2 = torch.autograd.grad(model(x).sum(), model.blocks[1].mlp.fc1.weight)[0]
    assert torch.allclose(g1, g2, atol=1e-6)


def test_stochastic_depth_only_in_training():
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32, depth=4, drop_path_rate=0.5)
    assert [b.drop_path.p for b in model.blocks] == pytest.approx([0.0, 1 / 6, 2 / 6, 0.5])
    x = torch.randn(8, 3, 32, 32)
    model.train()
    assert not torch.equal(model(x), model(x))
    model.eval()
    assert torch.equal(model(x), model(x))


@pytest.mark.parametrize(
    "cfg",
    [vit_core.get_config(n) for n in vit_core.list_models()]
    + [
        vit_core.ViTConfig(img_size=(32, 48), patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=0),
        vit_core.ViTConfig(
            img_size=32,
            patch_size=8,
            embed_dim=16,
            depth=1,
            num_heads=4,
            qkv_bias=False,
            representation_size=7,
            global_pool="avg",
            class_token=False,
            mlp_ratio=1.5,
        ),
        vit_core.ViTConfig(
            img_size=28,
            patch_size=4,
            in_chans=1,
            mean=(0.1,),
            std=(0.3,),
            embed_dim=8,
            depth=1,
            num_heads=1,
            num_classes=10,
        ),
        vit_core.ViTConfig(img_size=64, patch_size=1, backbone_layers=(1, 2), embed_dim=32, depth=1, num_heads=2),
        vit_core.ViTConfig(
            img_size=32,
            patch_size=2,
            stem_channels=(8, 16, 32),
            stem_strides=(1, 2, 2),
            embed_dim=32,
            depth=2,
            num_heads=2,
            global_pool="avg",
            class_token=False,
        ),
        vit_core.ViTConfig(
            img_size=(32, 24),
            patch_size=1,
            stem_channels=(8, 8, 16),
            stem_strides=(1, 1, 1),
            stem_pools=(2, 1, 2),
            embed_dim=16,
            depth=1,
            num_heads=2,
            global_pool="avg",
            class_token=False,
        ),
    ],
    ids=lambda c: c.name or "custom",
)
def test_state_shapes_from_the_config_equal_the_built_model(cfg):
    # the loaders' pre-allocation checks rest on this table
    with torch.device("meta"):
        model = vit_core.create_model(cfg)
    assert state_shapes(cfg) == {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_group_matcher_fine_and_coarse_with_timms_grouping():
    from timm.models import group_parameters

    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32, depth=3, num_classes=4)
    fine = group_parameters(model, model.group_matcher())
    coarse = group_parameters(model, model.group_matcher(coarse=True))
    norm, head = ["norm.weight", "norm.bias"], ["head.weight", "head.bias"]
    # stem, 3 blocks, head; the final norm joins the last block, or (coarse) the head
    assert len(fine) == len(coarse) == 5
    assert fine[3][-2:] == norm and fine[4] == head
    assert coarse[3] == [n for n in fine[3] if n not in norm] and coarse[4] == norm + head
    assert fine[0] == coarse[0] == ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"]


def test_class_names_fall_back_to_indices():
    model = vit_core.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=3)
    assert model.label_names is None and model.class_names == ["0", "1", "2"]
    model.reset_classifier(2, label_names=["cat", "dog"])
    assert model.class_names == ["cat", "dog"]


def test_pooled_conv_stem_against_brute_force():
    """stem_pools: conv, max pool, BatchNorm, ReLU per layer (airbench's order), written out with torch ops;
    the token grid shrinks by stride x pool per layer, with ceil on odd sides."""
    torch.manual_seed(0)
    cfg = vit_core.ViTConfig(
        img_size=(32, 20),
        patch_size=1,
        stem_channels=(4, 8),
        stem_strides=(1, 1),
        stem_pools=(2, 2),
        embed_dim=16,
        depth=1,
        num_heads=2,
        global_pool="avg",
        class_token=False,
        num_classes=3,
    )
    model = vit_core.create_model(cfg).eval()
    for m in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.data.uniform_(0.5, 2)
    x = torch.randn(2, 3, 32, 20)
    h = x
    for layer in model.patch_embed.backbone.layers:
        n = layer.norm
        h = F.max_pool2d(F.conv2d(h, layer.conv.weight, padding=1), 2, ceil_mode=True)
        h = (h - n.running_mean[:, None, None]) / torch.sqrt(n.running_var[:, None, None] + n.eps)
        h = torch.relu(h * n.weight[:, None, None] + n.bias[:, None, None])
    assert cfg.grid_size == (8, 5) and h.shape[-2:] == (8, 5)  # 20 -> 10 -> 5; 32 -> 16 -> 8
    with torch.no_grad():
        assert torch.allclose(model.patch_embed.backbone(x), h, atol=1e-5)
        assert model(x).shape == (2, 3)


@pytest.mark.parametrize("class_token, pool", [(True, "token"), (False, "avg")])
def test_forward_flops_against_the_hand_count(class_token, pool):
    """Multiply-adds counted by hand (2 FLOPs each): the patch projection, per block q/k/v, output projection,
    MLP and the two attention products (scores and weighted sum), and the head. Norms, softmax and GELU
    are not counted, as in the published GMAC tables."""
    cfg = vit_core.ViTConfig(
        img_size=(32, 48),
        patch_size=8,
        embed_dim=24,
        depth=3,
        num_heads=3,
        mlp_ratio=2.0,
        num_classes=7,
        class_token=class_token,
        global_pool=pool,
    )
    N, C, P, D, M, K, L = 4 * 6, 3, 8, 24, 48, 7, 3
    T = N + class_token
    want = 2 * N * D * C * P * P + L * (2 * T * (3 * D * D + D * D + 2 * D * M) + 2 * 2 * T * T * D) + 2 * D * K
    assert vit_core.models.cost.forward_flops(cfg) == want


def test_forward_flops_of_vit_b16_is_the_published_17_6_gmacs():
    """timm's model table lists vit_base_patch16_224 at 17.6 GMACs (35.1 GFLOPs)."""
    flops = vit_core.models.cost.forward_flops(vit_core.get_config("vit_base_patch16_224"))
    assert flops / 2 / 1e9 == pytest.approx(17.6, abs=0.05)
