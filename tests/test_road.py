"""vit_core.explain.road against plainly written references: the imputation against a dense solve of the linear
system built entry by entry as the authors' ``NoisyLinearImputer.setup_sparse_system`` builds it, and the
scores against a loop over images and removal fractions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vit_core
from vit_core import explain
from vit_core.explain import road

# the authors' ``neighbors_weights``: (row offset, column offset), weight
NEIGHBOURS = [((1, 1), 1 / 12), ((0, 1), 1 / 6), ((-1, 1), 1 / 12), ((1, -1), 1 / 12)]
NEIGHBOURS += [((0, -1), 1 / 6), ((-1, -1), 1 / 12), ((1, 0), 1 / 6), ((-1, 0), 1 / 6)]


def reference_imputation(image: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """One image (C, H, W), mask (H, W): the system of ``setup_sparse_system`` written densely, one removed
    pixel (equation) and one neighbour at a time, solved exactly in float64."""
    C, H, W = image.shape
    unknown = [(i, j) for i in range(H) for j in range(W) if removed[i, j]]
    index = {p: n for n, p in enumerate(unknown)}
    A = torch.zeros(len(unknown), len(unknown), dtype=torch.float64)
    b = torch.zeros(len(unknown), C, dtype=torch.float64)
    for n, (i, j) in enumerate(unknown):
        total = 1.0  # sum_neighbors: 1, less the weights of neighbours outside the image
        for (di, dj), w in NEIGHBOURS:
            y, x = i + di, j + dj
            if not (0 <= y < H and 0 <= x < W):
                total -= w
            elif removed[y, x]:
                A[n, index[y, x]] = w
            else:
                b[n] -= w * image[:, y, x].double()
        A[n, n] = -total
    out = image.clone().double()
    solution = torch.linalg.solve(A, b)
    for n, (i, j) in enumerate(unknown):
        out[:, i, j] = solution[n]
    return out


@pytest.mark.parametrize("size", [(12, 12), (9, 13)])
def test_imputation_solves_the_papers_linear_system(size):
    H, W = size
    g = torch.Generator().manual_seed(0)
    images = torch.randn(4, 3, H, W, generator=g)
    removed = torch.zeros(4, 1, H, W, dtype=torch.bool)
    removed[0, 0] = torch.rand(H, W, generator=g) < 0.3
    removed[1, 0] = torch.rand(H, W, generator=g) < 0.9
    removed[2, 0, : H // 2, : W // 2 + 1] = True  # a block on the corner
    removed[3, 0] = True
    removed[3, 0, H // 2, W // 2] = False  # everything but one pixel
    got = road.noisy_linear_imputation(images, removed)
    assert torch.equal(got[~removed.expand_as(got)], images[~removed.expand_as(images)])
    for b in range(4):
        want = reference_imputation(images[b], removed[b, 0]).float()
        torch.testing.assert_close(got[b], want, rtol=1e-4, atol=1e-4)
    # a removed pixel is the weighted mean of its neighbours, so a constant image stays constant
    flat = road.noisy_linear_imputation(torch.full((1, 3, H, W), 0.7), removed[1:2])
    torch.testing.assert_close(flat, torch.full_like(flat, 0.7))


def test_imputation_noise_has_the_given_sigma_per_channel():
    images = torch.zeros(2, 3, 64, 64)
    removed = torch.rand(2, 1, 64, 64, generator=torch.Generator().manual_seed(0)) < 0.5
    sigma = torch.tensor([0.01, 0.1, 1.0])
    a = road.noisy_linear_imputation(images, removed, sigma, torch.Generator().manual_seed(1))
    b = road.noisy_linear_imputation(images, removed, sigma, torch.Generator().manual_seed(1))
    c = road.noisy_linear_imputation(images, removed, sigma, torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    for ch in range(3):
        filled = a[:, ch][removed[:, 0]]
        assert filled.std().item() == pytest.approx(sigma[ch].item(), rel=0.05)
        assert abs(filled.mean().item()) < 0.05 * sigma[ch].item()
    assert (a[~removed.expand_as(a)] == 0).all()


class CornerModel(nn.Module):
    """Class 0's evidence is the brightness of the top-left 4x4 corner only."""

    config = vit_core.ViTConfig(img_size=16, patch_size=4)

    def forward(self, x):
        s = 4 * x[:, :, :4, :4].mean(dim=(1, 2, 3))
        return torch.stack([s, -s], dim=-1)


