"""What a request will cost in memory, estimated before it runs, from its arguments: the image's header and
the model's config, nothing decoded (``webapp.admission.Gate`` admits it when it fits).

**The estimate**, in bytes above the idle RSS: ``REQUEST_BYTES + max(decoding, after)``, the upload being
decoded (and its full-size pixels freed) before the model runs and the pictures are drawn. Each part was
measured on the bundled model and a ViT-B/16 on a CPU; ``tests/test_app.py`` checks that the estimate
bounds the peak of real requests.

=====================  ===========================================================================================
``REQUEST_BYTES``      Gradio's side of any request (reading the upload, the response), and a margin
decoding               ``ImageHeader.decode_bytes`` at ``MAX_SIDE``: 4 bytes a decoded pixel for colour (1 for
                       gray, 16 for WebP...); JPEG decodes at 1/2, 1/4 or 1/8 scale, other formats at full size;
                       then the reduced copies, 28 bytes a pixel of the result (Batch: one image at a time, at
                       most ``batch.MAX_DECODE_BYTES``)
after                  the reduced image (4 bytes a pixel), the endpoint's pictures (``DRAW_BYTES`` a pixel of
                       it) and the model
the model (CPU only)   ``vit_core.model.activation_bytes`` per image of a forward pass, times the images of the
                       largest batch the endpoint runs (RISE: 64 masked images; Compare: every map, then
                       ``COMPARE_STEPS + 1`` images per curve; Batch: ``batch.chunk_size``), a backward pass
                       (gradient rollout) ``BACKWARD`` times a forward pass, and RISE's masks; on a GPU the
                       model's memory is the GPU's, not counted here
=====================  ===========================================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vit_core import ViTConfig, methods
from vit_core.cost import activation_bytes
from vit_core.data import ImageDataError, ImageHeader, ImageTransform, read_header
from vit_core.data.images import target_size

from . import batch
from .admission import MB
from .analysis import MAX_PIXELS, MAX_SIDE, needed_side
from .comparison import COMPARE_STEPS
from .settings import DEFAULT_METHOD, affordable

REQUEST_BYTES = 48 * MB  # Gradio's side of a request, and a margin
# Drawing, per pixel of the reduced image: the overlay at its size and its encoding (classify), the explorer's
# 720-pixel view, 320-pixel crops (a patch; compare's five maps). Measured 23, 2, 5 and 19.
DRAW_BYTES = {"classify": 36, "view": 4, "explore": 8, "compare": 24}
BACKWARD = 6  # forward and backward passes (gradient rollout) keep this many forward passes' activations
BATCH_IMAGES = 64  # RISE's and deletion/insertion's batches of masked images (``explain``'s batch_size)
INSPECT_BYTES = 64 * MB  # the Inspect tab's matplotlib figures


def forward_bytes(cfg: ViTConfig, images: int, attention: bool = True) -> int:
    """Activation memory of a forward pass of ``images`` images: ``activation_bytes`` each, less the stored
    attention probabilities when they are not returned."""
    per_image = activation_bytes(cfg)
    if not attention:
        tokens = cfg.num_prefix_tokens + math.prod(cfg.grid_size)
        per_image -= 4 * cfg.depth * cfg.num_heads * tokens * tokens
    return images * per_image


def map_bytes(cfg: ViTConfig, method: methods.Method) -> int:
    """What drawing one ``method`` map adds to the analysis's forward passes: a method of many forward passes
    (RISE) runs them ``BATCH_IMAGES`` masked images at a time and keeps its masks; one with a backward pass
    keeps ``BACKWARD`` forward passes' activations; one drawn from the cached attentions adds nothing."""
    h, w = cfg.img_hw
    if method.cost.forward:
        return forward_bytes(cfg, BATCH_IMAGES, attention=False) + 4 * method.cost.forward * h * w
    return BACKWARD * forward_bytes(cfg, 1) if method.cost.backward else 0


