"""Real photos folded into training (``vit_core.data.photos``, the recipe's ``photos``) and fine-tuning with the
checkpoint's own head (``keep_head``): issue #45's fine-tune of the bundled model."""

from __future__ import annotations

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from vit_core import VisionTransformer
from vit_core.calibration import CalibrationOptions
from vit_core.data import InMemoryImageDataset, build_transform
from vit_core.data.images import ImageDataError
from vit_core.data.photos import photo_images, with_photos
from vit_core.models.config import ViTConfig
from vit_core.training.builders import build_loss, build_network
from vit_core.training.engine import train
from vit_core.training.recipe import Recipe, RecipeError

from .test_engine import TINY, make_image_folder, one_thread, tiny_recipe  # noqa: F401  (autouse fixture)

CFG = {"input_size": (3, 32, 32), "mean": (0.5,) * 3, "std": (0.25,) * 3, "interpolation": "bicubic"}
SQUASH = CFG | {"crop_pct": 1.0, "crop_mode": "squash"}
SPEC = {"folder": "", "classes": {"cats": "cat", "dogs": "dog"}, "copies": 3}


@pytest.fixture
def folder(tmp_path):
    """cats/ and dogs/ with two photos each (a gradient, so crops and colour changes show), train/ and val/."""
    for split in ("train", "val"):
        for k, name in enumerate(("cats", "dogs")):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(2):
                x = torch.linspace(0, 255, 120)[None, :, None] * torch.ones(90, 1, 3)
                x[..., k] = 40 * (i + 1)
                Image.fromarray(x.byte().numpy()).save(tmp_path / split / name / f"{i}.jpg")
    return tmp_path


def test_the_first_copy_is_what_the_app_sees_and_the_others_differ(folder):
    names = ["airplane", "cat", "dog"]
    ds = photo_images(SPEC | {"folder": str(folder)}, names, SQUASH, seed=0)
    assert ds.images.shape == (12, 3, 32, 32) and ds.images.dtype == torch.uint8
    assert ds.targets.tolist() == [1] * 6 + [2] * 6  # cats -> "cat", dogs -> "dog", 3 copies each, train/ only
    for i, path in enumerate(sorted((folder / "train").glob("*/*.jpg"))):
        photo = Image.open(path).convert("RGB")
        # the reference: PIL's own bicubic resize of the whole photo (the app's squash), then the eval normalisation
        reference = torch.tensor(list(photo.resize((32, 32), Image.Resampling.BICUBIC).getdata())).T.reshape(3, 32, 32)
        assert torch.equal(ds.images[3 * i], reference.byte())
        app = build_transform(SQUASH)(photo)  # what the app feeds the model for this upload
        assert torch.allclose((ds.images[3 * i].float() / 255 - 0.5) / 0.25, app, atol=1e-5)
        for copy in (1, 2):  # another crop, colour, blur, compression: not the same picture
            assert (ds.images[3 * i + copy].float() - ds.images[3 * i].float()).abs().mean() > 2
    again = photo_images(SPEC | {"folder": str(folder)}, names, SQUASH, seed=0)
    assert torch.equal(again.images, ds.images)  # one seed, one set of images
    assert not torch.equal(photo_images(SPEC | {"folder": str(folder)}, names, SQUASH, seed=1).images, ds.images)


def test_photos_join_an_in_memory_training_set(folder):
    base = InMemoryImageDataset(
        torch.zeros(5, 3, 32, 32, dtype=torch.uint8), torch.arange(5) % 3, ["airplane", "cat", "dog"], "tf"
    )
    joined = with_photos(base, SPEC | {"folder": str(folder), "copies": 1}, None, SQUASH, seed=0)
    assert len(joined) == 9 and joined.transform == "tf" and joined.classes == base.classes
    assert torch.equal(joined.images[:5], base.images) and joined.targets[5:].tolist() == [1, 1, 2, 2]
    with pytest.raises(ImageDataError, match="not among"):
        with_photos(base, SPEC | {"folder": str(folder), "classes": {"cats": "horse"}}, None, SQUASH, seed=0)


