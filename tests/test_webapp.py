"""The app's server side without a server: the cached forward pass, the patch explorer's geometry and rows,
the settings checks, batch uploads (zip safety included), what the app says about a model, and how the page
keeps its results fresh (tickets), numbers layers, labels colour bars and shows tiny images."""

from __future__ import annotations

import argparse
import functools
import io
import json
import struct
import zipfile
from contextlib import nullcontext
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import vit_core
from vit_core import explain, methods
from vit_core.calibration import Calibration, calibrated_views, predict
from vit_core.data import ImageDataError, TooManyPixelsError, build_transform, load_image, read_header
from webapp.inference import analysis, archives, model_info, render, settings
from webapp.inference.analysis import Analysis, AnalysisCache, analyse
from webapp.inference.settings import Settings, parse_settings
from webapp.registry import catalog, options
from webapp.registry.catalog import BUNDLED, ROOT
from webapp.server.admission import MB, Gate, rss
from webapp.tabs import batch, compare, explore
from webapp.ui import events, picker
from webapp.ui.endpoints import Prepared, problem

from .rss import peak_of

CPU = torch.device("cpu")


def _model(**kw) -> vit_core.VisionTransformer:
    torch.manual_seed(0)
    base = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5, crop_pct=0.9)
    return vit_core.create_model(vit_core.ViTConfig(**{**base, **kw})).eval()


MODELS = {
    "token": dict(),
    "avg": dict(global_pool="avg", class_token=False),
    "non-square": dict(img_size=(32, 48)),
    "hybrid": dict(patch_size=1, stem_channels=(8, 16), stem_strides=(2, 2), global_pool="avg", class_token=False),
    "grey": dict(in_chans=1, mean=(0.5,), std=(0.5,), embed_dim=16, num_heads=2),
}


def _photo(tmp_path: Path, size=(90, 60), name="photo.png") -> str:
    torch.manual_seed(1)
    pixels = (torch.rand(size[1], size[0], 3) * 255).to(torch.uint8).numpy()
    path = tmp_path / name
    Image.fromarray(pixels).save(path)
    return str(path)


@functools.cache
def _model_of(kind: str) -> vit_core.VisionTransformer:
    """One model per kind, held for the session (an ``Analysis`` refers to its model weakly: its owner keeps it)."""
    return _model(**MODELS[kind])


def _analysis(tmp_path: Path, kind: str, size=(90, 60)) -> Analysis:
    model = _model_of(kind)
    return analyse(model, build_transform(model.pretrained_cfg), kind, _photo(tmp_path, size), CPU)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_cached_maps_are_the_librarys_maps(tmp_path, kind):
    a = _analysis(tmp_path, kind)
    x = a.x
    s = Settings(method=methods.ROLLOUT, head_fusion="max", discard_ratio=0.5)
    expected = explain.attention_rollout(a.model, x, head_fusion="max", discard_ratio=0.5)[0]
    torch.testing.assert_close(analysis.relevance(a, s, CPU), expected)
    raw = Settings(method=methods.RAW, layer=0, head=1)
    torch.testing.assert_close(analysis.relevance(a, raw, CPU), explain.attention_maps(a.model, x, 0, 1)[0])
    grad = Settings(method=methods.GRADIENT, target=2)
    torch.testing.assert_close(analysis.relevance(a, grad, CPU), explain.gradient_rollout(a.model, x, 2)[0])
    assert list(a.maps) == [("gradient", 2)]  # cached per class
    rise = Settings(method=methods.RISE, target=1)
    torch.testing.assert_close(analysis.relevance(a, rise, CPU), explain.rise(a.model, x, 1)[0])
    assert list(a.maps) == [("gradient", 2), ("rise", 1)]


def test_rise_runs_within_the_budget_and_is_refused_over_it(tmp_path, monkeypatch):
    """RISE costs explain.RISE_MASKS forward passes: drawn where that fits the server's budget; over it, a RISE
    request is refused with the cost and the alternatives, the default (AttnLRP, one backward pass) first."""
    a = _analysis(tmp_path, "token")
    cost = explain.RISE_MASKS * vit_core.models.cost.forward_flops(a.model.config)
    assert methods.RISE.cost.flops(a.model.config) == cost
    assert settings.affordable(methods.RISE, a.model, CPU) and Settings().method is settings.DEFAULT_METHOD
    seen = []
    analysis.relevance(a, Settings(method=methods.RISE), CPU, lambda f, desc: seen.append((f, desc)))
    assert seen[-1] == (1.0, "RISE: masked images")
    monkeypatch.setitem(settings.MAP_BUDGET, "cpu", cost - 1)
    assert not settings.affordable(methods.RISE, a.model, CPU)
    with pytest.raises(ValueError, match=f"RISE needs {explain.RISE_MASKS} forward passes .* choose AttnLRP"):
        analysis.relevance(a, Settings(method=methods.RISE, target=3), CPU)
    scored = compare.score_methods(a, Settings(), CPU, lambda f, desc: None)
    assert [n for n, *_ in scored] == [*(m.title for m in methods.METHODS[1:]), compare.CENTRE]  # RISE left out


