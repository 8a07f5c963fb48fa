"""The app's bundled default model: loads offline, is the checkpoint its card describes, classifies real data."""

import json
from pathlib import Path

import pytest
import timm
import torch

import vit_core
from vit_core.data import build_dataset, build_transform, default_data_root

BUNDLE = Path(__file__).resolve().parents[1] / "models" / "cifar10_vit"


def test_bundle_is_small_fp16_and_loads_in_timm_too():
    assert sum(p.stat().st_size for p in BUNDLE.iterdir()) < 25e6
    model = vit_core.from_pretrained(BUNDLE)
    assert model.label_names == json.loads((BUNDLE / "config.json").read_text())["label_names"]
    assert len(model.label_names) == 10
    ref = timm.create_model(f"local-dir:{BUNDLE}", pretrained=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (ref(x) - model(x)).abs().max() <= 1e-4


@pytest.mark.skipif(not (default_data_root() / "cifar10").is_dir(), reason="CIFAR-10 not found under VIT_DATA")
def test_bundle_reaches_its_reported_accuracy_on_cifar10_test():
    model = vit_core.from_pretrained(BUNDLE)
    test = build_dataset("cifar10", "test", transform=build_transform(model.pretrained_cfg))
    idx = torch.arange(0, 10000, 5)  # 2,000 test images, every fifth
    with torch.no_grad():
        pred = torch.cat([model(test.transform(test.images[i])).argmax(-1) for i in idx.split(500)])
    accuracy = (pred == test.targets[idx]).float().mean().item()
    reported = json.loads((BUNDLE / "metrics.jsonl").read_text().strip().splitlines()[-1])["test_top1"] / 100
    assert accuracy == pytest.approx(reported, abs=0.02)
