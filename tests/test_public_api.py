"""What ``vit_core`` promises by name, and what loading a checkpoint costs: the names the README, docs/*.md and the
app use through ``vit_core.<x>`` stay where they are whatever the folders inside become, and ``from_pretrained``
imports nothing of ``vit_core.training`` (a loader that pulls in the training stack is slower to start and carries
code a served model never runs)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import vit_core

ROOT = Path(__file__).resolve().parents[1]

ALL = {
    "CheckpointError",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "from_pretrained",
    "get_config",
    "list_models",
    "push_to_hub",
    "resample_pos_embed",
    "save_pretrained",
}
# vit_core.<submodule>.<name> as the README, docs/*.md and the app write them
DOCUMENTED = {
    "calibration": {"predict", "calibrated_views", "Calibration", "fit_temperature", "tta_views"},
    "explain": {"attention_rollout", "attention_rollout_from", "attention_maps_from", "eval_mode", "target_classes"},
    "methods": {"METHODS", "OPTIONS", "Method"},
    "data": {"load_image", "read_header", "build_transform", "build_dataset", "Batches", "ImageDataError"},
    "figures": {"overlay"},
}


def test_the_top_level_names_stay():
    assert set(vit_core.__all__) >= ALL
    missing = sorted(n for n in ALL | set(vit_core.__all__) if not hasattr(vit_core, n))
    assert not missing, f"vit_core.__all__ names that vit_core lacks: {missing}"
    assert isinstance(vit_core.__version__, str)


def _submodule(name: str) -> object:
    """``vit_core.<name>`` as a caller reaches it: an attribute of the package (``vit_core.methods``), else the
    module imported by its path (``import vit_core.figures``)."""
    return getattr(vit_core, name, None) or importlib.import_module(f"vit_core.{name}")


def test_the_documented_submodule_names_stay():
    missing = sorted(
        f"vit_core.{sub}.{name}"
        for sub, names in DOCUMENTED.items()
        for name in names
        if not hasattr(_submodule(sub), name)
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
