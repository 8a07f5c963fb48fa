"""The table of explanation methods (``vit_core.methods``) is the only list of them: every method in it is
reachable from the Classify tab and its API, from Compare, from Batch (the batchable ones) and from the
benchmark, each drawing the table function's own map; and a method added as one entry of the table (here
one the app has never seen, shaped like a relevance-propagation method: per class, batchable, one forward
and backward pass) is reachable from all of them with no other change."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
from pathlib import Path

import gradio as gr
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import app
import vit_core
from bench import explain_sanity
from vit_core import explain, methods
from vit_core.data import build_transform
from vit_core.explain import lrp
from webapp.inference import analysis
from webapp.inference.settings import parse_settings
from webapp.registry.models import Models
from webapp.registry.options import Options
from webapp.tabs import batch, classify, compare
from webapp.ui.endpoints import Context, Prepared

from .test_docs import marked_block

CPU = torch.device("cpu")
NAMES = ("plane", "car", "bird", "cat", "deer")


# docs/extending.md's example method, run as the page says: its function and its entry of the table
_DOC: dict = {}
exec(marked_block("method"), _DOC)
brightness, NEW = _DOC["brightness"], _DOC["BRIGHTNESS"]

# The one list of the methods written out here, independent of the table: each key's library function and the
# paper its description must name. The tests derive every other list from ``methods.METHODS`` and check it
# against this one.
REFERENCE = {
    "rise": (explain.rise, "Petsiuk et al. 2018"),
    "attnlrp": (lrp.attnlrp, "Achtibat et al. 2024"),
    "rollout": (explain.attention_rollout, "Abnar & Zuidema 2020"),
    "gradient": (explain.gradient_rollout, "Chefer et al., ICCV 2021"),
    "chefer": (lrp.chefer, "Chefer et al., CVPR 2021"),
    "attention": (explain.attention_maps, "one layer's attention from the class token"),
    "brightness": (brightness, NEW.description),
}


@pytest.fixture
def ctx(tmp_path, monkeypatch) -> Context:
    """The app's context on a tiny model, with ``NEW`` added to the table as one more entry."""
    monkeypatch.setattr(methods, "METHODS", (*methods.METHODS, NEW))
    torch.manual_seed(0)
    cfg = vit_core.ViTConfig(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, label_names=NAMES
    )
    vit_core.save_pretrained(vit_core.create_model(cfg), tmp_path / "tiny")
    models = Models(CPU, Options(models=(str(tmp_path / "tiny"),)))
    models.set_default(str(tmp_path / "tiny"))
    return Context(models)


@pytest.fixture
def photo(tmp_path) -> str:
    torch.manual_seed(1)
    path = tmp_path / "photo.png"
    Image.fromarray((torch.rand(40, 60, 3) * 255).to(torch.uint8).numpy()).save(path)
    return str(path)


def test_every_method_of_the_table_is_offered_by_the_classify_and_batch_tabs_and_their_api(ctx):
    api = app.build_ui(ctx).get_api_info()["named_endpoints"]

    def choices(endpoint: str) -> list[str]:  # the Explanation radio of that tab, as the API takes it
        (method,) = [p for p in api[endpoint]["parameters"] if p["parameter_name"] == "method"]
        return method["type"]["enum"]

    assert choices("/classify") == [m.title for m in methods.METHODS] and NEW.title in choices("/classify")
    assert choices("/batch") == [m.title for m in methods.METHODS if m.batchable] and NEW.title in choices("/batch")