def test_a_share_of_the_photos_is_the_hash_split_of_their_file_names(tmp_path):
    """``share``: "held" takes the photos whose file name's SHA-256 (first 8 hex digits) is under a fifth of the
    range, "fit" the others; the two partition the folder, photos and outliers alike (the held-out share a recipe
    is chosen on is never trained on)."""
    import hashlib

    (tmp_path / "val").mkdir()
    for name in ("cats", "dogs"):
        (tmp_path / "train" / name).mkdir(parents=True)
        for i in range(15):
            Image.new("RGB", (8, 8), (i * 10, 0, 0)).save(tmp_path / "train" / name / f"{name}.{i}.jpg")
    everyone = sorted(p.name for p in tmp_path.glob("train/*/*.jpg"))
    held = {n for n in everyone if int(hashlib.sha256(n.encode()).hexdigest()[:8], 16) / 16**8 < 0.2}
    assert 0 < len(held) < len(everyone)
    spec = SPEC | {"folder": str(tmp_path), "copies": 1}
    sizes = {share: len(photo_images(spec | {"share": share}, ["cat", "dog"], SQUASH, 0)) for share in ("fit", "held")}
    assert sizes == {"fit": len(everyone) - len(held), "held": len(held)}
    outliers = {"folder": str(tmp_path), "copies": 1, "weight": 0.1, "share": "held"}
    base = InMemoryImageDataset(torch.zeros(0, 3, 32, 32, dtype=torch.uint8), torch.zeros(0).long(), ["cat", "dog"])
    assert len(with_photos(base, None, outliers, SQUASH, seed=0)) == len(held)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"photos": {"folder": "x", "classes": {"a": "b"}}}, "needs the keys"),
        ({"photos": {"folder": "x", "classes": {"a": "b"}, "copies": 1, "share": "all"}}, "share must be one of"),
        ({"photos": {"folder": "x", "classes": {"a": "b"}, "copies": 0}}, "copies must be"),
        ({"photos": {"folder": "x", "classes": [], "copies": 1}}, "classes must map"),
        ({"keep_head": True}, "keep_head keeps a fine-tuned checkpoint's head"),
    ],
)
def test_recipes_with_bad_photos_or_keep_head_are_refused(bad, match):
    with pytest.raises(RecipeError, match=match):
        Recipe.from_dict(bad)


def test_keep_head_fine_tunes_the_checkpoints_own_classifier():
    cfg = ViTConfig(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=3)
    classes = ["airplane", "cat", "dog"]
    init = VisionTransformer(cfg.replace(label_names=classes))
    torch.nn.init.normal_(init.head.weight)
    head = init.head.weight.detach().clone()
    recipe = Recipe.from_dict({"init": "x", "keep_head": True})
    assert torch.equal(build_network(recipe, init, classes).head.weight, head)
    with pytest.raises(RecipeError, match="keep_head"):
        build_network(recipe, init, ["cat", "dog", "ship"])
    fresh = build_network(Recipe.from_dict({"init": "x"}), init, classes)  # the paper's fine-tuning: a zero head
    assert not fresh.head.weight.any()


def test_a_frozen_cnn_stays_as_it_was_while_the_transformer_trains(tmp_path):
    """A hybrid fine-tuned with its CNN in ``freeze``: its CNN's weights and BatchNorm statistics are the checkpoint's
    exactly, its transformer and head moved; a stem_optimizer beside it is refused."""
    data = make_image_folder(tmp_path / "data")
    stem = dict(TINY, patch_size=1, stem_channels=(4, 8), stem_strides=(1, 1), stem_pools=(2, 2))
    train(tiny_recipe(data, model_args=stem, epochs=1), tmp_path / "base", progress=False)
    tune = tiny_recipe(
        data, model_args={}, init=str(tmp_path / "base"), keep_head=True, freeze=["patch_embed.backbone"]
    )
    train(tune, tmp_path / "tuned", progress=False)
    before, after = (
        load_file(tmp_path / "base" / "model.safetensors"),
        load_file(tmp_path / "tuned" / "model.safetensors"),
    )
    cnn = [k for k in before if k.startswith("patch_embed.backbone.")]
    assert any("running_mean" in k for k in cnn) and all(torch.equal(before[k], after[k]) for k in cnn)
    assert not torch.equal(before["head.weight"], after["head.weight"])
    assert not torch.equal(before["blocks.0.attn.qkv.weight"], after["blocks.0.attn.qkv.weight"])
    with pytest.raises(RecipeError, match="takes no stem_optimizer"):
        Recipe.from_dict({"freeze": ["patch_embed"], "stem_optimizer": {"lr": 0.1}})