def reference_road(model, images, maps, target, fractions):
    """One image, one order and one fraction at a time; pixel order from a plain stable sort."""
    B, _, H, W = images.shape
    out = {"morf": [], "lerf": []}
    for b in range(B):
        m = F.interpolate(maps[b][None, None], size=(H, W), mode="bilinear", align_corners=False).flatten()
        order = sorted(range(H * W), key=lambda i: -m[i].item())  # most relevant first; Python's sort is stable
        for name in out:
            curve = []
            for f in fractions:
                k = round(f * H * W)
                drop = order[:k] if name == "morf" else order[H * W - k :]
                removed = torch.zeros(1, 1, H, W, dtype=torch.bool)
                for i in drop:
                    removed[0, 0, i // W, i % W] = True
                x = road.noisy_linear_imputation(images[b : b + 1], removed)
                with torch.no_grad():
                    curve.append(model(x).softmax(-1)[0, target[b]].item())
            out[name].append(curve)
    return {k: torch.tensor(v) for k, v in out.items()}


def test_road_matches_a_loop_over_images_and_fractions():
    torch.manual_seed(0)
    model = vit_core.create_model(vit_core.ViTConfig(img_size=16, patch_size=4, embed_dim=12, depth=1, num_heads=3))
    model.eval()
    x = torch.randn(3, 3, 16, 16)
    maps = explain.attention_rollout(model, x)
    fractions = (0.2, 0.5, 0.75)
    got = road.road(model, x, explain.attention_rollout, [1, 2, 3], fractions, noise=0.0, batch_size=4)
    want = reference_road(model, x, maps, [1, 2, 3], fractions)
    for name in ("morf", "lerf"):
        torch.testing.assert_close(got[f"{name}_curve"], want[name], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[name], want[name].mean(1), rtol=1e-4, atol=1e-5)
    # the noise is σ / std in normalised units, fixed by the seed
    noisy = road.road(model, x, explain.attention_rollout, [1, 2, 3], fractions, seed=5)
    assert torch.equal(
        noisy["morf"], road.road(model, x, explain.attention_rollout, [1, 2, 3], fractions, seed=5)["morf"]
    )
    assert not torch.equal(noisy["morf"], got["morf"])


def test_road_ranks_a_right_map_above_a_wrong_one():
    """A bright corner on a dark image: removing it first (the right map) and imputing it from its dark
    neighbours removes the evidence at once; removing it last keeps it to the end."""
    x = torch.zeros(4, 3, 16, 16) - 0.5 + 0.1 * torch.rand(4, 3, 16, 16)
    x[:, :, :4, :4] = 1.0
    right = torch.zeros(4, 4, 4)
    right[:, 0, 0] = 1

    def right_fn(m, x):
        return right

    def wrong_fn(m, x):
        return 1 - right

    good = road.road(CornerModel(), x, right_fn, target=0)
    bad = road.road(CornerModel(), x, wrong_fn, target=0)
    assert (good["morf"] < bad["morf"] - 0.2).all()
    assert (good["lerf"] > bad["lerf"] + 0.2).all()


def test_road_errors():
    x = torch.zeros(2, 3, 16, 16)
    with pytest.raises(ValueError, match="fractions"):
        road.road(CornerModel(), x, lambda m, x: torch.zeros(2, 4, 4), fractions=(0.0, 0.5))
    with pytest.raises(ValueError, match="map_fn"):
        road.road(CornerModel(), x, lambda m, x: torch.zeros(4, 4))
    with pytest.raises(ValueError, match="removed"):
        road.noisy_linear_imputation(x, torch.zeros(2, 16, 16, dtype=torch.bool))


def test_explain_sanity_bench_scores_road_as_direct_calls():
    """bench.explain_sanity with the ``road`` baseline: per-chunk ROAD scores (noise seeded by the chunk's first
    image), their means and standard errors, paired differences from the centre map, rankings, and the paired
    differences from RISE in the markdown."""
    import math

    import numpy as np

    from bench.explain_sanity import markdown, score

    torch.manual_seed(0)
    model = vit_core.create_model(vit_core.ViTConfig(img_size=16, patch_size=4, embed_dim=12, depth=1, num_heads=3))
    model.eval()
    x = torch.randn(5, 3, 16, 16)
    out = score(model, x, ["rise(n_masks=20,cells=2)", "attnlrp"], baselines=("road",), chunk=2)
    rows = {r["method"]: r for r in out["results"]}
    with torch.no_grad():
        target = model(x).argmax(-1)

    def direct(fn):
        parts = [road.road(model, x[i : i + 2], fn, target[i : i + 2], seed=i) for i in range(0, 5, 2)]
        return {k: torch.cat([p[k] for p in parts]) for k in ("morf", "lerf")}

    centre = direct(explain.centre_gaussian_map)
    want = direct(lambda m, c: vit_core.explain.lrp.attnlrp(m, c))
    r = rows["attnlrp"]
    for k in ("morf", "lerf"):
        assert r[k]["mean"] == pytest.approx(want[k].mean().item(), abs=1e-6)
        assert r[k]["se"] == pytest.approx(np.std(want[k].numpy(), ddof=1) / math.sqrt(5), rel=1e-4)
        assert r[f"{k}_minus_centre"]["mean"] == pytest.approx((want[k] - centre[k]).mean().item(), abs=1e-6)
    assert r["morf_below_centre"] == (want["morf"] < centre["morf"]).double().mean().item()
    report = {"model": "tiny", "data": "random", "n": 5, "seed": 0, "steps": 16, "accuracy": 0.0}
    text = markdown({**report, "num_classes": 10, "cpu_s": 0, "wall_s": 0, **out})
    assert "| MoRF (road) ↓ |" in text and "Paired differences from RISE" not in text  # spec is not plain "rise"
