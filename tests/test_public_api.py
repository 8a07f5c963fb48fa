"""What ``vit_core`` promises by name, and what loading a checkpoint costs: the names the README, docs/*.md and the
app use through ``vit_core.<x>`` stay where they are whatever the folders inside become, and ``from_pretrained``
imports nothing of ``vit_core.training`` (a loader that pulls in the training stack is slower to start and carries
code a served model never runs)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import vit_core

ROOT = Path(__file__).resolve().parents[1]

# Where people meet vit_core's names: the README, the docs, and the code of the app, the CLI and the benchmarks.
READERS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "app.py"]
READERS += sorted(p for d in ("webapp", "train", "bench") for p in (ROOT / d).rglob("*.py"))
USED = re.compile(r"\bvit_core\.([a-z_]\w*)(?:\.([A-Za-z_]\w*))?")


def _used() -> set[tuple[str, str | None]]:
    """Every ``vit_core.<x>`` and ``vit_core.<x>.<y>`` the readers write (in code and in prose alike)."""
    return {m for path in READERS for m in USED.findall(path.read_text())}


def test_the_top_level_names_stay():
    """What ``__all__`` promises is there, and every function or class the readers call ``vit_core.<name>`` is
    in ``__all__`` (a name used but not promised would go unnoticed in a reshuffle)."""
    missing = sorted(n for n in vit_core.__all__ if not hasattr(vit_core, n))
    assert not missing, f"vit_core.__all__ names that vit_core lacks: {missing}"
    top = {x for x, _ in _used()}
    assert {"create_model", "from_pretrained", "save_pretrained"} <= top  # the readers were read
    unpromised = sorted(
        x for x in top if not _is_module(x) and x not in vit_core.__all__ and x not in ("__version__", "__main__")
    )
    assert not unpromised, f"vit_core.<name> the docs or the app use that __all__ does not promise: {unpromised}"
    assert isinstance(vit_core.__version__, str)


def _is_module(name: str) -> bool:
    """``vit_core.<name>`` is a module: one of the package's attributes (``vit_core.methods``) or by its path."""
    if isinstance(getattr(vit_core, name, None), types.ModuleType):
        return True
    try:
        importlib.import_module(f"vit_core.{name}")
        return True
    except ModuleNotFoundError:
        return False


def _submodule(name: str) -> object:
    """``vit_core.<name>`` as a caller reaches it: an attribute of the package (``vit_core.methods``), else the
    module imported by its path (``import vit_core.figures``)."""
    return getattr(vit_core, name, None) or importlib.import_module(f"vit_core.{name}")


def test_the_documented_submodule_names_stay():
    """Every ``vit_core.<submodule>.<name>`` the readers write is there (a module, or a name in one)."""
    used = {(sub, name) for sub, name in _used() if name and _is_module(sub)}
    assert ("calibration", "predict") in used and ("methods", "METHODS") in used  # the readers were read
    missing = sorted(
        f"vit_core.{sub}.{name}"
        for sub, name in used
        if not hasattr(_submodule(sub), name) and not _is_module(f"{sub}.{name}")
    )
    assert not missing, f"names the docs and the app use that are gone: {missing}"


LOAD = """
import json, sys
import vit_core
model = vit_core.from_pretrained(sys.argv[1])
print(json.dumps({"training": sorted(m for m in sys.modules if m.startswith("vit_core.training")),
                  "classes": model.config.num_classes}))
"""


def test_loading_a_checkpoint_imports_nothing_from_training(tmp_path):
    """A fresh interpreter loads a saved checkpoint; ``vit_core.training`` and its modules stay unimported."""
    model = vit_core.create_model("vit_tiny_patch16_224", num_classes=3, img_size=32, patch_size=8)
    vit_core.save_pretrained(model, tmp_path / "ckpt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["classes"] == 3  # the checkpoint was loaded, not some other model
    assert out["training"] == [], f"loading imported training modules: {out['training']}"