def test_logit_adjust_is_the_loss_of_menon_et_al():
    """logit_adjust: cross-entropy of z + log pi (Menon et al. 2021, eq. 10, tau = 1) with pi the training images'
    class shares; equal shares shift every logit alike, which changes no loss; a class without images is refused."""
    z, y = torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 0, 1, 2])
    recipe = Recipe.from_dict({"logit_adjust": True})
    _, loss = build_loss(recipe, ["a", "b", "c"], torch.tensor([30, 10, 10]))
    want = torch.nn.functional.cross_entropy(z + torch.tensor([0.6, 0.2, 0.2]).log(), y)
    torch.testing.assert_close(loss(z, y), want)
    _, even = build_loss(recipe, ["a", "b", "c"], torch.tensor([5, 5, 5]))
    torch.testing.assert_close(even(z, y), torch.nn.functional.cross_entropy(z, y))
    with pytest.raises(RecipeError, match="every class"):
        build_loss(recipe, ["a", "b", "c"], torch.tensor([5, 0, 5]))


def test_wise_ft_exports_the_weight_space_mix_of_checkpoint_and_fine_tune(tmp_path):
    """wise_ft w (Wortsman et al. 2022): training is unchanged, and the run folder holds (1 - w) init + w trained,
    tensor by tensor, against the same fine-tune run without it."""
    data = make_image_folder(tmp_path / "data")
    train(tiny_recipe(data, epochs=1), tmp_path / "base", progress=False)
    tune = tiny_recipe(data, model_args={}, init=str(tmp_path / "base"), keep_head=True)
    train(tune, tmp_path / "plain", progress=False)
    train(tune | {"wise_ft": 0.25}, tmp_path / "wise", progress=False)
    i, a, b = (load_file(tmp_path / r / "model.safetensors") for r in ("base", "plain", "wise"))
    assert not torch.equal(i["head.weight"], a["head.weight"])
    for k in a:
        torch.testing.assert_close(b[k], 0.75 * i[k] + 0.25 * a[k], msg=k)
    with pytest.raises(RecipeError, match="wise_ft"):
        Recipe.from_dict({"init": "x", "wise_ft": 0.5})  # without keep_head


def test_the_recipes_photos_join_the_ood_statistics(tmp_path, folder, monkeypatch):
    """``calibrate_checkpoint(photos=...)`` (``train calibrate`` on a run whose recipe has ``photos``): the
    Mahalanobis class means and shared covariance are those of the fit images' features together with each
    training photo's as the app shrinks it (brute force here), so real photos of a class the model trained on
    are not "unlike" it; without photos, the fit images' alone."""
    from vit_core import from_pretrained, save_pretrained
    from vit_core.calibration.ood import fit_statistics
    from vit_core.data import fixed_subset
    from vit_core.training import evaluation

    names = ["airplane", "cat", "dog"]
    cfg = ViTConfig(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3, label_names=names)
    torch.manual_seed(0)
    save_pretrained(VisionTransformer(cfg), tmp_path / "m")
    model = from_pretrained(tmp_path / "m")  # as calibration loads it, its preprocessing included
    g = torch.Generator().manual_seed(0)
    images, targets = torch.randint(0, 256, (60, 3, 32, 32), generator=g, dtype=torch.uint8), torch.arange(60) % 3

    def in_memory(spec, split, transform, subset):  # a CIFAR-like in-memory training split
        return fixed_subset(InMemoryImageDataset(images, targets, names, transform), subset)

    monkeypatch.setattr(evaluation, "load_data", in_memory)
    spec = SPEC | {"folder": str(folder)}
    options = CalibrationOptions(tta=None, ood="mahalanobis")
    common = dict(held_out=(40, 60), fit=(0, 40), options=options, device="cpu", progress=False)
    with_p, _ = evaluation.calibrate_checkpoint(tmp_path / "m", "x", photos=spec, **common)
    without, _ = evaluation.calibrate_checkpoint(tmp_path / "m", "x", **common)

    transform = build_transform(model.pretrained_cfg)
    fit = fixed_subset(InMemoryImageDataset(images, targets, names, transform), [0, 40])
    photos = photo_images(spec | {"copies": 1}, names, model.pretrained_cfg, seed=0)
    x = torch.stack([fit[i][0] for i in range(40)] + [transform(p) for p in photos.images])
    y = torch.cat([fit.targets, photos.targets])
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
    want = fit_statistics("mahalanobis", features, y, 3)
    for key, value in want.items():
        torch.testing.assert_close(with_p.ood.statistics[key], value, rtol=1e-4, atol=1e-4, msg=key)
    assert not torch.allclose(without.ood.statistics["means"], want["means"], atol=1e-4)
    assert "training photos of" in with_p.ood.fitted_on and "photos" not in without.ood.fitted_on
