"""``pip install .``: the wheel built from a clean copy of the sources, installed into an empty folder and
imported from elsewhere, with the dependencies it declares checked against what its modules import."""

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("vit_core", "train")  # what the wheel holds; the app runs from a checkout


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(lines: list[str]) -> set[str]:
    return {_normal(re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0]) for line in lines if line.strip()}


def _imported_distributions() -> set[str]:
    """The distributions whose modules ``vit_core`` and ``train`` import at module level (imports inside
    functions are the optional ones, e.g. Hugging Face ``datasets``)."""
    owners = packages_distributions()
    found = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - set(PACKAGES):
                    found |= {_normal(d) for d in owners[top]}
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel`` of a copy holding only what a clone has (no caches, no egg-info left in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyi")
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    cmd = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q"]
    proc = subprocess.run([*cmd, "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (built,) = (tmp / "dist").glob("vit_core-*.whl")
    return built


def test_the_wheel_declares_what_its_modules_import(wheel):
    with zipfile.ZipFile(wheel) as z:
        info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = z.read(info).decode()
        names = z.namelist()
    required = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    core = _requirement_names([r for r in required if "extra ==" not in r])
    assert _imported_distributions() <= core, _imported_distributions() - core
    # requirements.txt (what the checkout installs) is the core plus the app's extra
    listed = (REPO / "requirements.txt").read_text().splitlines()
    app = _requirement_names([r.split(";")[0] for r in required if 'extra == "app"' in r])
    assert _requirement_names([x for x in listed if not x.startswith("#")]) == core | app
    assert {n.split("/")[0] for n in names if "dist-info" not in n} == set(PACKAGES)
    recipes = {Path(n).stem for n in names if n.startswith("train/recipes/") and n.endswith(".py")}
    assert recipes == {p.stem for p in (REPO / "train" / "recipes").glob("*.py")}


@pytest.mark.slow  # about 30 s: two fresh interpreters import torch and timm
def test_the_installed_wheel_imports_and_runs_outside_the_checkout(wheel, tmp_path):
    """``pip install --target``, then Python started elsewhere with only that folder added: vit_core builds
    ViT-Ti/16 with timm's published parameter count, and the ``vit-train`` command lists the recipes."""
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIT_DATA")} | {"PYTHONPATH": str(site)}
    env["OMP_NUM_THREADS"] = "1"
    code = (
        "import vit_core, train; m = vit_core.create_model('vit_tiny_patch16_224'); "
        "print(vit_core.__version__, vit_core.__file__, train.__file__, sum(p.numel() for p in m.parameters()))"
    )
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 300}
    proc = subprocess.run([sys.executable, "-c", code], **run)
    assert proc.returncode == 0, proc.stderr
    version, core_file, train_file, params = proc.stdout.split()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version) and wheel.name.startswith(f"vit_core-{version}-")
    assert Path(core_file).is_relative_to(site) and Path(train_file).is_relative_to(site)
    assert int(params) == 5_717_416  # timm's vit_tiny_patch16_224
    proc = subprocess.run([str(site / "bin" / "vit-train"), "list"], **run)
    assert proc.returncode == 0 and re.search(r"^mnist_tiny +MNIST with a 7,930-parameter ViT", proc.stdout, re.M)
