"""The app's tabs as modules (``webapp.tabs``): a tab added as one module and one entry of ``app.TABS`` is built,
gated with its own estimate and served; every tab decodes an upload the same way (a large photo gets the same
numbers from Classify, Batch, the API and ``vit_core.calibration.predict``); one Classify request reads its
upload once and passes through at most 10 of the app's modules; a repeated change of image sends no second
request; ``--default-method``, the LRP notice, and the API page's plain-text descriptions."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import inspect
import io
import re
import sys
import types
from contextlib import nullcontext
from pathlib import Path

import gradio as gr
import pytest
import torch
from gradio.data_classes import FileData
from gradio_client import Client, handle_file
from PIL import Image, PngImagePlugin

import app
import vit_core
from vit_core import methods
from vit_core.calibration import calibrated_views, predict, unlikeness
from vit_core.data import load_image
from webapp.inference import model_info
from webapp.inference import settings as settings_module
from webapp.inference.analysis import Upload
from webapp.inference.settings import PREDICTED, MapSettings
from webapp.registry import options
from webapp.registry.access import Access
from webapp.registry.catalog import ROOT
from webapp.server.admission import COMPUTE, Gate, rss
from webapp.tabs import batch, classify
from webapp.ui import events
from webapp.ui.declarations import Api, Page, Tab
from webapp.ui.endpoints import Context, Prepared, api
from webapp.ui.inputs import ImageUpload

from .net import free_port
from .test_docs import code_blocks

EXAMPLE_DOG = ROOT / "examples" / "dog_cocker_spaniels.jpg"


@pytest.fixture(scope="module")
def ctx() -> Context:
    return app.setup("bundled")


@pytest.fixture(scope="module")
def large_photo(tmp_path_factory) -> Path:
    """A 2000x1300 JPEG: within the Classify tab's 2048 pixels, so it decodes it whole, as ``load_image`` does;
    Batch decoded it reduced to its gallery's 384 pixels before (another OOD score: 266.3 against 269.1)."""
    path = tmp_path_factory.mktemp("large") / "two_dogs.jpg"
    dogs = Image.open(ROOT / "examples" / "dog_cocker_spaniels.jpg").convert("RGB")
    dogs.resize((2000, 1300), Image.Resampling.BICUBIC).save(path, quality=90)
    return path


# ------------------------------------------------------------------------------------ a tab is one module

SEEN: list[dict] = []


def _echo(ctx: Context, request: Prepared) -> str:
    """The dummy tab's API: the upload's size and the model's classes."""
    model, _, _ = ctx.model(request)  # the choice resolved once, for the estimate too
    size = request["image"].header.size
    return f"{size[0]}x{size[1]}, {model.config.num_classes} classes"


echo = api(_echo, ("image", "model_choice"))


def estimate(ctx: Context, request: Prepared) -> int:
    SEEN.append(dict(request.values))
    return DUMMY.need


def build(ctx: Context, page: Page) -> Tab:
    out = gr.Textbox(label="Echo")
    return Tab(apis=[Api("dummy", echo, [page.controls.image, page.picker.choice], [out], estimate)])


DUMMY = types.ModuleType("dummy_tab")
DUMMY.TITLE, DUMMY.build, DUMMY.estimate, DUMMY.need = "Dummy", build, estimate, 1 << 20


def test_every_component_of_the_page_is_one_gradio_draws(ctx):
    """Our component classes (``webapp.ui.inputs``) are templates of Gradio's: the page's config names each by
    a type Gradio's frontend draws. A template of a template is drawn as nothing: the Batch tab's upload vanished
    from the page when it derived from the Train tab's ``PathFile`` instead of ``gr.File``."""
    built_in = {  # Block.get_block_name: a template is drawn by its direct base's name
        cls.__name__.lower()
        for cls in vars(gr.components).values()
        if isinstance(cls, type) and issubclass(cls, gr.blocks.Block) and cls.__module__.startswith("gradio.")
    }
    types = {c["type"] for c in app.build_ui(ctx).get_config_file()["components"]}
    assert types <= built_in | {"form", "tabitem", "tabs", "row", "column", "group", "accordion"}, types - built_in


