"""Outlier exposure (Hendrycks et al. 2019): photos of other things in training (the recipe's ``outliers``,
``vit_core.data.photos.outlier_images``) and their loss (``vit_core.training.builders.OutlierExposure``)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from vit_core import from_pretrained
from vit_core.data import InMemoryImageDataset, build_dataset, build_transform
from vit_core.data.photos import OUTLIER, outlier_images, with_photos
from vit_core.training.builders import build_loss
from vit_core.training.engine import train
from vit_core.training.recipe import Recipe, RecipeError

from .test_engine import make_image_folder, one_thread, tiny_recipe  # noqa: F401  (autouse fixture)
from .test_photos_in_training import SPEC, SQUASH, folder  # noqa: F401  (fixture)

Z = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))


def test_the_loss_is_the_classes_loss_plus_the_weighted_cross_entropy_to_uniform():
    """Eq. 1 of the paper by hand: the mean cross-entropy over the labelled rows plus weight x the mean over the
    outlier rows of -1/K sum_k log softmax(z)_k; a batch without outliers is the plain loss."""
    y = torch.tensor([0, OUTLIER, 2, OUTLIER, 1, 2])
    _, loss = build_loss(Recipe.from_dict({"outliers": {"folder": "x", "copies": 1, "weight": 0.5}}), ["a", "b", "c"])
    inside = F.cross_entropy(Z[[0, 2, 4, 5]], y[[0, 2, 4, 5]])
    uniform = torch.full((2, 3), 1 / 3)
    outside = -(uniform * Z[[1, 3]].log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(loss(Z, y), inside + 0.5 * outside)
    labelled = torch.tensor([0, 1, 2, 0, 1, 2])
    torch.testing.assert_close(loss(Z, labelled), F.cross_entropy(Z, labelled))
    only = torch.full((6,), OUTLIER)
    torch.testing.assert_close(loss(Z, only), -0.5 * Z.log_softmax(-1).mean())
    # its minimum is the uniform answer: equal logits cost log K, any other answer more
    assert loss(torch.zeros(6, 3), only).item() == pytest.approx(0.5 * torch.log(torch.tensor(3.0)).item())
    assert loss(Z, only) > loss(torch.zeros(6, 3), only)


def test_logit_adjustment_counts_only_the_labelled_images_and_applies_to_them():
    """With both: the labelled rows see z + log pi, the outliers the raw z (the answer the app shows)."""
    recipe = Recipe.from_dict({"logit_adjust": True, "outliers": {"folder": "x", "copies": 1, "weight": 1.0}})
    _, loss = build_loss(recipe, ["a", "b", "c"], torch.tensor([30, 10, 10]))
    y = torch.tensor([0, OUTLIER, 2, OUTLIER, 1, 2])
    log_prior = torch.tensor([0.6, 0.2, 0.2]).log()
    want = F.cross_entropy(Z[[0, 2, 4, 5]] + log_prior, y[[0, 2, 4, 5]]) - Z[[1, 3]].log_softmax(-1).mean()
    torch.testing.assert_close(loss(Z, y), want)


def test_outlier_photos_are_every_photo_of_the_folder_labelled_none_of_the_classes(folder):  # noqa: F811
    ds = outlier_images({"folder": str(folder), "copies": 2, "weight": 0.5}, ["airplane", "cat"], SQUASH, seed=0)
    assert ds.images.shape == (8, 3, 32, 32) and ds.targets.tolist() == [OUTLIER] * 8  # 4 train photos, 2 copies
    assert not torch.equal(ds.images[0], ds.images[1])  # the second copy is another crop, colour, blur
    base = InMemoryImageDataset(torch.zeros(5, 3, 32, 32, dtype=torch.uint8), torch.arange(5) % 3, ["a", "cat", "dog"])
    joined = with_photos(
        base, SPEC | {"folder": str(folder), "copies": 1}, {"folder": str(folder), "copies": 1, "weight": 1}, SQUASH, 0
    )
    assert joined.targets[5:].tolist() == [1, 1, 2, 2] + [OUTLIER] * 4


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"outliers": {"folder": "x", "copies": 1}}, "needs the keys"),
        ({"outliers": {"folder": "x", "copies": 0, "weight": 0.5}}, "copies must be"),
        ({"outliers": {"folder": "x", "copies": 1, "weight": 0}}, "weight must be"),
        ({"outliers": {"folder": "x", "copies": 1, "weight": True}}, "weight must be"),
        ({"outliers": {"folder": "x", "copies": 1, "weight": 0.5}, "mixup": 0.2}, "no mixup"),
        ({"outliers": {"folder": "x", "copies": 1, "weight": 0.5}, "val_fraction": 0.2}, "no mixup"),
    ],
)
def test_bad_outliers_are_refused(bad, match):
    with pytest.raises(RecipeError, match=match):
        Recipe.from_dict(bad)


def test_a_run_with_outliers_counts_its_training_accuracy_over_the_labelled_images_only(tmp_path, folder):  # noqa: F811
    """With a learning rate of 0 the model never changes, so the epoch's ``train_top1`` must be the exported
    model's accuracy on the 48 labelled training images, counted here one by one: the 8 outlier images (no class,
    never right) are neither in the numerator nor the denominator."""
    data = make_image_folder(tmp_path / "data")
    frozen = tiny_recipe(data, epochs=1, in_memory=True, lr=0.0, min_lr=0.0, warmup_lr=0.0)
    train(frozen | {"outliers": {"folder": str(folder), "copies": 2, "weight": 1.0}}, tmp_path / "run", progress=False)
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    model = from_pretrained(str(tmp_path / "run")).eval()
    labelled = build_dataset(str(data), "train", transform=build_transform(model.pretrained_cfg))
    images = torch.stack([image for image, _ in labelled])
    with torch.no_grad():
        right = (model(images).argmax(-1) == torch.as_tensor(labelled.targets)).sum().item()
    assert len(labelled) == 48 and 0 < right < 48  # a count that a denominator of 56 would change
    assert row["train_top1"] == pytest.approx(100 * right / 48)


def test_outlier_exposure_brings_the_answers_on_outliers_closer_to_uniform(tmp_path, folder):  # noqa: F811
    """An in-memory training set plus outliers trains end to end; after training, the outliers' answers are
    closer to uniform than the same run's without them (same seed and data otherwise)."""
    data = make_image_folder(tmp_path / "data")
    base = tiny_recipe(data, epochs=2, in_memory=True, lr=3e-3)
    spec = {"folder": str(folder), "copies": 2, "weight": 1.0}
    train(base, tmp_path / "plain", progress=False)
    train(base | {"outliers": spec}, tmp_path / "oe", progress=False)
    cfg = json.loads((tmp_path / "oe" / "config.json").read_text())["pretrained_cfg"]
    images = outlier_images(spec, ["x"], cfg, seed=0).images.float() / 255
    mean, std = torch.tensor(cfg["mean"])[:, None, None], torch.tensor(cfg["std"])[:, None, None]
    x = (images - mean) / std
    entropy = {}
    for run in ("plain", "oe"):
        model = from_pretrained(str(tmp_path / run)).eval()
        with torch.no_grad():
            p = model(x).softmax(-1)
        entropy[run] = -(p * p.log()).sum(-1).mean().item()
    assert entropy["oe"] > entropy["plain"]
