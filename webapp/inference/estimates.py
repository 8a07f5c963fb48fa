"""What a request will cost in memory, estimated before it runs, from its arguments: the image's header and
the model's config, nothing decoded (``webapp.server.admission.Gate`` admits it when it fits). These are the parts;
each tab's ``estimate`` (``webapp.tabs``) adds up its own, and hands it to the gate with its handler
(``webapp.ui.endpoints.Context.handler``).

**The estimate**, in bytes above the idle RSS: ``REQUEST_BYTES + upload + max(decoding, after)``, the upload
read once into memory (``analysis.Upload``), then decoded (and its full-size pixels freed) before the model
runs and the pictures are drawn. Each part was measured on the bundled model and a ViT-B/16 on a CPU;
``tests/test_app.py`` checks that the estimate bounds the peak of real requests.

=====================  ===========================================================================================
``REQUEST_BYTES``      Gradio's side of any request (receiving the upload, the response), and a margin
upload                 the file's bytes, read once
decoding               ``ImageHeader.decode_bytes`` at ``MAX_SIDE``: 4 bytes a decoded pixel for colour (1 for
                       gray, 16 for WebP...); JPEG decodes at 1/2, 1/4 or 1/8 scale, other formats at full size;
                       then the reduced copies, 28 bytes a pixel of the result (Batch: one image at a time, at
                       most its ``MAX_DECODE_BYTES``)
after                  the reduced image (4 bytes a pixel), the tab's pictures (its draw bytes a pixel of it) and
                       the model
the model (CPU only)   ``vit_core.models.cost.activation_bytes`` per image of a forward pass, times the images of the
                       largest batch the tab runs (RISE: 64 masked images; Compare: every map, then its curves'
                       steps; Batch: a chunk), a backward pass (gradient rollout, AttnLRP) ``BACKWARD`` times a
                       forward pass, and RISE's masks; on a GPU the model's memory is the GPU's, not counted here
=====================  ===========================================================================================
"""

from __future__ import annotations

from vit_core import ViTConfig, methods
from vit_core.data import ImageHeader, ImageTransform
from vit_core.data.images import target_size
from vit_core.models.cost import forward_bytes

from ..resources import MB
from .analysis import MAX_SIDE, needed_side

REQUEST_BYTES = 48 * MB  # Gradio's side of a request, and a margin
BACKWARD = 6  # forward and backward passes (gradient rollout) keep this many forward passes' activations
BATCH_IMAGES = 64  # RISE's and deletion/insertion's batches of masked images (``explain``'s batch_size)


def map_bytes(cfg: ViTConfig, method: methods.Method) -> int:
    """What drawing one ``method`` map adds to the analysis's forward passes: a method of many forward passes
    (RISE) runs them ``BATCH_IMAGES`` masked images at a time and keeps its masks; one with a backward pass
    keeps ``BACKWARD`` forward passes' activations; one drawn from the cached attentions adds nothing."""
    h, w = cfg.img_hw
    if method.cost.forward:
        return forward_bytes(cfg, BATCH_IMAGES, attention=False) + 4 * method.cost.forward * h * w
    return BACKWARD * forward_bytes(cfg, 1) if method.cost.backward else 0


def analysis_bytes(cfg: ViTConfig) -> int:
    """The model's part of an analysis (``analysis.analyse``): the first view with its attentions, then the
    other without."""
    return forward_bytes(cfg, 1) + forward_bytes(cfg, 1, attention=False)


def image_bytes(header: ImageHeader | None, transform: ImageTransform | None, draw: int, model: int = 0) -> int:
    """``max(decoding, after)`` of the module's docstring: decoding the upload, or what follows it (the
    reduced image, the tab's pictures, ``draw`` bytes a pixel of it, and ``model`` bytes); without a readable
    header (the request then fails before decoding) just ``model``."""
    if header is None:
        return model
    need = needed_side(transform) if transform is not None else 0
    w, h = target_size(header.size, MAX_SIDE, need)
    shown = min(w * h, MAX_SIDE * MAX_SIDE)
    return max(header.decode_bytes(MAX_SIDE, need), (4 + draw) * shown + model)


def image_request(
    declared: tuple[ImageHeader | None, int], transform: ImageTransform | None, draw: int, model: int
) -> int:
    """A request about one uploaded image, from what it declares (``analysis.declared``: its header, None when
    unreadable, and its size in bytes): ``REQUEST_BYTES``, the upload read once, then ``image_bytes`` (``draw``
    bytes a pixel for the tab's pictures, ``model`` for the model)."""
    header, size = declared
    return REQUEST_BYTES + size + image_bytes(header, transform, draw, model)


def request_only(ctx: object, request: object) -> int:
    """Listeners that compute nothing large themselves (the model picker waits for a load, which its own limits
    bound: ``--max-model-mb``, ``--max-loaded-mb``)."""
    return REQUEST_BYTES