@pytest.mark.parametrize("kind", ["token", "hybrid"])
def test_probabilities_average_the_image_and_its_mirror(tmp_path, kind):
    """The app's probabilities are those of `train eval --tta flip`: the mean of the softmax of the upload
    and of its mirror (mirrored here before preprocessing, with PIL)."""
    a = _analysis(tmp_path, kind)
    img = Image.open(_photo(tmp_path))
    tf = build_transform(a.model.pretrained_cfg)
    with torch.no_grad():
        expected = sum(a.model(tf(im)[None]).softmax(-1)[0] for im in (img, ImageOps.mirror(img))) / 2
    torch.testing.assert_close(a.probs, expected, atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        plain = a.model(tf(img)[None]).softmax(-1)[0]
    assert not torch.allclose(a.probs, plain, atol=1e-4)  # the mirror counts


def test_probabilities_average_the_views_the_model_was_calibrated_for(tmp_path):
    """A model calibrated for `flip-translate` views (`train calibrate --tta flip-translate`) is predicted with
    them: airbench's six views, the image and its mirror at 1/4 each and the mirror pairs of the image shifted
    1 px down-right and up-left (reflect-padded) at 1/8 each, each view's softmax at the stored temperature.
    Brute force here with numpy's reflect padding on the preprocessed image."""
    model = _model(**MODELS["hybrid"])
    model.calibration = Calibration(0.7, "flip-translate", "flip-translate views of test images")
    a = analyse(model, build_transform(model.pretrained_cfg), "calibrated", _photo(tmp_path), CPU)
    x = a.x[0].numpy()
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1)), mode="reflect")
    shifted = [padded[:, :-2, :-2], padded[:, 2:, 2:]]  # content moved down-right, then up-left
    views = [(x, 0.25), (x[..., ::-1], 0.25)] + [(v[..., ::-1] if m else v, 0.125) for v in shifted for m in (0, 1)]
    with torch.no_grad():
        expected = sum(w * (model(torch.tensor(v.copy())[None]) / 0.7).softmax(-1)[0] for v, w in views)
    torch.testing.assert_close(a.probs, expected, atol=1e-5, rtol=1e-4)
    assert calibrated_views(model) == "flip-translate" and calibrated_views(_model()) == "flip"
    flips = predict(model, a.x, tta="flip").probs[0]
    assert not torch.allclose(a.probs, flips, atol=1e-4)  # the shifted views count