def test_every_method_and_setting_is_explained_where_it_is_chosen(ctx):
    """One line per method under each choice of method (the table's ``description``, the new entry's too), each
    published method naming its paper; the settings explained on their controls; Inspect's figures in words."""
    blocks = app.build_ui(ctx).blocks.values()
    shown = {b.elem_id: b.value for b in blocks if isinstance(b, gr.Markdown) and b.elem_id}
    assert {m.key for m in methods.METHODS} == set(REFERENCE)
    for legend, offered in (
        ("method-legend", methods.METHODS),
        ("compare-legend", methods.METHODS),
        ("batch-legend", [m for m in methods.METHODS if m.batchable]),
    ):
        lines = shown[legend].splitlines()
        assert lines == [f"- **{m.name}**: {m.description}" for m in offered], legend
        assert all(REFERENCE[m.key][1] in line for m, line in zip(offered, lines, strict=True))
    info = {b.label: b.info for b in blocks if getattr(b, "info", None)}
    assert info["Head fusion (rollout)"] == methods.OPTIONS["head_fusion"]
    assert "mean, max or min" in info["Head fusion (rollout)"]
    assert info["Discard ratio (rollout)"] == methods.OPTIONS["discard_ratio"]
    assert "weakest attention links dropped before rollout" in info["Discard ratio (rollout)"]
    assert info["Head (raw attention)"] == methods.OPTIONS["head"]
    figure_7 = next(b.value for b in blocks if isinstance(b, gr.Markdown) and "figure 7" in (b.value or ""))
    for words in (
        "what the first layer looks for in each patch",
        "which positions the model learned as near each other",
        "how far each head looks, by depth",
    ):
        assert words in figure_7


def test_classify_draws_each_methods_own_map(ctx, photo):
    """Each method's map as the tab computes it for the settings a request sends (none of them the defaults) equals
    the library function of ``REFERENCE`` called here with those settings written out: a method wired to another
    function, or a setting that does not reach the function, shows."""
    choice = ctx.models.default
    a = ctx.analysis(Prepared({"image": photo, "model_choice": choice}))
    request = {"layer": 0, "head": "1", "head_fusion": "max", "discard_ratio": 0.5}
    written_out = {"layer": 0, "head": 1, "head_fusion": "max", "discard_ratio": 0.5}
    for m in methods.METHODS:
        target = "cat" if m.per_class else "(predicted class)"
        labels, overlay, _, _, explains, _ = classify.classify(ctx, photo, choice, m.title, target, **request)
        assert set(labels) <= set(NAMES) and overlay.width == 300  # the 60x40 photo, shown 5 times larger
        assert explains.startswith("Map explains: cat (") if m.per_class else "the prediction" in explains
        s = parse_settings(a.model, m, target, *request.values())
        fn = REFERENCE[m.key][0]
        options = {k: v for k, v in written_out.items() if k in inspect.signature(fn).parameters}
        want = fn(a.model, a.x, **options, **({"target": 3} if m.per_class else {}))[0]
        torch.testing.assert_close(analysis.relevance(a, s, CPU), want, msg=m.key)


def test_the_compute_time_says_what_it_covered(ctx, photo):
    """A new image: decode, model and map; another model-running map of it, or one drawn from its cached
    attentions: the map only; a map asked for before: the cache, which it says rather than "computed in"."""
    choice = ctx.models.default

    def covered(method: methods.Method) -> str:
        return classify.classified(
            ctx, Prepared({"image": photo, "model_choice": choice, "method": method.title})
        ).covered

    assert covered(methods.ATTNLRP) == classify.NEW
    assert covered(methods.CHEFER) == classify.MAP_ONLY
    assert covered(methods.ROLLOUT) == classify.MAP_ONLY
    assert covered(methods.ATTNLRP) == classify.CACHED
    assert classify.compute_note(140.2, classify.NEW) == "Computed in 140 ms (decode, model and map)."
    assert classify.compute_note(0.41, classify.CACHED).startswith("Answered in 0.41 ms from the cache")


def test_compare_scores_every_method_then_the_baseline(ctx, photo):
    gallery, table, _ = compare.compare(ctx, photo, ctx.models.default, progress=lambda *a, **k: None)
    assert [row[0] for row in table] == [*(m.title for m in methods.METHODS), compare.CENTRE]
    assert len(gallery) == len(table)


def test_batch_maps_with_each_batchable_method_and_refuses_the_others(ctx, photo, tmp_path):
    other = tmp_path / "other.png"  # a second file (the same file listed twice is read once)
    other.write_bytes(Path(photo).read_bytes())
    for m in methods.METHODS:
        if m.batchable:
            gallery, _, note = batch.batch(ctx, [photo, str(other)], ctx.models.default, m.title)
            assert len(gallery) == 2 and note == f"2 image(s) classified; maps: {m.name}"
        else:
            with pytest.raises(gr.Error, match=re.escape(f"{m.title} is on the Classify tab")):
                batch.batch(ctx, [photo], ctx.models.default, m.title)


