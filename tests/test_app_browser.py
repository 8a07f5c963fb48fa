"""End to end in a real browser: Playwright drives Debian's chromium against ``python app.py``.

Skips when chromium (``/usr/bin/chromium``) or the playwright package is absent; browsers are never downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.test_app import CAT, LABELS, server  # noqa: F401 (fixture)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

SCREENSHOT = Path(__file__).resolve().parents[1] / "runs" / "screenshots" / "app_classify.png"


def test_upload_classify_and_see_labels_and_overlay(server):  # noqa: F811
    _, _, url = server
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )  # fmt: skip
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(url, wait_until="networkidle")
            page.locator("input[type=file]").first.set_input_files(str(CAT))
            page.get_by_role("button", name="Classify", exact=True).click()
            # The label panel lists class names; the overlay appears as an image in the output column.
            page.get_by_text("Where the model looked").wait_for()
            page.wait_for_function(
                "names => names.some(n => document.body.innerText.includes(n))", arg=LABELS, timeout=60_000
            )
            page.locator("img[src*='/file=']").last.wait_for(timeout=60_000)
            page.get_by_text(" ms").first.wait_for(timeout=60_000)
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 10_000