def test_analyses_are_cached_by_content_and_bounded(tmp_path):
    model = _model()
    tf = build_transform(model.pretrained_cfg)
    first = analyse(model, tf, "m", _photo(tmp_path, name="a.png"), CPU)
    assert analyse(model, tf, "m", _photo(tmp_path, name="b.png"), CPU) is first  # same bytes, other name
    assert analyse(model, tf, "other model", _photo(tmp_path, name="a.png"), CPU) is not first
    cache = AnalysisCache(max_entries=2)
    for i in range(3):
        cache.get_or_compute(("m", str(i)), model, lambda: first)
    assert list(cache._items) == [("m", "1"), ("m", "2")]
    tiny = AnalysisCache(max_bytes=1)  # always keeps the newest, whatever its size
    tiny.get_or_compute(("m", "0"), model, lambda: first)
    tiny.get_or_compute(("m", "1"), model, lambda: first)
    assert list(tiny._items) == [("m", "1")]
    two = AnalysisCache(max_bytes=2 * first.nbytes())  # the oldest dropped until the rest fit
    for i in range(4):
        two.get_or_compute(("m", str(i)), model, lambda: first)
    assert list(two._items) == [("m", "2"), ("m", "3")]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_points_map_to_the_patch_under_them_in_the_crop(tmp_path, kind):
    a = _analysis(tmp_path, kind, size=(120, 70))
    left, top, right, bottom = a.crop
    gh, gw = a.grid
    h, w = a.x.shape[-2:]
    stride = a.model.config.feature_stride
    assert (gh, gw) == (-(-h // stride), -(-w // stride))
    corner = explore.patch_at(a, left + 0.01, top + 0.01)
    assert (corner.row, corner.col, corner.token) == (0, 0, a.model.num_prefix_tokens)
    far = explore.patch_at(a, right - 0.01, bottom - 0.01)
    assert (far.row, far.col) == (gh - 1, gw - 1)
    assert far.token == a.model.num_prefix_tokens + gh * gw - 1
    # the centre of cell (r, c) of the input maps back to (r, c)
    for r, c in [(0, gw - 1), (gh - 1, 0), (gh // 2, gw // 2)]:
        fx, fy = min((c + 0.5) * stride, w - 0.5) / w, min((r + 0.5) * stride, h - 0.5) / h
        p = explore.patch_at(a, left + fx * (right - left), top + fy * (bottom - top))
        assert (p.row, p.col) == (r, c)
        l, t, rr, b = p.cell
        assert l <= fx <= rr and t <= fy <= b
    assert explore.patch_at(a, left - 1, top + 1) is None
    assert explore.patch_at(a, left + 1, bottom + 1) is None


def test_view_pixels_map_to_upload_pixels(tmp_path):
    a = _analysis(tmp_path, "avg", size=(1600, 900))  # the view is shrunk to VIEW_SIDE
    view = explore.clickable(a)
    assert max(view.size) == explore.VIEW_SIDE
    x, y = explore.from_view(a, view.width / 2, view.height / 2)
    assert abs(x - 800) < 2 and abs(y - 450) < 2


def test_patch_rows(tmp_path):
    a = _analysis(tmp_path, "token")
    p = explore.patch_at(a, 45, 30)
    attn = a.attentions[1][0]
    row = explore.attention_row(a, p, layer=1, head=2)
    torch.testing.assert_close(row.flatten(), attn[2, p.token, 1:])
    torch.testing.assert_close(explore.attention_row(a, p, 1, None).flatten(), attn.mean(0)[p.token, 1:])
    # The rollout row of the class token is the library's attention rollout (the read-out row).
    cls = explore.Patch(0, 0, p.grid, 0, (0, 0, 1, 1))
    for fusion, discard in [("mean", 0.0), ("min", 0.3)]:
        expected = explain.attention_rollout(a.model, a.x, head_fusion=fusion, discard_ratio=discard)[0]
        torch.testing.assert_close(explore.rollout_row(a, cls, fusion, discard), expected)
    # A patch's rollout row is its row of the full product (A_L + I)/n ... (A_1 + I)/n.
    R = torch.eye(attn.shape[-1])
    for layer_attn in a.attentions:
        m = layer_attn[0].mean(0) + torch.eye(attn.shape[-1])
        R = (m / m.sum(-1, keepdim=True)) @ R
    expected = R[p.token, 1:] / R[p.token, 1:].max()
    torch.testing.assert_close(explore.rollout_row(a, p, "mean", 0.0).flatten(), expected)


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_explore_draws_every_head(tmp_path, kind):
    a = _analysis(tmp_path, kind)
    s = parse_settings(a.model, layer=-1, head="0")
    first, rollout, heads, text = explore.patch_maps(a, explore.patch_at(a, 45, 30), s)
    assert max(first.size) >= explore.SIDE and first.size == rollout.size
    per_row = min(a.model.config.num_heads, 4)
    assert heads.width > per_row * explore.TILE
    assert "token grid" in text and f"layer {a.model.config.depth - 1}" in text


def test_settings_are_checked():
    model = _model()
    s = parse_settings(model, methods.RAW, "3", layer=-2, head="3", discard_ratio=0.5, opacity=1)
    assert (s.layer, s.head, s.target, s.discard_ratio) == (0, 3, 3, 0.5)
    assert parse_settings(model).target is None and parse_settings(model, head="mean").head is None
    # a method's title is parsed once, by the request (its estimate takes the default for a title not in the table)
    assert Prepared({"method": "Raw attention"}).method(methods.ATTNLRP) is methods.RAW
    assert Prepared({}).method(methods.ATTNLRP) is methods.ATTNLRP
    with pytest.raises(ValueError, match="Saliency"):
        Prepared({"method": "Saliency"}).method(methods.ATTNLRP)
    assert Prepared({"method": "Saliency"}).method(methods.ATTNLRP, strict=False) is methods.ATTNLRP
    bad = [
        dict(target="zebra"),
        dict(layer=2),
        dict(layer=-3),
        dict(layer=0.5),
        dict(layer="x"),
        dict(head="4"),
        dict(head="-1"),
        dict(head_fusion="median"),
        dict(discard_ratio=1.0),
        dict(opacity=-0.1),
        dict(opacity="nan"),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            parse_settings(model, **kw)
    assert settings.check_top_k(50, 5) == 5
    for k in (0, -1, "x", 2.5):
        with pytest.raises(ValueError):
            settings.check_top_k(k, 5)


def test_compare_scores_every_method_and_the_centre_baseline(tmp_path):
    a = _analysis(tmp_path, "avg")
    a.maps.clear()  # the analysis is shared through the cache with other tests
    analysis.relevance(a, Settings(method=methods.GRADIENT), CPU)  # drawn before, as the Classify tab does
    before = a.seconds[analysis.map_key(a, Settings(method=methods.GRADIENT))]
    seen = []
    scored = compare.score_methods(a, Settings(), CPU, lambda f, desc: seen.append((f, desc)))
    assert [n for n, *_ in scored] == [*(m.title for m in methods.METHODS), compare.CENTRE]
    for name, heat, deletion, insertion, ms in scored:
        assert heat.shape == (a.x.shape[-2:] if name == methods.RISE.title else a.grid)
        assert 0 <= deletion <= 1 and 0 <= insertion <= 1
        assert (ms is None) is (name == compare.CENTRE) and (ms is None or ms > 0)
    assert dict((n, ms) for n, *_, ms in scored)[methods.GRADIENT.title] == 1000 * before  # its time then
    n = len(methods.METHODS) + 1
    assert [f for f, desc in seen if desc.startswith("Deleting")] == [i / n for i in range(n)]
    assert seen[0][1] == "RISE: masked images"  # RISE's forward passes report progress too


def test_parameter_counts_read_well():
    cases = {
        0: "0",
        999: "999",
        1000: "1.0K",
        7930: "7.9K",
        9960: "10K",
        208_842: "209K",
        999_600: "1.0M",
        1_343_914: "1.3M",
        86_567_656: "87M",
        632_000_000: "632M",
        2_500_000_000: "2.5B",
    }
    assert {n: model_info.format_count(n) for n in cases} == cases


def test_times_keep_the_digits_that_mean_something():
    cases = {2216.4: "2,216 ms", 37.4: "37 ms", 2.34: "2.3 ms", 0.384: "0.38 ms"}
    assert {ms: model_info.format_ms(ms) for ms in cases} == cases


def test_low_confidence_reads_as_a_guess():
    names = ["cat", "dog", "ship"]
    assert model_info.verdict(torch.tensor([0.8, 0.15, 0.05]), names) == "cat (80%)"
    assert model_info.verdict(torch.tensor([0.4, 0.35, 0.25]), names) == "Not sure — maybe cat (40%) or dog (35%)"
    assert "3 classes" in model_info.facts(_model(num_classes=3, label_names=("a", "b", "c")))


def test_the_app_says_why_it_is_unsure():
    """Issue #45 item 3, #48 item 6: each decision says why in words, and "not one of my classes" does not read as
    a confident answer (the top probability is explained as a share among the known classes)."""
    names = ["cat", "dog", "ship"]
    plain = model_info.decide(torch.tensor([0.8, 0.15, 0.05]), names, is_ood=False)
    assert (plain.kind, plain.plain, plain.reason, plain.markdown()) == (model_info.ANSWER, True, "", "cat (80%)")
    torn = model_info.decide(torch.tensor([0.45, 0.4, 0.15]), names, is_ood=False)
    assert torn.kind == model_info.TORN and not torn.plain
    assert torn.headline == "Not sure — torn between cat (45%) and dog (40%)" and "both cat and dog" in torn.reason
    spread = model_info.decide(torch.tensor([0.4, 0.35, 0.25]), names)
    assert spread.kind == model_info.UNSURE and "No class stands out" in spread.reason
    words = "less like the photos it learned than 99 of 100 of its held-out photos"
    far = model_info.decide(torch.tensor([0.98, 0.01, 0.01]), names, is_ood=True, unlike=words)
    assert far.kind == model_info.NONE_OF_MINE and not far.plain
    assert far.headline == "Not one of my 3 classes — most like: cat"  # no "98%" beside "not one of"
    assert f"looks unlike the photos I was trained on: {words}." in far.reason and "1,512" not in far.reason
    assert "would be cat, but the 98% beside it is a share among my 3 classes, not the chance" in far.reason
    assert far.markdown() == f"{far.headline}\n\n{far.reason}"


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_inspect_works_for_any_model(tmp_path, kind):
    model = _model(**MODELS[kind])
    x = build_transform(model.pretrained_cfg)(Image.open(_photo(tmp_path)))[None]
    filters, similarity, distance = model_info.inspect_figures(model, x, CPU)
    assert min(filters.size + similarity.size + distance.size) > 100
    text = model_info.summary(model, None)
    assert text.startswith("| Property | Value |\n|---|---|\n| Variant |")
    assert "hybrid" in text if kind == "hybrid" else "image patches" in text


def test_model_card_images_are_inlined_and_confined(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    Image.new("RGB", (4, 4), "red").save(folder / "curves.png")
    Image.new("RGB", (4, 4), "red").save(tmp_path / "secret.png")
    (folder / "README.md").write_text(
        "---\nlicense: x\n---\n# card\n![curves](curves.png) ![out](../secret.png) ![web](https://x.org/a.png)"
    )
    text = model_info.summary(_model(), folder)
    assert "![curves](data:image/png;base64," in text
    assert "![out](../secret.png)" in text and "![web](https://x.org/a.png)" in text


# -------------------------------------------------------------------------------------------- batch


def _png_bytes(colour="red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), colour).save(buf, "PNG")
    return buf.getvalue()


def _read(paths: list) -> list[tuple[archives.Item, bytes | None]]:
    return list(archives.read_uploads([str(p) for p in paths]))


def test_batch_reads_images_and_zips_safely(tmp_path):
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("a/one.png", _png_bytes())
        z.writestr("../../escape.png", _png_bytes("blue"))  # a name only: nothing is extracted
        z.writestr("notes.txt", "not an image")
        z.writestr("__MACOSX/.hidden.png", b"junk")
        z.writestr("broken.jpg", b"not really a jpeg")
        z.writestr("folder/", b"")
    single = tmp_path / "single.png"
    single.write_bytes(_png_bytes("green"))
    read = _read([archive, single])
    assert [i.name for i, _ in read] == [
        "photos.zip/a/one.png",
        "photos.zip/../../escape.png",
        "photos.zip/broken.jpg",
        "single.png",
    ]
    assert [data for _, data in read] == [_png_bytes(), _png_bytes("blue"), b"not really a jpeg", _png_bytes("green")]
    assert not (tmp_path.parent / "escape.png").exists()
    with pytest.raises(ValueError, match="Upload"):
        archives.read_uploads([])

    model = _model(label_names=("a", "b", "c", "d", "e"))
    tf = build_transform(model.pretrained_cfg)
    with pytest.raises(ValueError, match="RISE .* is on the Classify tab"):
        batch.classify_batch(model, tf, [str(archive)], Settings(method=methods.RISE), CPU)
    items, gallery = batch.classify_batch(
        model, tf, [str(archive), str(single)], Settings(method=batch.batchable()[0]), CPU
    )
    assert [i.probs is not None for i in items] == [True, True, False, True]
    assert "photos.zip/broken.jpg" in items[2].error and "not an image" in items[2].error
    assert len(gallery) == 3 and gallery[0][1].startswith("photos.zip/a/one.png: ")
    rows = batch.write_csv(items, list(model.label_names), top_k=2).read_text().splitlines()
    assert rows[0] == "file,prediction,unsure,none_of_my_classes,ood_score,class_1,p_1,class_2,p_2,error"
    assert len(rows) == 5 and rows[3].startswith("photos.zip/broken.jpg,,,,,") and "not an image" in rows[3]
    assert rows[1].split(",")[3:5] == ["", ""]  # a model without a detector: no decision, no score


@pytest.mark.parametrize("method", batch.batchable(), ids=lambda m: m.key)
def test_batch_results_are_the_classify_tabs(tmp_path, method):
    """Each image of a batch (decoded reduced, a chunk per forward pass) gets the probabilities and the map
    the Classify tab computes for it alone; a large image too (the reference decodes it at full size)."""
    model = _model(label_names=("a", "b", "c", "d", "e"))
    tf = build_transform(model.pretrained_cfg)
    paths = [_photo(tmp_path, size, f"p{i}.png") for i, size in enumerate([(90, 60), (1500, 900), (40, 70)])]
    items, gallery = batch.classify_batch(model, tf, paths, Settings(method=method), CPU)
    for item, path, (overlay, caption) in zip(items, paths, gallery, strict=True):
        reference = torch.stack([tf(load_image(path))])
        with torch.no_grad():
            expected = (model(reference).softmax(-1) + model(reference.flip(-1)).softmax(-1))[0] / 2
        torch.testing.assert_close(item.probs, expected, atol=0.02, rtol=0)  # large: a reduced decode
        assert max(overlay.size) <= batch.THUMB and caption.startswith(Path(path).name)


def test_batch_caps_images_and_bytes(tmp_path, monkeypatch):
    many = tmp_path / "many.zip"
    with zipfile.ZipFile(many, "w") as z:
        for i in range(archives.MAX_IMAGES + 5):
            z.writestr(f"{i}.png", _png_bytes())
    read = _read([many])
    assert sum(data is not None for _, data in read) == archives.MAX_IMAGES
    assert "at most" in read[-1][0].error

    # A bomb: 64 MB of zeros deflates to about 64 KB; the declared size is over the per-image limit.
    monkeypatch.setattr(archives, "MAX_IMAGE_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros.png", bytes(64 << 20))
    assert bomb.stat().st_size < 1 << 20
    ((item, data),) = _read([bomb])
    assert data is None and "uncompressed" in item.error

    # A member whose header understates its size is cut off while reading, not trusted.
    liar = tmp_path / "liar.zip"
    with zipfile.ZipFile(liar, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("big.png", bytes(4 << 20))
    data = bytearray(liar.read_bytes())
    for sig, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # uncompressed size in both headers
        at = data.index(sig)
        data[at + offset : at + offset + 4] = (1000).to_bytes(4, "little")
    liar.write_bytes(bytes(data))
    ((item, data),) = _read([liar])
    assert data is None and item.error


def _end_records(entries: int, directory: int, start: int) -> bytes:
    """A zip's ZIP64 end records declaring ``entries`` entries in a ``directory``-byte directory at ``start``."""
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, directory, start)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, start, 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return record + locator + end


def test_a_zip_bomb_by_entry_count_is_refused_without_reading_its_directory(tmp_path, monkeypatch):
    """The entry count comes from the end-of-central-directory record (ZIP64's past 65,535 entries), read
    first: the counts agree with zipfile's, and an archive over ``MAX_MEMBERS`` (a real one, and one that only
    declares a million entries) is refused before zipfile would read its directory."""
    small = tmp_path / "small.zip"
    with zipfile.ZipFile(small, "w") as z:
        for i in range(3):
            z.writestr(f"{i}.png", _png_bytes())
    with zipfile.ZipFile(small) as z:
        assert archives.zip_directory(small) == (3, sum(46 + len(i.filename) for i in z.infolist()))
    many = tmp_path / "many.zip"
    with zipfile.ZipFile(many, "w") as z:
        for i in range(archives.MAX_MEMBERS + 1):
            z.writestr(f"{i}", b"")
    declared = tmp_path / "declared.zip"
    declared.write_bytes(_end_records(1_000_000, 88_000_000, 0))  # 76 bytes that declare a million entries
    assert (
        archives.zip_directory(many)[0] == archives.MAX_MEMBERS + 1 and archives.zip_directory(declared)[0] == 1_000_000
    )
    not_a_zip = tmp_path / "not.zip"
    not_a_zip.write_bytes(b"PK\x03\x04 and nothing else")
    assert archives.zip_directory(not_a_zip) is None

    def unread(*args, **kwargs):
        raise AssertionError("the directory was read")

    monkeypatch.setattr(zipfile, "ZipFile", unread)
    for archive, count in ((many, "10,001 entries"), (declared, "1,000,000 entries")):
        ((item, data),) = _read([archive])
        assert data is None and "refused unread" in item.error and count in item.error


def test_a_batch_decodes_one_image_at_a_time_within_its_budgets(tmp_path, monkeypatch):
    """Eight 2000x2000 PNGs: the batch's peak memory is about one image's decode, not eight; an image over
    the per-image decoding budget, or past the batch's pixel budget, is skipped with the reason."""
    model = _model()
    tf = build_transform(model.pretrained_cfg)
    buf = io.BytesIO()
    Image.new("RGB", (2000, 2000), (30, 200, 90)).save(buf, "PNG")
    archive = tmp_path / "eight.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i in range(8):
            z.writestr(f"{i}.png", buf.getvalue())
    decoded = 4 * 2000 * 2000  # one image's pixels: 16 MB
    one = read_header(buf.getvalue()).decode_bytes(analysis.MAX_SIDE, analysis.needed_side(tf))  # its budget
    rollout = Settings(method=methods.ROLLOUT)
    batch.classify_batch(model, tf, [str(archive)], rollout, CPU)  # warm up: first-use allocations
    (items, gallery), peak = peak_of(lambda: batch.classify_batch(model, tf, [str(archive)], rollout, CPU))
    assert len(gallery) == 8 and all(i.probs is not None for i in items)
    # all eight held at once: at least 8 x 16 MB decoded. One at a time measured 40 MB alone, 66 MB once inside the
    # full suite, whose other threads share this process's RSS: the bound sits between
    assert peak < 6 * decoded, (peak >> 20, decoded >> 20)

    monkeypatch.setattr(batch, "MAX_DECODED_PIXELS", 3 * 2000 * 2000)
    items, gallery = batch.classify_batch(model, tf, [str(archive)], Settings(method=methods.ROLLOUT), CPU)
    assert len(gallery) == 3 and all("more than the batch has left" in i.error for i in items[3:])
    monkeypatch.setattr(batch, "MAX_DECODE_BYTES", one - 1)
    items, gallery = batch.classify_batch(model, tf, [str(archive)], Settings(method=methods.ROLLOUT), CPU)
    assert not gallery and "classify it on its own" in items[0].error


def test_the_app_says_none_of_my_classes_when_the_models_detector_does(tmp_path):
    """The bundled model stores a "none of my classes" detector: an analysis carries its decision and the
    verdict says it plainly (a 1x1-pixel image is nothing it knows); a model without one keeps today's rule."""
    bundled = vit_core.from_pretrained(BUNDLED).eval()
    tf = build_transform(bundled.pretrained_cfg)
    speck = tmp_path / "speck.png"
    Image.new("RGB", (1, 1), (200, 30, 40)).save(speck)
    a = analyse(bundled, tf, "bundled-speck", str(speck), CPU)
    assert a.is_ood is True and a.ood_score > bundled.calibration.ood.threshold
    words = model_info.verdict(a.probs, a.names, a.is_ood)
    assert words.startswith("Not one of my 10 classes — most like: ")
    decision = model_info.analysis_decision(a)
    assert decision.kind == model_info.NONE_OF_MINE and f"{a.ood_score:,.0f}" not in decision.reason  # no raw score
    assert "looks unlike the photos I was trained on: " in decision.reason  # said against its held-out photos
    cat = analyse(bundled, tf, "bundled-cat", str(ROOT / "examples" / "cat_chelsea.jpg"), CPU)
    assert cat.is_ood is False and model_info.verdict(cat.probs, cat.names, cat.is_ood).startswith("cat (")
    plain = _model(label_names=("a", "b", "c", "d", "e"))
    b = analyse(plain, build_transform(plain.pretrained_cfg), "plain-speck", str(speck), CPU)
    assert b.is_ood is None and b.ood_score is None


# ---------------------------------------------------------------------------- what the page shows and says


def test_colour_bar_ends_are_told_apart_with_enough_digits():
    """Gradient rollout's map can span 0.03% (a real photo: 0.99969 to 1): its ends must not read "1.00 … 1.00"."""
    assert render.range_labels(0.99969, 1.0) == ("0.9997", "1.0000")
    assert render.range_labels(0.9962, 1.0) == ("0.996", "1.000")
    assert render.range_labels(0.13, 1.0) == ("0.13", "1.00")  # two decimals when they suffice
    assert render.range_labels(0.0014, 0.14) == ("0.0014", "0.14")  # small values keep two significant digits
    assert render.range_labels(0.5, 0.5) == ("0.500000", "0.500000")  # a flat map: as many digits as allowed
    heat = torch.full((4, 4), 0.99969)
    heat[0, 0] = 1.0
    assert render.with_colorbar(Image.new("RGB", (300, 200)), heat, "gradient rollout").size[0] == 300


def test_tiny_images_are_shown_enlarged_with_sharp_pixels(tmp_path):
    one = render.display_copy(Image.new("RGB", (1, 1), (200, 10, 30)), 2048)
    assert one.size == (256, 256) and set(one.getdata()) == {(200, 10, 30)}
    grid = Image.new("L", (8, 4), 0)
    grid.putpixel((7, 3), 255)
    shown = render.display_copy(grid, 2048)
    assert shown.size == (256, 128) and shown.getpixel((255, 127)) == (255, 255, 255)
    assert shown.getpixel((223, 95)) == (0, 0, 0)  # nearest neighbour: a 32x32 square per pixel, no blur
    assert render.display_copy(Image.new("RGB", (6000, 8)), 2048).size == (2048, 3)
    assert render.display_copy(Image.new("RGB", (300, 20)), 2048).size == (300, 20)  # large enough already
    a = _analysis(tmp_path, "token", size=(10, 6))  # the map covers the enlarged picture's crop
    assert a.shown.size == (260, 156) and a.box == tuple(round(v * 26) for v in a.crop)


def test_an_image_over_the_servers_pixel_limit_is_refused_as_the_servers_limit(monkeypatch):
    monkeypatch.setattr(analysis, "MAX_PIXELS", 100)
    buf = io.BytesIO()
    Image.new("RGB", (20, 10)).save(buf, "PNG")
    with pytest.raises(ImageDataError, match=r"20x10 pixels is more than this server accepts") as e:
        analysis.open_upload(buf.getvalue())
    assert "max_pixels" not in str(e.value)  # a visitor cannot raise it
    with pytest.raises(TooManyPixelsError, match="raise max_pixels"):  # the library's own words, for code
        vit_core.data.load_image(buf.getvalue(), max_pixels=100)


def test_layers_and_heads_are_numbered_from_0_everywhere():
    model = _model()  # 2 layers, 4 heads
    assert [settings.check_layer(model, v) for v in (0, 1, -1, -2)] == [0, 1, 1, 0]
    with pytest.raises(ValueError, match=r"layer must be 0\.\.1 for this 2-layer model \(0 = first\), or -1\.\.-2"):
        settings.check_layer(model, 2)
    assert settings.layer_name(1, 2) == "layer 1 (the last)" and settings.layer_name(0, 12) == "layer 0 (the first)"
    assert settings.layer_name(5, 12) == "layer 5" and settings.head_name(None) == "mean of heads"
    assert settings.head_name(0) == "head 0" and settings.check_head(model, "3") == 3


def test_tickets_drop_answers_to_older_requests_and_about_a_previous_subject():
    t = events.Tickets(max_entries=3)
    cat, dog = events.subject_of("cat.jpg", "bundled"), events.subject_of("dog.jpg", "bundled")
    assert t.start("page", "classify", 2, cat) and t.current("page", "classify", 2, cat)
    assert not t.start("page", "classify", 1, cat)  # sent before the one already running: its answer is stale
    assert t.start("page", "classify", 5, cat) and not t.current("page", "classify", 2, cat)  # the newest wins
    t.change("page", "classify", 7, dog)  # the page chose another image
    assert not t.current("page", "classify", 5, cat) and not t.start("page", "classify", 6, cat)  # about the cat
    assert t.start("page", "classify", 6, dog)  # asked about the dog before the page saw the change: still true
    assert t.start("page", "classify", 8, dog) and t.start("page", "explore", 1, cat)  # groups apart
    assert t.start("other page", "classify", 1, cat)  # pages apart
    assert t.start(None, "classify", 0, cat) and t.start("page", "classify", None, cat)  # the API: no ticket
    # files: a list from each request, the same files the same subject, hashable (a list is not)
    files = events.subject_of(["a.png", "b.zip"], "m")
    assert hash(files) == hash(events.subject_of(["a.png", "b.zip"], "m"))
    t.change("page", "batch", 5, files)  # requests sent before it: current when about these files
    assert t.current("page", "batch", 3, events.subject_of(["a.png", "b.zip"], "m"))
    assert not t.current("page", "batch", 3, events.subject_of(["a.png", "c.zip"], "m"))  # other files
    assert not t.current("page", "batch", 3, events.subject_of(["a.png", "b.zip"], "other model"))
    for i in range(5):
        t.start(f"page {i}", "g", 1)
    assert len(t._newest) == 3  # bounded: the least recently used are forgotten


def test_an_answer_is_shown_in_place_of_the_outputs_or_dropped_when_stale(monkeypatch):
    monkeypatch.setattr(events, "TICKETS", events.Tickets())
    cat = events.subject_of("cat.jpg", "bundled")

    def refused():
        raise gr.Error("not an image")

    free = nullcontext()  # no memory gate
    assert events.if_newest(
        events.Ticket("page", "g", 1, cat), 2, lambda: ("map", "cat"), lambda e: (None, e), free
    ) == ("map", "cat")
    failed = events.if_newest(events.Ticket("page", "g", 2, cat), 2, refused, lambda e: (None, problem(e)), free)
    assert failed == (None, "⚠️ not an image")

    def overtaken():  # the page chooses another image while this runs
        events.TICKETS.change("page", "g", 4, events.subject_of("dog.jpg", "bundled"))
        return "old map", "cat"

    skipped = events.if_newest(events.Ticket("page", "g", 3, cat), 2, overtaken, lambda e: (None, e), free)
    assert all(isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1 for v in skipped)
    assert (
        events.if_newest(events.Ticket("page", "g", 3, cat), 2, lambda: ("x", "y"), lambda e: e, free) == skipped
    )  # not even run


def test_a_request_refused_for_memory_says_so_in_place_and_still_overtakes_the_older_ones(monkeypatch):
    """Raw attention chosen while a RISE map computes, on a server whose memory budget the RISE request fills:
    the newer request is refused ("busy") in place of the results, and the RISE answer, finishing after it, is
    dropped: otherwise the RISE map would land under a radio that says Raw attention."""
    monkeypatch.setattr(events, "TICKETS", events.Tickets())
    cat = events.subject_of("cat.jpg", "bundled")
    gate = Gate(max_memory=rss() + 300 * MB, max_wait=0)  # room for one request of 250 MB

    def failed(message: str) -> tuple:
        return None, problem(message)

    def rise():
        raw = events.if_newest(
            events.Ticket("page", "g", 2, cat), 2, lambda: ("raw map", "cat"), failed, gate.held(250 * MB)
        )
        assert raw[0] is None and raw[1].startswith("⚠️ The server is busy; try again in "), raw
        return "RISE map", "cat"

    stale = events.if_newest(events.Ticket("page", "g", 1, cat), 2, rise, failed, gate.held(250 * MB))
    assert all(isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1 for v in stale), stale
    assert events.if_newest(
        events.Ticket("page", "g", 3, cat), 2, lambda: ("raw map", "cat"), failed, gate.held(250 * MB)
    ) == (
        "raw map",
        "cat",
    )  # the budget is free again


def test_inspect_says_the_measured_accuracy_and_the_training_in_words(tmp_path):
    bundled = catalog.BUNDLED
    top1 = json.loads((bundled / "eval_test.json").read_text())["top1"]
    flip, flip5 = (json.loads((bundled / "eval_test_flip.json").read_text())[k] for k in ("top1", "top5"))
    both, both5 = (json.loads((bundled / "eval_test_flip-translate.json").read_text())[k] for k in ("top1", "top5"))
    text = model_info.measured_accuracy(bundled, "flip")
    assert text.startswith(f"{top1:.2f}% top-1") and "on the 10,000 images of the cifar10 test split" in text
    assert f"{flip:.2f}% top-1 ({flip5:.2f}% top-5) with flip averaging, as this app predicts" in text
    assert text.endswith(f"{both:.2f}% top-1 ({both5:.2f}% top-5) with flip-translate views")  # measured, not used
    shifted = model_info.measured_accuracy(bundled, "flip-translate")  # a model calibrated for those views
    assert "with flip averaging;" in shifted and "with flip-translate views, as this app predicts" in shifted
    last = json.loads((bundled / "metrics.jsonl").read_text().splitlines()[-1])
    training = model_info.training_summary(bundled)
    assert training.startswith(f"{last['epoch']} epochs in ")
    top1 = last.get("ema_test_top1", last["test_top1"])  # the weight average's when there is one
    assert f"{top1:.2f}% on the 2,000 test images checked each epoch" in training
    assert "lr" not in training.split() and "train_top1" not in training

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"epoch": 1, "train_loss": 2.0, "test_top1": 31.5}\n')
    assert model_info.training_summary(run) == "1 epoch; last epoch: training loss 2.000, 31.50% on the test split."
    assert model_info.measured_accuracy(run, "flip").startswith("not measured on a whole test split")
    assert model_info.training_summary(tmp_path) is None  # no metrics
    summary = model_info.summary(_model(), run)
    assert "| Accuracy (measured) | not measured" in summary and "| Training | 1 epoch;" in summary
    (run / "metrics.jsonl").write_text('{"epoch": 2, "test_top1": 31.5, "ema_test_top1": 33.0}\n')
    assert model_info.training_summary(run) == (
        "2 epochs; last epoch: 33.00% on the test split (the weight average, as exported)."
    )

    # a fine-tuned run: held-out accuracy measured (eval_held-out_flip.json) and checked each epoch: said once, and
    # no top-5 for two classes (it said the same sentence twice, the second with "100.00% top-5")
    eval_held = {"top1": 78.4, "top5": 100.0, "count": 153, "data": "ants_and_bees", "split": "held-out", "tta": "flip"}
    (run / "eval_held-out_flip.json").write_text(json.dumps(eval_held))
    (run / "metrics.jsonl").write_text('{"epoch": 3, "train_loss": 0.4, "test_top1": 78.4}\n')
    two = model_info.summary(_model(num_classes=2, label_names=("ants", "bees")), run)
    assert two.count("78.4") == 1 and "top-5" not in two, two


@pytest.mark.parametrize(
    ("argv", "env", "host", "allow_any"),
    [
        ([], {}, "127.0.0.1", True),
        (["--public"], {}, "0.0.0.0", False),  # public: all interfaces, and listed models only
        (["--public", "--host", "10.0.0.5"], {}, "10.0.0.5", False),
        ([], {"GRADIO_SERVER_NAME": "0.0.0.0", "SPACE_ID": "me/app"}, "0.0.0.0", False),  # a Space
        (["--host", "0.0.0.0"], {}, "0.0.0.0", False),  # reachable from elsewhere: no typed models by default
    ],
)
def test_public_mode_serves_all_interfaces_and_the_picker_says_what_it_allows(monkeypatch, argv, env, host, allow_any):
    for name in ("GRADIO_SERVER_NAME", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    p = argparse.ArgumentParser()
    p.add_argument("--host")
    p.add_argument("--share", action="store_true")
    options.add_arguments(p)
    args = p.parse_args(argv)
    assert options.serving_host(args) == host and options.configure(args).allow_any is allow_any
    label = picker.label(allow_any)
    assert ("type a run folder or a Hub repo id" in label) is allow_any
    assert allow_any or "it loads no other" in label


def test_the_line_under_the_picker_says_what_the_models_card_says_of_its_temperature(tmp_path):
    """A fine-tuning whose held-out photos could not set the temperature keeps T = 1 and its card says so; the
    line under the picker said "calibrated (temperature 1.00, fitted on held-out training images)". Saved and
    loaded as the app loads it, the model's line now says it is not calibrated and why."""
    model = _model(label_names=("a", "b", "c", "d", "e"))
    note = "T = 1 kept: the held-out images could not set the temperature (its fit on them ran to the edge)"
    model.calibration = Calibration(temperature=1.0, tta="flip", fitted_on=f"{note}; the 9 images held out")
    vit_core.save_pretrained(model, tmp_path / "run")
    loaded = vit_core.from_pretrained(tmp_path / "run")
    line = model_info.facts(loaded)
    assert "could not set the temperature (T = 1 kept)" in line and "are calibrated" not in line, line
    fitted = Calibration(temperature=0.8, tta="flip", fitted_on="the 9 images held out")
    model.calibration = fitted
    assert "calibrated (temperature 0.80, fitted on held-out" in model_info.facts(model)
