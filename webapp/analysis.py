"""One image through one model, computed once and reused by every view.

Changing the opacity, the method, the layer or head, clicking a patch or comparing methods all start from the
same forward pass: the decoded image, the model input, the probabilities and every block's attention. An
``Analysis`` holds them; ``ANALYSES`` keeps the recent ones (keyed by model and the upload's SHA-256, bounded
in bytes), so a settings change costs a map and a picture, not a decode and a forward pass. Cached tensors
live on the CPU: on a ZeroGPU Space the GPU is attached only for the duration of one call.

Maps come from ``vit_core.explain`` itself, run on the cached attentions through ``_Replay``, so the app
shows exactly what the library computes.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace

import torch
from PIL import Image
from torch import nn

from vit_core import VisionTransformer, explain
from vit_core.data import ImageTransform, load_image, read_header
from vit_core.model import forward_flops

RISE, ROLLOUT, GRADIENT, RAW = "RISE (random masks)", "Attention rollout", "Gradient rollout", "Raw attention"
METHODS = (RISE, ROLLOUT, GRADIENT, RAW)
# What one RISE map may cost (explain.RISE_MASKS forward passes), in FLOPs: 1.5 s measured on a 2-core CPU
# (the bundled model: 500 x 0.26 GFLOP); on a GPU, ViT-L/16 at 384 px fits.
RISE_BUDGET = {"cpu": 2e11, "cuda": 2e14}
PREDICTED = "(predicted class)"
MAX_SIDE = 2048  # larger uploads are decoded reduced to this long side, and overlays drawn at it
MAX_PIXELS = 50_000_000  # larger uploads are refused before decoding (decompression bombs)
Box = tuple[int, int, int, int]


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 (fp16 on older GPUs) on CUDA, full precision on the CPU."""
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast("cuda", dtype=dtype)
    return nullcontext()