def model_bytes(cfg: ViTConfig, work: str, method: methods.Method | None, device: torch.device, images: int = 1) -> int:
    """The model's part of a request's estimate (zero on a GPU: that memory is the GPU's). ``method``: the map
    asked for (Classify, Batch); Compare draws every method this server runs for the model (``affordable``);
    ``images``: how many the Inspect tab runs."""
    if device.type != "cpu":
        return 0
    analysis = forward_bytes(cfg, 1) + forward_bytes(cfg, 1, attention=False)  # the first view, then each other
    if work == "batch" and method is not None:
        factor = BACKWARD if method.cost.backward else 2
        return factor * forward_bytes(cfg, batch.chunk_size(method))
    if work == "inspect":
        return forward_bytes(cfg, images) + INSPECT_BYTES
    if work == "compare":  # every map, then the deletion and insertion curves, a batch of steps + 1 each
        curves = forward_bytes(cfg, COMPARE_STEPS + 1, attention=False)
        runs = [m for m in methods.METHODS if affordable(m, cfg, device)]
        return analysis + sum(map_bytes(cfg, m) for m in runs) + curves
    if work == "classify" and method is not None:
        return analysis + map_bytes(cfg, method)
    return analysis


def image_bytes(header: ImageHeader | None, transform: ImageTransform | None, work: str, model: int = 0) -> int:
    """``max(decoding, after)`` of the module's docstring: decoding the upload, or what follows it (the
    reduced image, the endpoint's pictures and ``model`` bytes); without a readable header (the request then
    fails before decoding) just ``model``."""
    if header is None:
        return model
    need = needed_side(transform) if transform is not None else 0
    w, h = target_size(header.size, MAX_SIDE, need)
    shown = min(w * h, MAX_SIDE * MAX_SIDE)
    return max(header.decode_bytes(MAX_SIDE, need), (4 + DRAW_BYTES[work]) * shown + model)


@dataclass(frozen=True)
class Costs:
    """The estimate of each kind of request, from its arguments. ``loaded(choice)`` gives the model and its
    transform if it is loaded now (``Models.loaded``); else None, and the estimate leaves the model out: the
    request then waits a second for the load and most often answers "still loading"."""

    loaded: Callable[[str], tuple[Any, ImageTransform] | None]
    device: Callable[[], torch.device]
    examples: int  # images the Inspect tab runs through the model

    def of(self, work: str) -> Callable[[dict[str, Any]], int]:
        """The estimate of a kind of request (``webapp.ui.context.Context.admitted``)."""
        named = {"batch": self.batch, "inspect": self.inspect, "load": self.small}
        return named[work] if work in named else self.image(work)

    def _model(self, arguments: dict[str, Any]) -> tuple[Any, ImageTransform | None]:
        choice = arguments.get("model_choice")
        got = self.loaded(choice) if isinstance(choice, str) else None
        return got if got is not None else (None, None)

    def image(self, work: str) -> Callable[[dict[str, Any]], int]:
        """Classify (and its live re-render), the explorer's view, a patch, or Compare."""

        def cost(arguments: dict[str, Any]) -> int:
            model, transform = self._model(arguments)
            try:
                header = read_header(arguments["image"], MAX_PIXELS) if arguments.get("image") else None
            except ImageDataError:
                header = None
            work_bytes = 0
            if model is not None:
                device = self.device()
                method = _method(arguments) or DEFAULT_METHOD
                work_bytes = model_bytes(model.config, work, method, device)
            return REQUEST_BYTES + image_bytes(header, transform, work, work_bytes)

        return cost

    def batch(self, arguments: dict[str, Any]) -> int:
        """Batch: one image decoded at a time (at most ``batch.MAX_DECODE_BYTES``), the gallery's overlays,
        one chunk through the model."""
        model, _ = self._model(arguments)
        gallery = batch.MAX_IMAGES * 4 * batch.THUMB * batch.THUMB
        method = _method(arguments) or batch.batchable()[0]
        work = 0 if model is None else model_bytes(model.config, "batch", method, self.device())
        return REQUEST_BYTES + batch.MAX_DECODE_BYTES + gallery + work

    def inspect(self, arguments: dict[str, Any]) -> int:
        model, _ = self._model(arguments)
        work = 0 if model is None else model_bytes(model.config, "inspect", None, self.device(), images=self.examples)
        return REQUEST_BYTES + work

    @staticmethod
    def small(arguments: dict[str, Any]) -> int:
        """Listeners that compute nothing large themselves (the model picker waits for a load, which its
        own limits bound: ``--max-model-mb``, ``--max-loaded-mb``)."""
        return REQUEST_BYTES


def _method(arguments: dict[str, Any]) -> methods.Method | None:
    """The method a request names, or None (the default's, or a name the request's checks will refuse)."""
    try:
        return methods.by_title(arguments.get("method"))
    except ValueError:
        return None
