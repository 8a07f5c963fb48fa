"""Images in, model-ready tensors out: safe image loading, timm's preprocessing, datasets, batches.

Everything a model sees goes through ``build_transform(model.pretrained_cfg, train=...)``, so training,
evaluation and the app resize, crop and normalise the same way (timm's ``pretrained_cfg``: input_size, mean,
std, interpolation, crop_pct). The app opens user files with ``load_image`` (``images.py``), which refuses
bombs and corrupt files with an ``ImageDataError`` and returns an upright "RGB" or "L" image, decoded reduced
when asked (``max_side``); ``read_header`` says what decoding one costs before any pixel is decoded, and
``open_image`` does both from one opening (its ``ImageFile``'s ``header``, then ``decode``).

Datasets (``build_dataset(spec, split)``, ``datasets.py``) yield ``(image, label)`` and carry ``.classes``
(label names) and ``.targets`` (int64 tensor):

- ``"mnist"``, ``"fashion-mnist"``, ``"cifar10"``: the official IDX files / the CIFAR-10 npz shards under
  ``root`` (default ``default_data_root()``; downloaded there on first use, ``downloads.py``), decoded once
  into ``.images``, a uint8 (N, C, H, W) tensor
  (``InMemoryImageDataset``; ``.subset(indices)`` carves out a validation split that stays fast).
- a folder holding those formats' files (IDX files, CIFAR npz shards): recognised by the file names.
- any other folder: class per sub-folder, as torchvision's ``ImageFolder``; a folder holding ``train/`` and
  ``val/`` (or ``validation/``, ``test/``) is split that way, as timm does. Images decode on access. A
  sub-folder ``_other`` holds photos of none of the classes (``other_photos``), not a class.
- ``"hf:<name>"``: a Hugging Face ``datasets`` dataset (optional package, needs the Hub or its cache).

Transforms (``transforms.py``) take a PIL image, a uint8 (C, H, W) tensor or a uint8 (B, C, H, W) batch on
any device, and return normalised float32 of the same rank. So for the in-memory datasets the whole
pipeline is one tensor op per batch, with no PIL, no DataLoader and no per-sample Python (the fast path,
as ``Batches`` (``batches.py``) runs it for training and evaluation)::

    train_set = build_dataset("cifar10", "train", transform=build_transform(cfg, train=True, augment=aug))
    tf = train_set.transform
    if isinstance(train_set, InMemoryImageDataset) and not tf.needs_pil:  # no RandAugment
        images, targets = train_set.images.to(device), train_set.targets.to(device)  # once
        for idx in torch.randperm(len(train_set), device=device).split(batch_size):
            x, y = tf(images[idx]), targets[idx]  # (B, C, H, W) float32 on the device, (B,) int64
    else:  # folders, Hugging Face, RandAugment: per-sample transforms in DataLoader workers
        loader = DataLoader(train_set, batch_size, shuffle=True, num_workers=workers)

Randomness: crop offsets and flips draw from torch's global RNG; timm's RandomResizedCrop, RandAugment
and RandomErasing from Python's ``random`` (RandAugment also numpy's, erasing noise torch's). Seed all three
for a reproducible run; DataLoader workers are seeded by torch.
"""

from .batches import Batches, class_subset, fixed_subset, index_subset, stratified_split, with_transform
from .datasets import (
    HFImageDataset,
    ImageFolderDataset,
    InMemoryImageDataset,
    build_dataset,
    decode_all,
    default_data_root,
    other_photos,
)
from .images import (
    ImageDataError,
    ImageFile,
    ImageHeader,
    TooManyPixelsError,
    load_image,
    match_channels,
    open_image,
    read_header,
    to_model_mode,
)
from .transforms import AUGMENT_DEFAULTS, ImageTransform, build_mixup, build_transform, check_augment, storage_transform

__all__ = [
    "AUGMENT_DEFAULTS",
    "Batches",
    "HFImageDataset",
    "ImageDataError",
    "ImageFile",
    "ImageFolderDataset",
    "ImageHeader",
    "ImageTransform",
    "InMemoryImageDataset",
    "TooManyPixelsError",
    "build_dataset",
    "build_mixup",
    "build_transform",
    "check_augment",
    "class_subset",
    "decode_all",
    "default_data_root",
    "fixed_subset",
    "index_subset",
    "load_image",
    "match_channels",
    "open_image",
    "other_photos",
    "read_header",
    "storage_transform",
    "stratified_split",
    "to_model_mode",
    "with_transform",
]
