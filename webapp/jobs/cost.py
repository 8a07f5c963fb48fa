"""What a Train tab job costs in memory: its training process's peak RSS, reserved in the memory gate
(``webapp.server.admission.Gate``) before the process starts, from the zip's declared photos and the model's config.

**The Train tab** (``training_bytes``) reserves its training process's peak RSS (``webapp.jobs.worker``: it
reports it, ``peak_bytes``), measured with ``python -m bench.train_memory`` (``bench/results/train_memory.txt``)
on the largest jobs the public limits allow: the process's start with the model's code (``WORKER_BYTES``), then
the larger of decoding the photos (the costliest one, ``DECODE_BYTES``: the process hands decoding's freed pages
back before the model comes) and training: the model's weights in their four copies, the photos held decoded,
and the larger of a training step's activations and the largest pass without gradients (calibration's batches of
``INFER_BATCH``).
"""

from __future__ import annotations

import math

from vit_core import ViTConfig
from vit_core.data import ImageHeader

from ..inference.estimates import forward_bytes
from ..resources import MB
from .trainset import MAX_PHOTO_PIXELS, MAX_STORED_SIDE

# The training process (``training_bytes``), measured with ``python -m bench.train_memory`` on 2 CPU threads
# (bench/results/train_memory.txt): 920 MB peak for the bundled model on 16 photos (its imports alone: about 780 MB),
# 1,588 MB on 2,000 photos, the whole model fine-tuned (calibration's batches of 500: 1.34 MB an image), 5,050 MB
# for ViT-B/16 on 40 (a training step of 32 images).
WORKER_BYTES = 1024 * MB  # python, torch and vit_core imported, the model's code (the 16-photo job peaked at 920 MB)
TRAIN_BATCH = 32  # vit_core.finetune.FINETUNE_RECIPE's batch
INFER_BATCH = 500  # ``evaluation.calibrate_model``'s batch: the largest pass without gradients (the engine's: 256)
TRAIN_PASSES = 3.5  # a training step's activations in forward passes of ``forward_bytes`` (ViT-B/16: 2.8 measured)
# a pass without gradients, an image: ``forward_bytes`` and a stem's largest map before its pooling twice, which
# measured 1.34 MB (bundled, 32 px; 1.32 estimated), 3.5 (64 px; 6.8) and 10.1 (ViT-B/16, a pass alone; 11.6): x 1.25
INFER_MARGIN = 1.25
WEIGHT_COPIES = 4  # fp32 weights, their gradients, SGD's momentum, and bf16 copies under autocast (half) with the
# run's exported model (half)
STORED_SIDE = 1.15  # photos are held at the eval transform's resize: at most the input size / crop_pct (0.875)
# decoding the costliest photo: WebP (its own buffer, copied, converted) or 16-bit gray (through float64)
DECODE_BYTES = max(
    ImageHeader((MAX_PHOTO_PIXELS // 5000, 5000), fmt, mode).decode_bytes(MAX_STORED_SIDE)
    for fmt, mode in (("WEBP", "RGBA"), ("PNG", "I;16"))
)


def training_bytes(cfg: ViTConfig, params: int, images: int) -> int:
    """The training process's peak RSS for ``images`` photos on a model of ``cfg`` with ``params`` parameters
    (``cfg`` at the input size it trains at), whatever strategy it chooses (see the module's docstring)."""
    side_h, side_w = (math.ceil(STORED_SIDE * s) for s in cfg.img_hw)
    stored = 2 * images * 3 * side_h * side_w  # uint8, and a second copy while they are stacked into one tensor
    train = TRAIN_PASSES * forward_bytes(cfg, TRAIN_BATCH)
    per_image = forward_bytes(cfg, 1, attention=False) + 2 * stem_map_bytes(cfg)
    infer = INFER_MARGIN * min(images, INFER_BATCH) * per_image
    return WORKER_BYTES + int(max(DECODE_BYTES, WEIGHT_COPIES * 4 * params + stored + max(train, infer)))


def stem_map_bytes(cfg: ViTConfig) -> int:
    """The largest map of a convolutional stem (``stem_channels``) before its pooling, float32; 0 without one
    (``activation_bytes`` counts a stem's maps after their pooling)."""
    if not cfg.stem_channels:
        return 0
    (h, w), scale, largest = cfg.img_hw, 1, 0
    pools = cfg.stem_pools or (1,) * len(cfg.stem_channels)
    for channels, stride, pool in zip(cfg.stem_channels, cfg.stem_strides, pools, strict=True):
        scale *= stride
        largest = max(largest, channels * -(-h // scale) * -(-w // scale))
        scale *= pool
    return 4 * largest