@dataclass
class Analysis:
    """An upload and the model's forward pass on it."""

    model: VisionTransformer
    shown: Image.Image  # the upload, upright RGB, downscaled to MAX_SIDE: what overlays are drawn on
    size: tuple[int, int]  # the upload's own (width, height): API coordinates are in these pixels
    crop: tuple[float, float, float, float]  # region the model saw, in the upload's pixels
    x: torch.Tensor  # (1, C, H, W) model input, CPU
    probs: torch.Tensor  # (num_classes,) float32, CPU: mean of the image's and its mirror's (mirror_mean)
    attentions: list[torch.Tensor]  # per block (1, heads, T, T) float32, CPU
    gradient: dict[int, torch.Tensor] = field(default_factory=dict)  # gradient rollout map per target class
    rise: dict[int, torch.Tensor] = field(default_factory=dict)  # RISE map per target class

    @property
    def box(self) -> Box:
        """The region the model saw, in ``shown``'s pixels."""
        s = self.shown.width / self.size[0]
        return tuple(round(v * s) for v in self.crop)  # type: ignore[return-value]

    @property
    def names(self) -> list[str]:
        return self.model.class_names

    @property
    def grid(self) -> tuple[int, int]:
        stride = self.model.config.feature_stride
        return -(-self.x.shape[-2] // stride), -(-self.x.shape[-1] // stride)

    def nbytes(self) -> int:
        tensors = [self.x, self.probs, *self.attentions, *self.gradient.values(), *self.rise.values()]
        return sum(t.numel() * t.element_size() for t in tensors) + 4 * self.shown.width * self.shown.height  # RGBX


class _Replay(nn.Module):
    """Stands in for the model in ``vit_core.explain``: its forward returns the cached logits and attentions
    instead of running the network, so the library's maps run on a forward pass computed once."""

    def __init__(self, a: Analysis) -> None:
        super().__init__()
        self.model, self._a = a.model, a
        self.num_prefix_tokens = a.model.num_prefix_tokens

    @property
    def config(self):
        return self.model.config

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.blocks

    def forward(self, images: torch.Tensor, return_attention: bool = False):
        logits = self._a.probs.log()[None]  # same argmax and softmax as the logits
        return (logits, self._a.attentions) if return_attention else logits


class AnalysisCache:
    """Recent analyses, least recently used dropped first, bounded in count and bytes; thread-safe."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 128 << 20) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._items: OrderedDict[tuple[str, str], Analysis] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_compute(self, key: tuple[str, str], compute: Callable[[], Analysis]) -> Analysis:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        a = compute()  # outside the lock: other requests go on meanwhile (a duplicate is harmless)
        with self._lock:
            self._items[key] = a
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries or (
                len(self._items) > 1 and sum(v.nbytes() for v in self._items.values()) > self.max_bytes
            ):
                self._items.popitem(last=False)
        return a


ANALYSES = AnalysisCache()


def mirror_mean(logits: torch.Tensor, mirrored: torch.Tensor) -> torch.Tensor:
    """Class probabilities (B, classes) as ``train eval --tta flip`` computes them: the mean of the softmax
    of the image and of its mirror. Cheap (one more forward pass, no attentions kept), and right more
    often: +0.87 points on the 10,000 CIFAR-10 test images for the bundled model."""
    return (logits.float().softmax(-1) + mirrored.float().softmax(-1)) / 2


def _digest(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except (OSError, TypeError):
        return None  # load_image will say what is wrong with it


def needed_side(transform: ImageTransform) -> int:
    """The short side a source image needs so that ``transform``'s eval resize does not enlarge it (the
    resize's target, ``input size / crop_pct``): what a large upload is decoded down to, at the least."""
    return math.ceil(max(transform.size) / transform.crop_pct)


def analyse(
    model: VisionTransformer, transform: ImageTransform, model_key: str, path: str, device: torch.device
) -> Analysis:
    """The cached analysis of the image file at ``path`` by ``model``, computing it on a miss. The upload is
    decoded reduced (``load_image`` with ``MAX_SIDE``, and ``needed_side`` for the model), never at full size
    where its format allows; API coordinates stay in the upload's own pixels.

    Raises ``vit_core.data.ImageDataError`` for files that are not safe, readable images."""

    def compute() -> Analysis:
        size = read_header(path, MAX_PIXELS).size
        img = load_image(path, MAX_PIXELS, MAX_SIDE, needed_side(transform))  # reduced: never held at full size
        if (img.width < img.height) != (size[0] < size[1]):  # a PNG whose EXIF rotation came after its pixels
            size = size[::-1]
        x = transform(img).unsqueeze(0)
        shown = img if img.mode == "RGB" else img.convert("RGB")
        if max(shown.size) > MAX_SIDE:  # an extreme aspect ratio, kept larger for the model's short side
            shown.thumbnail((MAX_SIDE, MAX_SIDE))
        with torch.no_grad(), autocast(device):
            logits, attentions = model(x.to(device), return_attention=True)
            mirrored = model(x.to(device).flip(-1))
        return Analysis(
            model=model,
            shown=shown,
            size=size,
            crop=tuple(transform.crop_box(*size)),
            x=x,
            probs=mirror_mean(logits, mirrored)[0].cpu(),
            attentions=[a.float().cpu() for a in attentions],
        )

    digest = _digest(path)
    if digest is None:
        return compute()
    return ANALYSES.get_or_compute((model_key, digest), compute)


# ---------------------------------------------------------------------------------------- settings


def rise_flops(model: VisionTransformer) -> int:
    """What one RISE map costs: ``explain.RISE_MASKS`` forward passes of the model."""
    return explain.RISE_MASKS * forward_flops(model.config)


def rise_affordable(model: VisionTransformer, device: torch.device) -> bool:
    return rise_flops(model) <= RISE_BUDGET.get(device.type, RISE_BUDGET["cpu"])


def default_method(model: VisionTransformer, device: torch.device) -> str:
    """RISE where it fits the budget: of the maps that beat the centre-Gaussian baseline on the bundled model it
    beats it by the most (``bench/results/explain_cifar10_hybrid_pool.md``); else gradient rollout, one
    backward pass, which beats it by less."""
    return RISE if rise_affordable(model, device) else GRADIENT


@dataclass(frozen=True)
class Settings:
    """What a map is drawn with, checked against the model: requests are untrusted."""

    method: str = RISE
    target: int | None = None  # class index; None: the predicted class
    layer: int = -1  # raw attention's block, negative from the end
    head: int | None = None  # None: mean over heads
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    opacity: float = 0.5


def _integer(value: object, what: str) -> int:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a whole number, got {value!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    return int(f)


def check_layer(model: VisionTransformer, layer: object) -> int:
    depth = model.config.depth
    i = _integer(layer, "layer")
    if not -depth <= i < depth:
        raise ValueError(f"layer must be in {-depth}..{depth - 1} for this {depth}-layer model, got {layer!r}")
    return i % depth


def check_head(model: VisionTransformer, head: object) -> int | None:
    if head in (None, "", "mean"):
        return None
    heads = model.config.num_heads
    i = _integer(head, "head")
    if not 0 <= i < heads:
        raise ValueError(f"head must be 'mean' or 0..{heads - 1}, got {head!r}")
    return i


def check_target(model: VisionTransformer, target: object) -> int | None:
    if target in (None, "", PREDICTED):
        return None
    names = model.class_names
    if target not in names:
        raise ValueError(f"{target!r} is not a class of this model; choose one of {', '.join(names[:20])}...")
    return names.index(target)  # type: ignore[arg-type]


def check_top_k(top_k: object, num_classes: int) -> int:
    """How many classes to list: at least 1, at most the model's classes."""
    k = _integer(top_k, "top-k")
    if k < 1:
        raise ValueError(f"top-k must be at least 1, got {top_k!r}")
    return min(k, num_classes)


def _unit(value: object, what: str, hi: float) -> float:
    try:
        f = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not 0.0 <= f <= hi:
        raise ValueError(f"{what} must be in [0, {hi}], got {value!r}")
    return f


def parse_settings(
    model: VisionTransformer,
    method: str = METHODS[0],
    target: str | None = PREDICTED,
    layer: object = -1,
    head: object = "mean",
    head_fusion: str = "mean",
    discard_ratio: object = 0.0,
    opacity: object = 0.5,
) -> Settings:
    """Settings from a request's raw values; ``ValueError`` naming the bad one and the valid range."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if head_fusion not in explain.HEAD_FUSIONS:
        raise ValueError(f"head fusion must be one of {', '.join(explain.HEAD_FUSIONS)}, got {head_fusion!r}")
    return Settings(
        method=method,
        target=check_target(model, target),
        layer=check_layer(model, layer),
        head=check_head(model, head),
        head_fusion=head_fusion,
        discard_ratio=_unit(discard_ratio, "discard ratio", 0.99),
        opacity=_unit(opacity, "opacity", 1.0),
    )


# -------------------------------------------------------------------------------------------- maps


def explained_class(a: Analysis, s: Settings) -> int:
    """The class a map is for: the chosen target, else the prediction."""
    return int(a.probs.argmax()) if s.target is None else s.target


def gradient_map(a: Analysis, target: int, device: torch.device) -> torch.Tensor:
    """Gradient rollout needs a backward pass through the real model: once per class, then cached."""
    if target not in a.gradient:
        with autocast(device):
            heat = explain.gradient_rollout(a.model, a.x.to(device), target=target)
        a.gradient[target] = heat[0].float().cpu()
    return a.gradient[target]


def rise_map(
    a: Analysis, target: int, device: torch.device, progress: Callable[[float, str], None] | None = None
) -> torch.Tensor:
    """RISE runs ``explain.RISE_MASKS`` forward passes of the real model: refused over ``RISE_BUDGET``
    (requests are untrusted), computed once per class, then cached."""
    if not rise_affordable(a.model, device):
        gflop = rise_flops(a.model) / 1e9
        raise ValueError(
            f"RISE needs {explain.RISE_MASKS} forward passes of this model ({gflop:,.0f} GFLOP), more than this "
            f"server allows on its {device.type.upper()}; choose {GRADIENT} or {ROLLOUT}"
        )
    if target not in a.rise:
        report = None if progress is None else (lambda done, total: progress(done / total, "RISE: masked images"))
        with autocast(device):
            heat = explain.rise(a.model, a.x.to(device), target=target, progress=report)
        a.rise[target] = heat[0].float().cpu()
    return a.rise[target]


def relevance(
    a: Analysis, s: Settings, device: torch.device, progress: Callable[[float, str], None] | None = None
) -> torch.Tensor:
    """The map of ``s.method`` for the image: (grid_h, grid_w), or (H, W) for RISE."""
    if s.method == RISE:
        return rise_map(a, explained_class(a, s), device, progress)
    if s.method == GRADIENT:
        return gradient_map(a, explained_class(a, s), device)
    replay = _Replay(a)
    if s.method == RAW:
        return explain.attention_maps(replay, a.x, layer=s.layer, head=s.head)[0]
    return explain.attention_rollout(replay, a.x, head_fusion=s.head_fusion, discard_ratio=s.discard_ratio)[0]


# ------------------------------------------------------------------------------------------ compare

COMPARE_STEPS = 16  # deletion/insertion curve points: 2 x 17 forward passes per map, batched
CENTRE = "Centre Gaussian (baseline: ignores the image)"


def compare(
    a: Analysis, s: Settings, device: torch.device, progress: Callable[[float, str], None]
) -> list[tuple[str, torch.Tensor, float, float]]:
    """Each method's map for the explained class, and how faithful it is on this image: deletion AUC (lower
    is better) and insertion AUC (higher is better), ``explain.deletion_insertion_auc``. The centre-Gaussian
    map ignores the image: a method that does no better than it says little about this image. RISE is left
    out where it is over ``RISE_BUDGET``."""
    methods = [m for m in METHODS if m != RISE or rise_affordable(a.model, device)]
    maps = {m: relevance(a, replace(s, method=m), device, progress) for m in methods}
    maps[CENTRE] = explain.centre_gaussian_map(a.model, a.x)[0]
    target = explained_class(a, s)
    x = a.x.to(device)
    scored = []
    for i, (name, heat) in enumerate(maps.items()):
        progress(i / len(maps), f"Deleting and inserting pixels in the order of: {name}")
        with autocast(device):
            auc = explain.deletion_insertion_auc(
                a.model, x, lambda m, imgs, h=heat: h[None].to(imgs.device), target=target, steps=COMPARE_STEPS
            )
        scored.append((name, heat, float(auc["deletion"][0]), float(auc["insertion"][0])))
    return scored