def test_the_benchmark_scores_every_method_by_its_key(ctx, photo):
    """``--methods KEY`` runs the map that KEY names: each key's map equals the library function's written out
    here (not read from the table), and the maps differ, so two methods swapped would be seen."""
    model, _ = ctx.models.get(ctx.models.default)
    x = build_transform(model.pretrained_cfg)(Image.open(photo))[None].repeat(3, 1, 1, 1)
    x = x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))  # three different images
    keys = [m.key for m in methods.METHODS]
    assert set(keys) == set(REFERENCE) and list(explain_sanity.names())[: len(keys)] == keys
    maps = {key: explain_sanity.parse_method(key, 0)(model, x) for key in keys}
    for key, (fn, _) in REFERENCE.items():
        torch.testing.assert_close(maps[key], fn(model, x), msg=key)
    grid = explain.token_grid(model, x)
    pooled = {k: F.adaptive_avg_pool2d(m, grid) / m.amax() for k, m in maps.items()}  # RISE's are per pixel
    for a, b in itertools.combinations(keys, 2):
        assert (pooled[a] - pooled[b]).abs().max() > 1e-3, (a, b)
    rows = explain_sanity.score(model, x, keys, baselines=("mean",), steps=2, batch_size=8)["results"]
    assert [r["method"] for r in rows] == [*keys, "centre"]
    assert all(0 <= r["deletion"]["mean"] <= 1 and 0 <= r["insertion"]["mean"] <= 1 for r in rows)


def test_a_methods_cost_decides_where_it_runs(ctx, monkeypatch):
    """One forward and backward pass per class (AttnLRP, gradient rollout, the new method) runs whatever the model;
    many forward passes (RISE) only within the budget, and the refusal names the methods that run. The FLOPs are
    counted by hand for the tiny model: 16 patches of 8x8x3 pixels, 17 tokens of width 32, 2 blocks of 2 heads,
    an MLP of width 128, 5 classes (a multiply-add counts 2)."""
    from webapp.inference import settings

    model, _ = ctx.models.get(ctx.models.default)
    tokens, width = 17, 32
    block = 2 * tokens * width * (3 * width + width + 2 * 4 * width) + 2 * (2 * tokens * tokens * width)
    forward = 2 * 16 * width * 8 * 8 * 3 + 2 * block + 2 * width * 5
    rise = explain.RISE_MASKS * forward  # 500 forward passes: 553 MFLOP
    many = [m for m in methods.METHODS if m.cost.forward > 0]  # the methods that run the model again and again
    assert many == [methods.RISE] and NEW not in many
    for budget, rise_runs in ((1.0, False), (0.999 * rise, False), (rise, True)):
        monkeypatch.setitem(settings.MAP_BUDGET, "cpu", budget)
        runs = [m for m in methods.METHODS if settings.affordable(m, model, CPU)]
        assert runs == [m for m in methods.METHODS if m not in many or rise_runs], budget
    monkeypatch.setitem(settings.MAP_BUDGET, "cpu", 1.0)
    assert settings.affordable(settings.DEFAULT_METHOD, model, CPU)  # the default runs whatever the budget
    message = settings.refusal(methods.RISE, model, CPU)
    assert message.startswith(f"RISE needs 500 forward passes of this model ({rise / 1e9:,.0f} GFLOP)")
    offered = [settings.DEFAULT_METHOD.title] + [
        m.title for m in methods.METHODS if m not in many and m is not settings.DEFAULT_METHOD
    ]  # the default first, then the table's order
    assert message.endswith(f"choose {', '.join(offered[:-1])} or {offered[-1]}")
    # a method's cost, not its name: the new method with two extra forward passes is held to the budget
    two = dataclasses.replace(NEW, cost=methods.Cost(forward=2))
    assert not settings.affordable(two, model, CPU)
    monkeypatch.setitem(settings.MAP_BUDGET, "cpu", 2 * forward)
    assert settings.affordable(two, model, CPU)
