"""The project's promises about itself: the README's two commands, CI running exactly the test one, lint."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)  # the Hugging Face Space front matter
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index(block.group(0)) < 400, "the README must open with its two commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_launch_and_test_commands():
    launch, test = _readme_commands()[:2]
    assert "requirements.txt" in launch and "app.py" in launch
    assert "requirements-dev.txt" in test and "pytest" in test


def test_ci_runs_exactly_the_readme_test_command():
    test = _readme_commands()[1]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test in ci_lines


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (ROOT / ".venv/bin/ruff").exists(), reason="ruff not installed"
)
def test_ruff_clean():
    ruff = shutil.which("ruff") or str(ROOT / ".venv/bin/ruff")
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_readme_is_a_short_product_page_with_its_notice():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250, "depth belongs in docs/"
    headings = re.findall(r"^### …(.+)$", text, re.M)
    assert len(headings) == 5 and "explain a prediction from Python" in headings
    assert "## NOTICE" in text and "patented" in text and "patented" in (ROOT / "NOTICE").read_text()


def test_docs_print_no_test_counts():
    """A count of tests goes stale with the next test and differs by machine (skips): pytest prints it."""
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        found = re.search(r"\b\d[\d,]* (tests|passed|skipped)\b", path.read_text())
        assert not found, f"{path.name}: {found.group(0)!r}"