def test_a_tab_added_as_one_module_and_one_entry_is_built_gated_with_its_estimate_and_served(ctx, monkeypatch):
    monkeypatch.setattr(app, "TABS", (*app.TABS, DUMMY))
    ctx = Context(ctx.models, gate=Gate(max_memory=rss() + (2 << 30)))
    demo = app.build_ui(ctx)
    tabs = [b.label for b in demo.blocks.values() if isinstance(b, gr.Tab)]
    assert tabs == ["Classify", "Explore", "Compare", "Batch", "Inspect", "Train", "Dummy"]
    demo.queue().launch(server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client, choice = Client(demo.local_url, verbose=False), ctx.models.default
        cat = ROOT / "examples" / "cat_chelsea.jpg"
        assert client.predict(handle_file(str(cat)), choice, api_name="/dummy") == "451x300, 10 classes"
        assert SEEN[-1]["model_choice"] == choice and isinstance(SEEN[-1]["image"], Upload)  # its own estimate
        DUMMY.need = 1 << 50  # more than any server has: refused by the gate with that estimate
        with pytest.raises(Exception, match=r"needs about 1,073,741,824 MB"):
            client.predict(handle_file(str(cat)), choice, api_name="/dummy")
    finally:
        DUMMY.need = 1 << 20
        demo.close()


# ------------------------------------------------------------------------------- one decode for every tab


def test_a_large_photo_gets_the_same_numbers_from_classify_batch_the_api_and_predict(ctx, large_photo):
    choice = ctx.models.default
    model, transform = ctx.models.get(choice)
    with torch.no_grad():  # the library's own path: the file decoded whole, the model's views
        reference = predict(model, transform(load_image(large_photo)).unsqueeze(0))
    probs, score = reference.probs[0], float(reference.ood_score[0])
    names = model.class_names

    labels, _, _, _, _, ood = classify.classify(ctx, str(large_photo), choice, top_k=10)  # the API's handler
    *_, page = classify.show(ctx, Prepared({"image": Upload(str(large_photo)), "model_choice": choice, "top_k": 10}))
    _, csv_path, _ = batch.batch(ctx, [str(large_photo)], choice, top_k=10)
    (row,) = list(csv.DictReader(io.StringIO(Path(csv_path).read_text())))
    for shown in (labels, page[0]["value"]):
        torch.testing.assert_close(torch.tensor([shown[n] for n in names]), probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(ood["ood_score"], score, atol=0, rtol=1e-5)
    in_batch = {row[f"class_{r}"]: float(row[f"p_{r}"]) for r in range(1, 11)}
    torch.testing.assert_close(torch.tensor([in_batch[n] for n in names]), probs, atol=6e-5, rtol=0)  # 4 decimals
    assert float(row["ood_score"]) == pytest.approx(score, rel=6e-4)  # 4 significant digits


@pytest.mark.parametrize("photo", ["cat_chelsea.jpg", "ood_coffee.jpg"])
def test_classify_batch_and_the_api_decide_by_one_rule(ctx, photo):
    """One rule (``model_info.decide`` on the library's probabilities and detector): the API's decision, the page's
    verdict and the Batch CSV's prediction agree, for an answered photo and for one the model rejects; the page
    greys the class bars of a rejected photo under "If it were one of my classes"."""
    path = str(ROOT / "examples" / photo)
    choice = ctx.models.default
    model, transform = ctx.models.get(choice)
    with torch.no_grad():
        p = predict(model, transform(load_image(path)).unsqueeze(0))
    unlike = unlikeness(model.calibration.ood, float(p.ood_score[0]))
    expected = model_info.decide(p.probs[0], model.class_names, bool(p.is_ood[0]), unlike)
    _, _, _, verdict, _, ood = classify.classify(ctx, path, choice)
    *_, page = classify.show(ctx, Prepared({"image": Upload(path), "model_choice": choice}))
    _, csv_path, _ = batch.batch(ctx, [path], choice)
    (row,) = list(csv.DictReader(io.StringIO(Path(csv_path).read_text())))
    assert (ood["decision"], ood["reason"]) == (expected.kind, expected.reason)
    assert verdict == expected.markdown() and page[3]["value"] == expected.markdown()
    assert row["prediction"] == expected.headline
    rejected = expected.kind == model_info.NONE_OF_MINE
    assert rejected == (photo.startswith("ood_"))  # the rule is exercised both ways
    assert page[0]["label"] == (classify.IF_IT_WERE if rejected else classify.TOP_K)
    assert page[0]["elem_classes"] == (["greyed"] if rejected else [])


# ----------------------------------------------------------------------- one read, at most 12 app modules

MAX_CLASSIFY_MODULES = 12  # docs/ARCHITECTURE.md lists them; this test counts them


def test_one_classify_request_reads_its_upload_once_and_runs_at_most_12_app_modules(ctx, tmp_path):
    """The page's Classify request as the server runs it (the upload component, then the page's handler with its
    ticket and request: ticketed, behind the memory gate, ``show``) on a photo the server has not seen, its
    overlay then encoded by its output component: the file is opened once (its header, digest and pixels come from
    that read), and the request runs code of at most 12 of the app's modules, every module entered counted (a
    profile without a filter), which are the ones docs/ARCHITECTURE.md lists for this path."""
    photo = tmp_path / "new_cat.png"
    Image.open(ROOT / "examples" / "cat_chelsea.jpg").save(photo)  # other bytes: not in the analysis cache
    ctx = Context(ctx.models, gate=Gate(max_memory=rss() + (2 << 30)))
    component = ImageUpload(type="filepath")
    (page_request,) = [fn.fn for fn in app.build_ui(ctx).fns.values() if fn.api_name == "classify_page"]
    output = classify.overlay_output()
    output.GRADIO_CACHE = str(tmp_path / "gradio")
    opened, entered = [], set()
    tracing = [False]

    def audit(event: str, args: tuple) -> None:
        if tracing[0] and event == "open" and str(args[0]) == str(photo):
            opened.append(args[1])

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if ROOT / "webapp" in path.parents:
                entered.add(path.relative_to(ROOT).as_posix())

    sys.addaudithook(audit)
    request = types.SimpleNamespace(session_hash="a page", headers={}, client=types.SimpleNamespace(host="127.0.0.1"))
    tracing[0] = True
    sys.setprofile(profile)
    try:
        image = component.preprocess(FileData(path=str(photo), orig_name="new_cat.png"))
        settings = dict(method=None, target=PREDICTED, layer=1, head="mean", head_fusion="mean", discard_ratio=0.0)
        *_, (labels, overlay, note, *_) = page_request(
            image, ctx.models.default, **settings, opacity=0.5, top_k=5, ticket=1, request=request
        )
        sent = output.postprocess(overlay)  # the overlay's way into the answer
    finally:
        sys.setprofile(None)
        tracing[0] = False
    assert "cat" in labels["value"] and Path(sent.path).is_file() and note.startswith("Computed in")
    assert len(opened) == 1, opened
    stated = re.findall(r"`(webapp/[\w/]+\.py)`", architecture_path("The Classify path"))
    assert sorted(entered) == sorted(stated), (sorted(entered), stated)
    assert len(entered) <= MAX_CLASSIFY_MODULES, "\n".join(sorted(entered))


def test_a_request_resolves_its_model_opens_its_upload_and_parses_its_method_once(ctx, tmp_path, monkeypatch):
    """One prepared request (``Prepared``) serves both the memory estimate and the computation: a Classify request
    on a new photo, from the page (streamed in two answers) and from the API, resolves its model choice once,
    parses its method's title once, checks its settings once and opens its upload once (the header the estimate
    read is the one decoded).
    Before, the page resolved the choice twice, and both parsed the title twice and opened the file twice."""
    counts: dict[str, int] = {}
    resolve, by_title, image_open = Access.resolve, methods.by_title, Image.open
    photos = []

    def counted(what: str, fn):
        def count(*args, **kwargs):
            counts[what] = counts.get(what, 0) + 1
            return fn(*args, **kwargs)

        return count

    def opened(fp, *args, **kwargs):
        if any(getattr(fp, "name", None) == str(p) for p in photos):
            counts["open"] = counts.get("open", 0) + 1
        return image_open(fp, *args, **kwargs)

    monkeypatch.setattr(Access, "resolve", counted("resolve", resolve))
    monkeypatch.setattr(methods, "by_title", counted("title", by_title))
    monkeypatch.setattr(settings_module, "parse_settings", counted("checked", settings_module.parse_settings))
    monkeypatch.setattr(Image, "open", opened)
    ctx = Context(ctx.models, gate=Gate(max_memory=rss() + (2 << 30)))
    (page_request,) = [fn.fn for fn in app.build_ui(ctx).fns.values() if fn.api_name == "classify_page"]
    api_request = ctx.handler(classify.classify, classify.estimate)
    page = types.SimpleNamespace(session_hash="once", headers={}, client=types.SimpleNamespace(host="127.0.0.1"))
    settings = dict(target=PREDICTED, layer=-1, head="mean", head_fusion="mean", discard_ratio=0.0, opacity=0.5)
    for i, ask in enumerate(("page", "api")):
        photos.append(tmp_path / f"once_{i}.png")
        cat = Image.open(ROOT / "examples" / "cat_chelsea.jpg").convert("RGB")
        cat.putpixel((0, 0), (i, 7, 7))  # new bytes: not in the analysis cache
        cat.save(photos[-1])
        counts.clear()
        image, method = Upload(str(photos[-1])), methods.ATTNLRP.title
        if ask == "page":
            parts = list(page_request(image, ctx.models.default, method, **settings, top_k=5, ticket=1, request=page))
            assert len(parts) == 2 and parts[-1][2].startswith("Computed in"), parts  # a first answer, then all
        else:
            labels, *_ = api_request(image, ctx.models.default, method, **settings, top_k=5)
            assert "cat" in labels
        assert counts == {"resolve": 1, "title": 1, "open": 1, "checked": 1}, (ask, counts)


def architecture_path(title: str) -> str:
    """The paragraph of docs/ARCHITECTURE.md that lists a path's modules: the one that starts with ``title``."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    start = text.index(title + " runs ")
    return text[start : text.index("\n\n", start)]


def test_classify_runs_each_of_its_steps_through_the_step_it_is_given(ctx, tmp_path):
    """``bench.app_budget`` times ``classify.classified`` itself through its ``step``: a new photo's answer runs
    reading the upload (its digest, then its header), decoding, preprocessing, the model's views, the map and the
    overlay through it, in that order, and answers with what they return; an image analysed before runs only its
    digest, the map and the overlay."""
    photo = tmp_path / "stepped_cat.png"
    cat = Image.open(ROOT / "examples" / "cat_chelsea.jpg").convert("RGB")
    cat.putpixel((0, 0), (1, 2, 3))
    cat.save(photo)  # bytes no other test sends: not in the analysis cache
    seen = []

    def step(name, work):
        seen.append((name, work()))
        return seen[-1][1]

    request = {"image": Upload(str(photo)), "model_choice": ctx.models.default}
    done = classify.classified(ctx, Prepared(request), step)
    labels, overlay, covered = done.labels, done.overlay, done.covered
    names = [name for name, _ in seen]
    assert names == ["read", "read", "decode", "preprocess", "model views", "map", "overlay"], names
    assert covered == classify.NEW and seen[-1][1] is overlay
    assert seen[1][1].size == (451, 300)  # the header, then the decoded image and its size, from that opening
    assert seen[2][1][0].size == seen[2][1][1] == (451, 300)
    seen.clear()
    again = classify.classified(ctx, Prepared(request))  # no step given: run as they are
    assert seen == [] and again.labels == labels and again.covered != classify.NEW
    classify.classified(ctx, Prepared(request), step)
    assert [name for name, _ in seen] == ["read", "map", "overlay"]


# ------------------------------------------------------------------------------------ the page's events


def test_a_repeated_change_of_image_clears_nothing_and_computes_nothing_without_an_error(ctx, monkeypatch):
    """A file input set while it holds a file fires ``change`` twice with the new file: the repeat clears nothing,
    in whichever order the two reach the server, and the recomputation chained after it computes nothing; neither
    answers with an error (the page's console logged three HTTP 500s per upload when the repeat raised one)."""
    tickets = events.Tickets()
    cat, dog = events.subject_of(Upload("cat.jpg"), "m"), events.subject_of(Upload("dog.jpg"), "m")
    assert tickets.change("page", "g", 1, cat) and tickets.change("page", "g", 2, dog)
    assert not tickets.change("page", "g", 3, dog)  # the same file, the same model
    assert tickets.change("page", "g", 4, cat)
    # the two events of one upload reaching a busy server in the other order: the later one, first, recomputes;
    # the earlier, overtaken, changes nothing (its chained request would carry a newer ticket, and run again)
    assert tickets.change("page", "g", 6, dog) and not tickets.change("page", "g", 5, dog)
    assert not tickets.change("page", "g", 5, cat)  # nor an overtaken change to another image
    # a recomputation chained after the clears runs once per change of subject, whichever arrives first
    assert tickets.claim("page", "g", 8, dog) and not tickets.claim("page", "g", 9, dog)  # dog's (ticket 6), once
    assert not tickets.change("page", "g", 10, dog) and not tickets.claim("page", "g", 11, dog)  # a repeat: none
    # a photo's recomputation queued behind a slow map while an example is clicked: sent about the photo (12)
    # before the example's change (13), it reaches the server after it; stale, it must leave the example's turn
    # to the example's own recomputation (14), or nothing shows the example (Explore, once in about 15 runs)
    assert tickets.change("page", "g", 11, cat) and tickets.change("page", "g", 13, dog)
    assert not tickets.claim("page", "g", 12, cat) and tickets.claim("page", "g", 14, dog)
    # overtaken by a click about the same photo (17, started first): it takes the turn and computes nothing, the
    # click answers, and a repeated change event after that recomputes nothing
    assert tickets.change("page", "g", 15, cat) and tickets.start("page", "g", 17, cat)
    assert tickets.claim("page", "g", 16, cat) and not tickets.start("page", "g", 16, cat)
    assert not tickets.change("page", "g", 18, cat) and not tickets.claim("page", "g", 19, cat)
    demo = app.build_ui(ctx)
    (clear,) = [fn for fn in demo.fns.values() if fn.name == "cleared" and fn.outputs[0].elem_id == "labels"]
    (new,) = [fn for fn in demo.fns.values() if fn.api_name == "classify_new"]
    assert new.trigger_after == clear._id and new.trigger_only_on_success
    request = types.SimpleNamespace(session_hash="a page")
    image = Upload(str(ROOT / "examples" / "cat_chelsea.jpg"))
    first = clear.fn(image, ctx.models.default, 10, request)
    assert first[0] is None  # the results cleared
    repeat = clear.fn(Upload(image.path), ctx.models.default, 11, request)  # no error raised
    assert all(isinstance(v, dict) and v.get("__type__") == "update" for v in repeat)  # left as they are
    names = list(inspect.signature(new.fn).parameters)
    values = {name: getattr(MapSettings, name, None) for name in names}
    values |= {"image": Upload(image.path), "model_choice": ctx.models.default, "ticket": 12, "request": request}
    call = {k: v for k, v in values.items() if k in names}
    *_, computed = new.fn(**call)  # the first to arrive computes: the cat's answer
    assert computed[3]["value"].startswith("cat ("), computed
    (out,) = new.fn(**(call | {"ticket": 13}))  # the other one, chained after the repeat, computes nothing
    assert all(isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1 for v in out), out


# --------------------------------------------------------------------- the default map and the LRP notice


def _options(*args: str) -> options.Options:
    p = argparse.ArgumentParser()
    options.add_arguments(p)
    return options.configure(p.parse_args(args))


def test_a_deployer_chooses_the_default_map_and_lrp_maps_carry_their_authors_notice(ctx, monkeypatch):
    assert _options().default_method is methods.ATTNLRP
    assert _options("--default-method", "rollout").default_method is methods.ROLLOUT
    monkeypatch.setenv(options.DEFAULT_METHOD_VARIABLE, "gradient")  # a Space's setting
    assert _options().default_method is methods.GRADIENT
    assert _options("--default-method", "attention").default_method is methods.RAW  # the flag wins
    with pytest.raises(SystemExit, match="--default-method: choose one of attnlrp, rollout"):
        _options("--default-method", "rise")  # many forward passes: not run for every model
    monkeypatch.delenv(options.DEFAULT_METHOD_VARIABLE)

    models = ctx.models
    monkeypatch.setattr(models, "options", _options("--default-method", "rollout"))
    demo = app.build_ui(ctx)
    (radio,) = [b for b in demo.blocks.values() if isinstance(b, gr.Radio) and b.label == "Explanation"][:1]
    assert radio.value == methods.ROLLOUT.title
    cat = str(ROOT / "examples" / "cat_chelsea.jpg")
    *_, explains, _ = classify.classify(ctx, cat, models.default)  # no method: the server's default
    assert explains.startswith("Map explains: cat, the prediction (attention maps are the same for every class")
    notices = [b.value for b in demo.blocks.values() if isinstance(b, gr.Markdown) and "patented" in (b.value or "")]
    assert len(notices) == 3  # Classify, Compare, Batch: where AttnLRP and Chefer et al. are offered
    assert notices[0].startswith("AttnLRP and Chefer et al. are based on layer-wise relevance propagation")
    assert "free of charge for personal and scientific purposes only" in notices[0]


def test_the_api_page_describes_each_endpoint_in_plain_text(ctx):
    """Gradio's "Use via API" page shows a handler's docstring as it is: no reStructuredText markup."""
    endpoints = app.build_ui(ctx).get_api_info()["named_endpoints"]
    for name in ("/classify", "/explore", "/compare", "/batch", "/inspect"):
        description = endpoints[name]["description"]
        assert description and "`" not in description and "``" not in description, (name, description)


# ------------------------------------------------------------------------ the tab docs/extending.md adds


def test_the_tab_docs_extending_md_adds_is_built_wired_and_served(ctx, monkeypatch, tmp_path):
    """docs/extending.md's "A tab", followed: its module (the block marked ``docs-test: tab``) saved as a module of
    ``webapp.tabs`` and added to ``app.TABS`` is laid out, its page event wired in the compute group, and its
    endpoint answers through ``gradio_client``; the page fails here when it drifts from the code."""
    (code,) = [code for _, marker, code in code_blocks("python") if marker == "tab"]
    path = tmp_path / "size.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("webapp.tabs.size", path)
    size = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(size)
    monkeypatch.setattr(app, "TABS", (*app.TABS, size))
    demo = app.build_ui(ctx)
    assert [b.label for b in demo.blocks.values() if isinstance(b, gr.Tab)][-1] == "Size"
    (page,) = [fn for fn in demo.fns.values() if fn.api_name == "size_page"]
    cat = ROOT / "examples" / "cat_chelsea.jpg"
    assert page.concurrency_id == COMPUTE
    assert page.fn(Upload(str(cat)), ctx.models.default, ticket=None, request=None) == "451x300, 10 classes"
    demo.queue().launch(server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        answer = client.predict(handle_file(str(cat)), ctx.models.default, api_name="/size")
        assert answer == "451x300, 10 classes"
    finally:
        demo.close()


def test_a_new_photo_gets_its_first_answer_from_one_pass_then_the_full_answer(ctx, tmp_path):
    """The page's Classify request on a photo the server has not seen answers twice: first the image alone's
    classes and the attention rollout of that one pass (said to be a first answer, of 1 of N views), then the full
    answer, which is the API's: the same probabilities as ``/classify`` on the same pixels, and the map asked for."""
    first_copy, api_copy = tmp_path / "a.png", tmp_path / "b.png"
    image = Image.open(EXAMPLE_DOG)
    image.save(first_copy)
    image.save(api_copy, pnginfo=_note("another file, the same pixels"))  # not in the analysis cache
    (page_request,) = [fn.fn for fn in app.build_ui(ctx).fns.values() if fn.api_name == "classify_page"]
    settings = dict(method=methods.RAW.title, target=PREDICTED, layer=-1, head="mean", head_fusion="mean")
    request = types.SimpleNamespace(session_hash="two answers")
    parts = list(page_request(Upload(str(first_copy)), ctx.models.default, **settings, discard_ratio=0.0,
                              opacity=0.5, top_k=3, ticket=1, request=request))  # fmt: skip
    assert len(parts) == 2, parts
    first, full = parts
    model = ctx.models.get(ctx.models.default)[0]
    views = len(vit_core.calibration.tta_views(torch.zeros(1, 3, 8, 8), calibrated_views(model)))
    assert f"a first answer, from the image alone (1 of {views} views)" in first[3]["value"]
    assert first[2].startswith("First answer in") and first[1] is not None
    assert full[2].startswith("Computed in") and "first answer" not in full[3]["value"]
    api_labels, *_ = classify.classify(ctx, str(api_copy), ctx.models.default, top_k=3, method=methods.RAW.title)
    page_labels = full[0]["value"]
    assert set(page_labels) == set(api_labels)
    for name, p in api_labels.items():
        assert abs(page_labels[name] - p) < 1e-5, (page_labels, api_labels)


def _note(text: str) -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    info.add_text("note", text)
    return info


def test_a_newer_request_stops_a_two_part_answer_after_its_first_part():
    """A setting changed while the full answer computes: the older request's next part is not shown, and its
    computation is not continued (the newest settings win)."""
    tickets = events.Tickets()
    ran = []

    def parts():
        ran.append("first")
        yield ("first",)
        ran.append("full")
        yield ("full",)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(events, "TICKETS", tickets)
        place = events.Ticket("page", "g", 1, "cat")
        shown = events.while_newest(place, 1, parts, lambda m: (m,), nullcontext())
        assert next(shown) == ("first",)
        assert tickets.start("page", "g", 2, "cat")  # the newer request starts
        rest = list(shown)
    assert rest == [(gr.skip(),)] and ran == ["first"]  # the full part was not computed
