"""The docs say only what runs: every command in README.md and docs/*.md names a module or script that exists
and flags its command line knows (the cheap commands are run), every Python block compiles (those marked
``<!-- docs-test: run -->`` run, offline; ``<!-- docs-test: app -->`` run against a live app in
``tests/test_app.py``), and every relative link points at a file, and heading, that exists."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*DOCS, ROOT / "train" / "recipes" / "README.md"]
PYTHONS = {"python", "python3", ".venv/bin/python", ".venv/bin/python3"}
SKIPPED = {"export", "cd", "pip", ".venv/bin/pip"}  # shell set-up: nothing of ours to check
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
BLOCK = re.compile(r"(?:<!-- docs-test: (\w+) -->\n)?```(\w*)\n(.*?)```", re.S)


def code_blocks(lang: str) -> list[tuple[str, str | None, str]]:
    """(file, its docs-test marker or None, code) for every ```lang block of the docs."""
    return [
        (path.relative_to(ROOT).as_posix(), marker, code)
        for path in DOCS
        for marker, block_lang, code in BLOCK.findall(path.read_text())
        if block_lang == lang
    ]


def marked_block(marker: str) -> str:
    """The one Python block of the docs marked ``<!-- docs-test: marker -->``: a page's example that a test runs
    as the page says (``docs/extending.md``'s method, score, tab and recipe)."""
    (code,) = [code for _, m, code in code_blocks("python") if m == marker]
    return code


def commands(code: str) -> list[list[str]]:
    """The simple commands of a bash block: continuations joined, comments dropped, split at && || ; |."""
    out: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        words: list[str] = []
        for word in [*shlex.split(line, comments=True), ";"]:
            if word in ("&&", "||", ";", "|"):
                out += [words] if words else []
                words = []
            else:
                words.append(word)
    return out


@cache
def console_scripts() -> dict[str, str]:
    """pyproject.toml's ``[project.scripts]``: each command and the package whose ``__main__`` it runs."""
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?:^\[|\Z)", (ROOT / "pyproject.toml").read_text(), re.M | re.S)
    entries = re.findall(r'^([\w-]+)\s*=\s*"([\w.]+?)(?:\.__main__)?:main"', section.group(1) if section else "", re.M)
    return dict(entries)


def target(words: list[str]) -> tuple[str, list[str]] | None:
    """What a command runs, as (``-m module`` or a script path, its arguments); None for shell set-up."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value before the command
        words = words[1:]
    program, rest = words[0], words[1:]
    if program in SKIPPED:
        return None
    if program in PYTHONS or program == "torchrun":
        if "-m" in rest:
            i = rest.index("-m")
            return "-m " + rest[i + 1], rest[i + 2 :]
        return rest[0], rest[1:]
    if program == "bash":
        return rest[0], rest[1:]
    if program in console_scripts():
        return "-m " + console_scripts()[program], rest
    raise AssertionError(f"a command the docs test does not know: {shlex.join(words)}")


def source_of(what: str) -> Path | None:
    """Our file behind ``-m module`` or a script (a path that does not exist when there is none); None for an
    installed module of another package."""
    if not what.startswith("-m "):
        return ROOT / what
    parts = what[3:].split(".")
    for candidate in (ROOT.joinpath(*parts, "__main__.py"), ROOT.joinpath(*parts[:-1], parts[-1] + ".py")):
        if candidate.exists():
            return candidate
    if parts[0] not in {"train", "bench", "vit_core", "webapp"} and importlib.util.find_spec(parts[0]) is not None:
        return None  # another package's module: venv, pytest
    return ROOT.joinpath(*parts)  # missing: reported


def subcommand(what: str, args: list[str]) -> list[str]:
    """``eval`` in ``python -m train eval ...``, ``push`` in ``python -m vit_core push ...``: the argv prefix
    whose ``--help`` lists the flags."""
    known = {"-m train": {"eval", "calibrate", "list"}, "-m vit_core": {"push"}}.get(what, set())
    return args[:1] if args[:1] and args[0] in known else []


def all_commands() -> list[tuple[str, str, list[str], list[str]]]:
    """(doc, what, subcommand, arguments) of every command of ours in the docs' bash blocks."""
    found = []
    for doc, _, code in code_blocks("bash"):
        for words in commands(code):
            t = target(words)
            if t is not None and source_of(t[0]) is not None:
                sub = subcommand(t[0], t[1])
                found.append((doc, t[0], sub, t[1][len(sub) :]))
    return found


RUNNER = """
import contextlib, io, json, runpy, sys
out = []
for what, argv in json.loads(sys.argv[1]):
    sys.argv, buf, code = [what, *argv], io.StringIO(), 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            if what.startswith("-m "):
                runpy.run_module(what[3:], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(what, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except Exception as e:
            code, _ = 1, buf.write(f"raised {type(e).__name__}: {e}")
    out.append([what, argv, code, buf.getvalue()])
print(json.dumps(out))
"""


def _is_cheap(what: str, sub: list[str], args: list[str]) -> bool:
    """Commands that finish in seconds, offline, writing nothing: listings, help, a dry-run push of a folder here."""
    return (
        (what, sub) == ("-m train", ["list"])
        or "--help" in args
        or (what == "-m vit_core" and "--dry-run" in args and (ROOT / args[0]).is_dir())
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict:
    """Everything this file runs, started at once (two processes run our command lines in-process, torch
    imported once each: every documented command's ``--help``, then the cheap commands; one process per
    marked Python block), so the file takes about as long as its slowest process."""
    found = all_commands()
    helps = sorted({(what, (*sub, "--help")) for _, what, sub, args in found if what.endswith(".py") or args})
    cheap = sorted({(what, (*sub, *args)) for _, what, sub, args in found if _is_cheap(what, sub, args)})
    jobs = [[w, list(a)] for w, a in helps + cheap if not w.endswith(".sh")]
    folder = tmp_path_factory.mktemp("docs")
    for name in ("models", "examples"):  # the blocks' paths are the repository's; what they write lands here
        (folder / name).symlink_to(ROOT / name)
    blocks = [(doc, code) for doc, marker, code in code_blocks("python") if marker == "run"]

    def start(cmd: list[str], cwd: Path) -> subprocess.Popen:
        env = {**OFFLINE, "PYTHONPATH": str(ROOT)}
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    runners = [start([sys.executable, "-c", RUNNER, json.dumps(jobs[i::2])], ROOT) for i in range(2)]
    block_procs = [start([sys.executable, "-c", code], folder) for _, code in blocks]
    results = []
    for proc in runners:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        results += json.loads(stdout.splitlines()[-1])
    block_results = []
    for (doc, _), proc in zip(blocks, block_procs, strict=True):
        _, stderr = proc.communicate(timeout=600)
        block_results.append((doc, proc.returncode, stderr))
    return {
        "help": {w + " " + " ".join(a[:-1]): out for w, a, _, out in results if a[-1:] == ["--help"]},
        "cheap": [(w, a, code, out) for w, a, code, out in results if (w, tuple(a)) in set(cheap)],
        "blocks": block_results,
    }


def test_every_documented_command_names_a_module_and_flags_that_exist(ran):
    problems = []
    for doc, what, sub, args in all_commands():
        source = source_of(what)
        if not source.exists():
            problems.append(f"{doc}: {what}: no such module or script ({source.relative_to(ROOT)})")
            continue
        if what.endswith(".sh"):
            continue
        text = ran["help"].get(what + " " + " ".join(sub), "")
        for arg in args:
            flag = arg.split("=")[0]
            if flag.startswith("--") and not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                problems.append(f"{doc}: {what} {' '.join(sub)}: no option {flag}")
        if "--recipe" in args:
            recipe = args[args.index("--recipe") + 1]
            if not (ROOT / "train" / "recipes" / f"{recipe}.py").exists():
                problems.append(f"{doc}: no recipe {recipe!r} in train/recipes/")
    assert not problems, "\n".join(problems)


def test_the_cheap_documented_commands_run(ran):
    cheap = ran["cheap"]
    assert any(a == ["list"] for _, a, _, _ in cheap) and any("--dry-run" in a for _, a, _, _ in cheap)
    failures = [f"{w} {shlex.join(a)}: exit {code}\n{out[-2000:]}" for w, a, code, out in cheap if code != 0]
    assert not failures, "\n".join(failures)


def test_every_python_block_compiles():
    blocks = code_blocks("python")
    assert len(blocks) >= 10
    for doc, _, code in blocks:
        compile(code, doc, "exec")


def test_the_marked_python_blocks_run_offline(ran):
    """The README's "explain a prediction" block and the explanation page's, as a user would run them from a
    checkout, with no network."""
    assert {doc for doc, _, _ in ran["blocks"]} >= {"README.md", "docs/explanations.md"}
    failures = [f"{doc}:\n{stderr[-3000:]}" for doc, code, stderr in ran["blocks"] if code != 0]
    assert not failures, "\n".join(failures)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


@pytest.mark.parametrize("path", LINKED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
            continue
        file, _, anchor = link.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{link}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{link}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_bundled_models_temperature_in_architecture_md_is_its_config_files():
    """ARCHITECTURE.md quotes the bundled model's temperature: the one its config.json holds, to three places."""
    temperature = json.loads((ROOT / "models" / "cifar10_speedrun" / "config.json").read_text())["calibration"]
    quoted = re.search(
        r"temperature first where it has one, ([0-9.]+)", (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    )
    assert quoted and f"{temperature['temperature']:.3f}" == quoted.group(1), (quoted, temperature["temperature"])


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` (``webapp.jobs.trainset.training_bytes``) names a module, or an attribute of one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_dotted_name_of_the_app_and_the_library_in_the_docs_and_docstrings_exists():
    """A module, function or class named in full (``webapp.inference.analysis.Upload``, ``vit_core.data.open_image``)
    in the README, docs/ or the app's and the library's code exists: a rename or a move that leaves one behind fails
    here (eight did, when it was written: ``webapp.analysis.Analysis`` and four more names of the app before its
    floors, ``estimates.training_bytes``, moved to ``jobs.trainset``, ``ui.endpoints.Tab``, to ``ui.declarations``,
    ``models.model.activation_bytes``, in ``models.cost``)."""
    texts = [ROOT / "README.md", ROOT / "app.py", *(ROOT / "docs").glob("*.md")]
    texts += [*(ROOT / "webapp").rglob("*.py"), *(ROOT / "vit_core").rglob("*.py"), *(ROOT / "train").rglob("*.py")]
    named = {
        (m.group(1), path.relative_to(ROOT).as_posix())
        for path in texts
        for m in re.finditer(r"\b((?:webapp|vit_core)(?:\.[A-Za-z_]\w*)+)", path.read_text())
    }
    missing = sorted((name, where) for name, where in named if not _resolves(name))
    assert len(named) > 200 and not missing, missing
