"""End to end in a real browser: Playwright drives Debian's chromium against ``python app.py``.

Clicks a patch and checks the explorer follows the click; changes settings and checks the map re-renders
without pressing Classify; renders Inspect for the bundled model, a 1-channel ``mnist_tiny``-like run and a
conv-stem hybrid; checks a failed load, the desktop and phone layouts, and saves a screenshot of every view
at 1280x900 and 390x844 (to ``$VIT_SCREENSHOTS``, e.g. ``docs/screenshots``; a temporary folder otherwise).

Skips when chromium (``/usr/bin/chromium``) or the playwright package is absent; browsers are never downloaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

import vit_core
from tests.hub_server import transformers_vit_files
from tests.test_app import CAT, ROOT, server  # noqa: F401 (fixture)
from webapp.catalog import imagenet_names

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
WAIT = 600_000  # ms: on a shared, loaded 2-core machine one step can take minutes
SHOTS = Path(os.environ.get("VIT_SCREENSHOTS") or Path(tempfile.gettempdir()) / "vit_core_screenshots")
EXAMPLE_PHOTOS = sorted((ROOT / "examples").glob("*.jpg"))
FIGURES = ("#fig-filters", "#fig-similarity", "#fig-distance")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    """Small untrained models: an ``mnist_tiny``-like ViT (1 channel, 16 wide, fewer filters than the
    figure's 28), a conv-stem hybrid with BatchNorm (8x8 tokens from a 32x32 input, average pooling) and an
    ImageNet-1k ViT/16 at 224 px in transformers' layout (its labels from ``id2label``)."""
    root = tmp_path_factory.mktemp("runs")
    mnist = vit_core.ViTConfig(
        img_size=28,
        patch_size=4,
        in_chans=1,
        embed_dim=16,
        depth=3,
        num_heads=2,
        mlp_ratio=2.0,
        global_pool="avg",
        class_token=False,
        mean=(0.1307,),
        std=(0.3081,),
        crop_pct=1.0,
        num_classes=10,
        label_names=tuple("0123456789"),
    )
    hybrid = vit_core.ViTConfig(
        img_size=32,
        patch_size=1,
        stem_channels=(16, 32),
        stem_strides=(2, 2),
        embed_dim=32,
        depth=2,
        num_heads=2,
        global_pool="avg",
        class_token=False,
        crop_pct=1.0,
        num_classes=10,
    )
    paths = {}
    for name, cfg in (("mnist_tiny", mnist), ("hybrid", hybrid)):
        vit_core.save_pretrained(vit_core.create_model(cfg), root / name)
        paths[name] = str(root / name)
    # google/vit-base-patch16-224 as transformers lays it out (config.json with ImageNet's id2label,
    # preprocessor_config.json, model.safetensors), at a tiny width with random weights
    imagenet = root / "vit-imagenet-transformers"
    imagenet.mkdir()
    for file, data in transformers_vit_files(dict(enumerate(imagenet_names()))).items():
        (imagenet / file).write_bytes(data)
    paths["imagenet"] = str(imagenet)
    return paths


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _open(browser, url: str, viewport: dict):
    page = browser.new_context(viewport=viewport).new_page()
    page.set_default_timeout(WAIT)
    page.goto(url, wait_until="load")
    page.locator("#status").get_by_text("Loaded").wait_for()
    return page


@pytest.fixture
def page(browser, server):  # noqa: F811
    page = _open(browser, server[2], DESKTOP)
    yield page
    page.context.close()


@pytest.fixture
def phone(browser, server):  # noqa: F811
    page = _open(browser, server[2], PHONE)
    yield page
    page.context.close()


def _loaded(page, selector: str, n: int = 1) -> None:
    """Wait until ``selector`` holds at least ``n`` images, every one of them loaded and decoded."""
    page.wait_for_function(
        "([sel, n]) => { const imgs = [...document.querySelectorAll(sel + ' img')];"
        " return imgs.length >= n && imgs.every(i => i.complete && i.naturalWidth > 0); }",
        arg=[selector, n],
    )


def _shot(page, view: str, anchor: str | None = None) -> None:
    """Save the viewport as ``<view>_<width>x<height>.png``, scrolled so that ``anchor`` (a selector) is at the
    top (the page's top when None), once every image in sight has loaded."""
    if anchor is None:
        page.evaluate("() => window.scrollTo(0, 0)")
    else:
        page.locator(anchor).first.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.wait_for_function(
        "() => [...document.querySelectorAll('img')].every(i => { const r = i.getBoundingClientRect();"
        " const inSight = r.width && r.height && r.bottom > 0 && r.top < innerHeight;"
        " return !inSight || (i.complete && i.naturalWidth > 0); })"
    )
    page.mouse.move(0, 0)  # no button in its hover colour
    page.wait_for_timeout(500)  # transitions and late layout
    size = page.viewport_size
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{view}_{size['width']}x{size['height']}.png"), animations="disabled")


def _src(page, selector: str) -> str:
    img = page.locator(f"{selector} img").first
    img.wait_for()
    return img.get_attribute("src")


def _changed(page, selector: str, before: str | None) -> str:
    """Wait until the image in ``selector`` shows a new file; return its src."""
    page.wait_for_function(
        "([sel, old]) => { const i = document.querySelector(sel + ' img'); return i && i.src && i.src !== old; }",
        arg=[selector, before or ""],
    )
    return _src(page, selector)


def _classify(page) -> str:
    page.locator("#image input[type=file]").set_input_files(str(CAT))
    page.locator("#classify").click()
    return _changed(page, "#overlay", None)


def _tab(page, name: str) -> None:
    """Select a tab; on narrow screens Gradio moves the tabs that do not fit into a "More tabs" menu."""
    tab = page.get_by_role("tab", name=name)
    if tab.count():
        tab.click()
    else:
        page.get_by_role("button", name="More tabs").click()
        page.locator(".overflow-dropdown button", has_text=name).click()


def _compare(page) -> None:
    page.get_by_role("button", name="Compare methods").click()
    page.wait_for_function(
        "() => document.querySelector('#compare-text textarea')?.value.startsWith('Maps and scores for class')"
    )
    page.wait_for_function(
        "() => [...document.querySelectorAll('#compare-gallery img')].filter(i => i.complete && i.naturalWidth)"
        ".length >= 4"
    )


def _choose_model(page, value: str) -> None:
    box = page.get_by_label("Model:")
    box.fill(value)
    box.press("Enter")
    page.locator("#status").get_by_text(Path(value).name).wait_for()


# ---------------------------------------------------------------------------------------------- tests


def test_settings_re_render_without_pressing_classify(page):
    first = _classify(page)
    page.locator("#verdict").get_by_text("%").wait_for()
    explains = page.locator("#explains")
    assert "Map explains:" in explains.inner_text()
    assert page.get_by_role("radio", name="RISE (random masks)").is_checked()  # the bundled model's default
    _loaded(page, "#overlay")
    _shot(page, "classify")

    page.get_by_role("radio", name="Raw attention").check()  # an input event: re-rendered from the cached forward pass
    second = _changed(page, "#overlay", first)
    page.locator("#opacity input[type=number]").fill("0.9")
    page.locator("#opacity input[type=number]").press("Tab")  # the slider's release event
    third = _changed(page, "#overlay", second)
    assert len({first, second, third}) == 3
    page.get_by_text("Explanation settings").click()
    page.get_by_role("radio", name="Gradient rollout").check()
    target = page.get_by_label("Class to explain")
    target.fill("dog")
    target.press("Enter")
    explains.get_by_text("Map explains: dog").wait_for()


def test_clicking_a_patch_shows_where_it_attends(page):
    _classify(page)
    _tab(page, "Explore patches")
    view = page.locator("#view img").first
    view.wait_for()
    texts, images = [], []
    for fx, fy in [(0.3, 0.2), (0.7, 0.85)]:  # both inside the centre square of the 451x300 cat photo
        box = view.bounding_box()
        before = _src(page, "#patch-attention") if images else None
        view.click(position={"x": fx * box["width"], "y": fy * box["height"]})
        images.append(_changed(page, "#patch-attention", before))
        text = page.locator("#patch-text textarea")
        page.wait_for_function(
            "([el, old]) => el.value && el.value !== old", arg=[text.element_handle(), texts[-1] if texts else ""]
        )
        texts.append(text.input_value())
    assert texts[0] != texts[1] and images[0] != images[1]
    assert all("token grid" in t for t in texts)
    assert page.locator("#view img").count() and page.get_by_label("x (image pixels)").input_value()
    _loaded(page, "#patch-rollout")
    _loaded(page, "#heads-grid")
    _shot(page, "explore", ".tab-wrapper")


def test_compare_methods_and_batch_mode(page):
    page.locator("#image input[type=file]").set_input_files(str(CAT))
    _tab(page, "Compare methods")
    _compare(page)
    _shot(page, "compare", ".tab-wrapper")

    _tab(page, "Batch")
    page.locator("#files input[type=file]").set_input_files([str(p) for p in EXAMPLE_PHOTOS])
    page.get_by_role("button", name="Classify all").click()
    page.wait_for_function(
        "n => document.querySelector('#batch-note textarea')?.value.startsWith(n + ' image(s) classified')",
        arg=len(EXAMPLE_PHOTOS),
    )
    page.locator("#batch-csv a[download='predictions.csv']").wait_for()
    _loaded(page, "#batch-gallery", len(EXAMPLE_PHOTOS))
    _shot(page, "batch", "#batch-note")


def test_inspect_renders_for_the_bundled_model_mnist_tiny_and_a_hybrid(page, runs):
    expected = {  # what each model's summary says about it
        "bundled": "Parameters",
        "mnist_tiny": "7,930 (7.9K)\nInput\t28x28, 1 channel",
        "hybrid": "Tokens from\ta CNN feature map (hybrid)",
    }
    previous: list[str] = []
    for name, text in expected.items():
        if name != "bundled":
            _choose_model(page, runs[name])
        _tab(page, "Inspect")
        page.get_by_role("button", name="Analyse model").click()
        page.wait_for_function("t => document.querySelector('#summary').innerText.includes(t)", arg=text)
        for figure in FIGURES:
            _loaded(page, figure)
        shown = [_src(page, figure) for figure in FIGURES]
        assert not set(shown) & set(previous), "the figures are the previous model's"
        previous = shown
        assert page.locator(".toast-body").count() == 0, page.locator(".toast-body").all_inner_texts()
        if name == "bundled":
            _shot(page, "inspect", ".tab-wrapper")
        _tab(page, "Classify")


def test_an_imagenet_model_in_transformers_layout_shows_its_labels_and_map(page, runs):
    _choose_model(page, runs["imagenet"])
    page.locator("#facts").get_by_text("1000 classes").wait_for()
    assert "224×224-pixel colour" in page.locator("#facts").inner_text()
    _classify(page)
    page.locator("#verdict").get_by_text("%").wait_for()
    names = set(imagenet_names())
    shown = [line.strip() for line in page.locator("#labels").inner_text().splitlines()]
    assert sum(line in names for line in shown) == 5, shown  # the top 5, by their ImageNet names
    verdict = page.locator("#verdict").inner_text()
    assert any(verdict.startswith((f"{n} (", f"Not sure — maybe {n} (")) for n in names), verdict
    assert page.locator("#explains").inner_text().startswith("Map explains: ")
    width, height = page.eval_on_selector("#overlay img", "i => [i.naturalWidth, i.naturalHeight]")
    assert width == 451 and 300 < height <= 380  # the photo with the map over its centre crop, and a colour bar
    _tab(page, "Explore patches")
    view = page.locator("#view img").first
    view.wait_for()
    box = view.bounding_box()
    view.click(position={"x": box["width"] / 2, "y": box["height"] / 2})
    page.wait_for_function("() => document.querySelector('#patch-text textarea')?.value.includes('14x14 token grid')")


def test_a_model_that_fails_to_load_says_so_and_the_previous_stays(page):
    _choose_model_failing = page.get_by_label("Model:")
    _choose_model_failing.fill("nobody/no-such-vit")
    _choose_model_failing.press("Enter")
    status = page.locator("#status")
    status.get_by_text("Could not load").wait_for()
    assert "Still using" in status.inner_text()
    _classify(page)  # the previous model still answers
    page.locator("#verdict").get_by_text("%").wait_for()


def test_classify_button_is_visible_without_scrolling_on_a_laptop(page):
    box = page.locator("#classify").bounding_box()
    assert box["y"] + box["height"] <= DESKTOP["height"]


def test_phone_layout_examples_before_results_and_every_view(phone):
    picker, status = phone.get_by_label("Model:").bounding_box(), phone.locator("#status").bounding_box()
    assert status["y"] >= picker["y"] + picker["height"] and status["width"] > 300  # a row of its own
    examples = phone.get_by_text("Examples (licences").bounding_box()
    results = phone.locator("#verdict").bounding_box()
    assert examples["y"] < results["y"]
    _classify(phone)
    phone.locator("#verdict").get_by_text("%").wait_for()
    _loaded(phone, "#overlay")
    _shot(phone, "classify", "#verdict")
    _tab(phone, "Explore patches")
    view = phone.locator("#view img").first
    view.wait_for()
    box = view.bounding_box()
    view.click(position={"x": box["width"] / 2, "y": box["height"] / 2})
    for figure in ("#patch-attention", "#patch-rollout", "#heads-grid"):
        _loaded(phone, figure)
    _shot(phone, "explore", "#patch-text")
    _tab(phone, "Compare methods")
    _compare(phone)
    columns = phone.eval_on_selector("#compare-gallery .grid-container", "g => getComputedStyle(g).gridTemplateColumns")
    assert len(columns.split()) == 2, columns  # 4 columns on wider screens
    table = phone.locator("#compare-table").bounding_box()
    score = phone.locator("#compare-table td").last.bounding_box()  # the baseline's insertion AUC
    assert score["x"] + score["width"] <= table["x"] + table["width"] + 1  # no scrolling to see the scores
    cells = phone.eval_on_selector_all(  # words wrap whole, never split, and no cell overflows
        "#compare-table :is(th, td)",
        "cs => cs.map(c => [c.innerText, getComputedStyle(c).overflowWrap, c.scrollWidth <= c.clientWidth + 1])",
    )
    assert cells and all(wrap == "normal" and fits for _, wrap, fits in cells), cells
    _shot(phone, "compare", "#compare-text")
    _tab(phone, "Batch")
    phone.locator("#files input[type=file]").set_input_files([str(p) for p in EXAMPLE_PHOTOS])
    phone.get_by_role("button", name="Classify all").click()
    phone.locator("#batch-csv a[download='predictions.csv']").wait_for()
    _loaded(phone, "#batch-gallery", len(EXAMPLE_PHOTOS))
    _shot(phone, "batch", "#batch-note")
    _tab(phone, "Inspect")
    phone.get_by_role("button", name="Analyse model").click()
    phone.locator("#summary table").first.wait_for()  # the bundled model's card has tables too
    for figure in FIGURES:
        _loaded(phone, figure)
    styles = phone.eval_on_selector_all(
        "#summary td", "cells => cells.map(c => getComputedStyle(c).wordBreak + ' ' + getComputedStyle(c).overflowWrap)"
    )
    assert styles and set(styles) == {"normal normal"}
    _shot(phone, "inspect", "#fig-distance")
