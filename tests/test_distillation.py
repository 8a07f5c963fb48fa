"""Learning without forgetting: a fine-tune held to its starting model's answers (the recipe's ``distill``,
``vit_core.training.distillation``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

from vit_core import from_pretrained
from vit_core.data import build_transform
from vit_core.data.photos import OUTLIER
from vit_core.training.builders import build_loss
from vit_core.training.engine import train
from vit_core.training.recipe import Recipe, RecipeError

from .test_engine import make_image_folder, one_thread, tiny_recipe  # noqa: F401  (autouse fixture)

G = torch.Generator().manual_seed(0)
Z, T_LOGITS = torch.randn(6, 3, generator=G), torch.randn(6, 3, generator=G)


def kl_by_hand(z: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    """sum_k p_k (log p_k - log q_k), p = softmax(t / T), q = softmax(z / T), one value per row."""
    p, q = F.softmax(t / temperature, -1), F.softmax(z / temperature, -1)
    return (p * (p.log() - q.log())).sum(-1)


def test_the_loss_adds_the_distillation_term_on_the_images_the_teacher_got_right():
    """Hinton et al.'s term, weight x T^2 x the mean KL over the rows whose label is the teacher's argmax; rows it
    got wrong and outliers get the classes' (and outliers') loss only."""
    y = T_LOGITS.argmax(-1).clone()
    y[1] = (y[1] + 1) % 3  # the teacher is wrong here
    y[4] = OUTLIER
    recipe = {"init": "x", "keep_head": True, "distill": 0.5, "distill_temperature": 3.0}
    _, loss = build_loss(
        Recipe.from_dict(recipe | {"outliers": {"folder": "x", "copies": 1, "weight": 0.1}}), list("abc")
    )
    inside, kept = [0, 1, 2, 3, 5], [0, 2, 3, 5]
    classes = F.cross_entropy(Z[inside], y[inside]) - 0.1 * Z[4].log_softmax(-1).mean()
    want = classes + 0.5 * 9 * kl_by_hand(Z[kept], T_LOGITS[kept], 3.0).mean()
    torch.testing.assert_close(loss(Z, y, T_LOGITS), want)
    # a student that answers exactly as its teacher pays no distillation
    y_right = T_LOGITS.argmax(-1)
    _, plain = build_loss(Recipe.from_dict(recipe), list("abc"))
    torch.testing.assert_close(plain(T_LOGITS, y_right, T_LOGITS), F.cross_entropy(T_LOGITS, y_right))
    assert plain(Z, y_right, T_LOGITS) > F.cross_entropy(Z, y_right)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"init": "x", "distill": 1.0}, "distill needs keep_head"),
        ({"init": "x", "keep_head": True, "distill": 0.0}, "distill needs"),
        ({"init": "x", "keep_head": True, "distill": 1.0, "mixup": 0.2}, "no mixup"),
        ({"init": "x", "keep_head": True, "distill": 1.0, "distill_temperature": 0}, "distill_temperature"),
    ],
)
def test_bad_distillation_is_refused(bad, match):
    with pytest.raises(RecipeError, match=match):
        Recipe.from_dict(bad)


def test_a_distilled_fine_tune_stays_nearer_its_starting_answers(tmp_path):
    """The same fine-tune (seed, data, learning rate) with and without ``distill``: the distilled one's answers on
    the training images are nearer the starting model's (KL), and its weights still moved."""
    data = make_image_folder(tmp_path / "data")
    train(tiny_recipe(data, epochs=2), tmp_path / "base", progress=False)
    tune = tiny_recipe(data, model_args={}, init=str(tmp_path / "base"), keep_head=True, lr=1e-2, epochs=3)
    train(tune, tmp_path / "plain", progress=False)
    train(tune | {"distill": 5.0}, tmp_path / "held", progress=False)
    base = from_pretrained(str(tmp_path / "base")).eval()
    view = build_transform(base.pretrained_cfg)
    x = torch.stack([view(Image.open(p).convert("RGB")) for p in sorted((data / "train").glob("*/*.png"))])
    with torch.no_grad():
        start = base(x)
        drift = {
            r: kl_by_hand(from_pretrained(str(tmp_path / r)).eval()(x), start, 1.0).mean() for r in ("plain", "held")
        }
    assert drift["held"] < drift["plain"]
    moved = load_file(tmp_path / "held" / "model.safetensors")
    assert not torch.equal(moved["head.weight"], load_file(tmp_path / "base" / "model.safetensors")["head.weight"])
