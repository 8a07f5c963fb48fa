"""The models the app offers by name: the bundled CIFAR-10 model and a short list of the paper's ImageNet
checkpoints on the Hub, each labelled with what a user needs in order to choose (size, download, format).

Sizes are facts about the Hub repos (exact parameter counts of the architectures, and the size of their
``model.safetensors``), written here so the picker can show them without any network call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from timm.data import ImageNetInfo

from vit_core.training.run_folder import is_complete

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "models" / "cifar10_speedrun"
# The recipes that trained it, in order: its recipe.json is the last one's, stage<i>_recipe.json the earlier ones'.
BUNDLED_RECIPES = ("cifar10_speedrun_bf16", "cifar10_speedrun_photos", "cifar10_speedrun_photos7")
BUNDLED_LABEL = "bundled: CIFAR-10 hybrid ViT"
EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.jpg"))  # shown on Classify, measured on Inspect


@dataclass(frozen=True)
class Curated:
    """One of the paper's ImageNet-1k checkpoints on the Hub."""

    title: str
    repo: str
    params: int  # exact: vit_core builds this architecture with this many parameters
    download_mb: float  # model.safetensors on the Hub (float32 weights)
    format: str  # "transformers" or "timm": the repo's layout; vit_core reads both

    @property
    def label(self) -> str:
        """What the picker shows, e.g. "ViT-B/16 (ImageNet, 86.6M params, 346 MB, transformers)"."""
        return f"{self.title} (ImageNet, {self.params / 1e6:.1f}M params, {self.download_mb:.0f} MB, {self.format})"


CURATED = (
    # The paper's ViT-B/16, fine-tuned on ImageNet-1k at 224 px: the default when the Hub is reachable.
    Curated("ViT-B/16", "google/vit-base-patch16-224", 86_567_656, 346, "transformers"),
    Curated("ViT-B/16 AugReg", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", 86_567_656, 346, "timm"),
    Curated("ViT-B/32", "timm/vit_base_patch32_224.augreg_in21k_ft_in1k", 88_224_232, 353, "timm"),
    Curated("ViT-L/16", "google/vit-large-patch16-224", 304_326_632, 1217, "transformers"),
    Curated("R50+ViT-B/16 hybrid, 384 px", "timm/vit_base_r50_s16_384.orig_in21k_ft_in1k", 98_950_952, 396, "timm"),
    Curated("ViT-Ti/16 (small, fast)", "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k", 5_717_416, 22.9, "timm"),
)
AUTO = CURATED[0]  # what --model auto loads when the Hub answers


def run_folders() -> list[str]:
    """The complete runs under runs/ (their weights, calibration and card: ``run_folder.is_complete``), as paths
    relative to the project: a run a crash left half-written (weights and a checkpoint every epoch, no card) is
    never offered."""
    runs = ROOT / "runs"
    found = runs.glob("*/config.json") if runs.is_dir() else []
    return sorted(str(p.parent.relative_to(ROOT)) for p in found if is_complete(p.parent))


@cache
def imagenet_names() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names in index order ("tench, Tinca tinca", ...), as transformers'
    ``id2label`` has them. timm's repos often carry no names; timm bundles them, so this works offline."""
    info = ImageNetInfo()
    return tuple(info.index_to_description(i) for i in range(info.num_classes()))
