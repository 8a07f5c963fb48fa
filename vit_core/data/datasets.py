"""Datasets: MNIST / Fashion-MNIST / CIFAR-10 in memory, image folders, Hugging Face."""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from .downloads import fetch
from .images import ImageDataError, load_image
from .transforms import storage_transform

PROJECT_DATA = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data").resolve()


def default_data_root() -> Path:
    """Where the named datasets live (``<root>/mnist``, ...): ``$VIT_DATA`` if set; else ``../shared/data`` beside
    the project when there is one; else the user's cache, ``$XDG_CACHE_HOME/vit_core/data`` (by default
    ``~/.cache/vit_core/data``). ``build_dataset`` downloads a named dataset missing there."""
    env = os.environ.get("VIT_DATA")
    if env:
        return Path(env).expanduser()
    if PROJECT_DATA.is_dir():
        return PROJECT_DATA
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vit_core" / "data"


_FASHION_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
_CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff", ".webp", ".gif")


class InMemoryImageDataset(Dataset):
    """Decoded images held as one uint8 (N, C, H, W) tensor ``images`` with int64 ``targets``.

    ``dataset[i]`` is ``(transform(images[i]), label)``, or the raw uint8 image without a transform.
    """

    def __init__(
        self, images: torch.Tensor, targets: torch.Tensor, classes: list[str], transform: Callable | None = None
    ) -> None:
        self.images, self.targets, self.classes, self.transform = images, targets, classes, transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.images[i]
        return (self.transform(x) if self.transform else x), int(self.targets[i])

    def subset(self, indices: torch.Tensor | list[int]) -> InMemoryImageDataset:
        """The images at ``indices`` (e.g. a held-out validation split), still in memory and fast."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return InMemoryImageDataset(self.images[idx], self.targets[idx], self.classes, self.transform)


OTHER_FOLDER = "_other"  # a folder of photos of none of the classes, not a class (``other_photos``)


class ImageFolderDataset(Dataset):
    """torchvision's ImageFolder layout: ``root/<class>/**/<image>``, classes sorted by name; hidden folders and
    ``OTHER_FOLDER`` are not classes. ``classes``: the folders to read instead, in that order.

    Images are read with ``load_image`` on access; one that cannot be read raises ``ImageDataError`` naming
    the file. Without a transform an item is the image as a uint8 RGB (3, H, W) tensor.
    """

    def __init__(self, root: Path, transform: Callable | None = None, classes: list[str] | None = None) -> None:
        self.root, self.transform = root, transform
        folders = (d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        self.classes = classes or sorted(name for name in folders if name != OTHER_FOLDER)
        if not self.classes:
            raise ImageDataError(
                f"{root}: no class folders; expected {root}/<class name>/<image files>, or the MNIST-style IDX "
                "files (train-images-idx3-ubyte.gz ...) or CIFAR-10 npz shards (data_batch_1.npz ...) in it"
            )
        self.samples: list[tuple[Path, int]] = []
        empty = []
        for label, name in enumerate(self.classes):
            files = _image_files(root / name)
            empty += [] if files else [name]
            self.samples += [(p, label) for p in files]
        if empty:
            raise ImageDataError(
                f"{root}: class folder(s) without images: {', '.join(empty)}. Every class needs at least one "
                f"image ({', '.join(IMG_EXTENSIONS)}); remove the empty folders or add images."
            )
        self.targets = torch.tensor([label for _, label in self.samples], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        img = load_image(path)
        return (self.transform(img) if self.transform else TF.pil_to_tensor(img.convert("RGB"))), label


def _image_files(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively, following links as torchvision does), hidden ones skipped."""
    files = []
    for d, subdirs, names in os.walk(folder, followlinks=True):
        subdirs[:] = [s for s in subdirs if not s.startswith(".")]
        files += [Path(d) / f for f in names if f.lower().endswith(IMG_EXTENSIONS) and not f.startswith(".")]
    return sorted(files)


class HFImageDataset(Dataset):
    """A Hugging Face ``datasets`` split with one Image column and one ClassLabel column."""

    def __init__(self, hf_split: Any, name: str, transform: Callable | None = None) -> None:
        import datasets

        feats = hf_split.features
        images = [k for k, f in feats.items() if isinstance(f, datasets.Image)]
        labels = [k for k, f in feats.items() if isinstance(f, datasets.ClassLabel)]
        if not images or not labels:
            raise ImageDataError(
                f"hf:{name}: need an Image column and a ClassLabel column, found {dict(feats)}; "
                "this loader handles image classification datasets only"
            )
        self.data, self.name, self.transform = hf_split, name, transform
        self.image_key, self.label_key = images[0], labels[0]
        self.classes = list(feats[labels[0]].names)
        self.targets = torch.tensor(list(hf_split[labels[0]]), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        row = self.data[i]
        img = row[self.image_key]
        try:
            img = load_image(img if isinstance(img, Image.Image) else img["bytes"] or img["path"])
        except ImageDataError as e:
            raise ImageDataError(f"hf:{self.name} item {i}: {e}") from e
        x = self.transform(img) if self.transform else TF.pil_to_tensor(img.convert("RGB"))
        return x, int(row[self.label_key])


def decode_all(
    spec: str, split: str, pretrained_cfg: dict[str, Any], prepare: Callable[[Dataset], Dataset] = lambda d: d
) -> InMemoryImageDataset:
    """``build_dataset(spec, split)`` held in memory, without a transform: a folder's images are decoded once, each
    resized as the eval transform of ``pretrained_cfg`` resizes it, stopped before the crop
    (``storage_transform``), so that training batches are cut and augmented on the device and evaluating them
    sees the pixels the original images give. ``prepare``: what to do to the dataset before decoding (the
    recipe's subsets), so that only the images kept are decoded. The in-memory formats are returned as they are."""
    dataset = prepare(build_dataset(spec, split, transform=storage_transform(pretrained_cfg)))
    if isinstance(dataset, InMemoryImageDataset):
        return InMemoryImageDataset(dataset.images, dataset.targets, dataset.classes)
    images = [dataset[i][0] for i in tqdm(range(len(dataset)), desc=f"decoding {split} images", leave=False)]
    return InMemoryImageDataset(torch.stack(images), torch.as_tensor(dataset.targets), list(dataset.classes))


def build_dataset(spec: str, split: str, transform: Callable | None = None, root: str | Path | None = None) -> Dataset:
    """A classification dataset of ``(image tensor, int label)`` with ``.classes`` and ``.targets``.

    ``spec``: "mnist", "fashion-mnist", "cifar10" (files under ``root``, default ``default_data_root()``,
    downloaded there on first use: ``downloads.fetch``), a folder path, or "hf:<name>" (Hugging Face
    datasets). A folder holding MNIST-style IDX files or CIFAR-10 npz shards is read as those (in memory); any
    other folder is an ImageFolder, whose ``train/`` + ``val/``/``test/`` sub-folders are picked by ``split``.
    ``split``: "train" or "test" ("val" is an alias for the held-out split). ``transform``: usually
    ``build_transform(...)``; see the module docstring for the fast path.
    """
    if split not in ("train", "test", "val"):
        raise ValueError(f"split must be 'train', 'test' or 'val', got {split!r}")
    files_split = "train" if split == "train" else "test"
    key = spec.lower().replace("_", "-")
    if key in _BUILTIN:
        folder = (Path(root).expanduser() if root is not None else default_data_root()) / key
        fetch(key, folder, files_split)
        images, targets, classes = _BUILTIN[key](folder, files_split)
        return InMemoryImageDataset(images, targets, classes, transform)
    if spec.startswith("hf:"):
        return _hf_dataset(spec[3:], split, transform)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ImageDataError(
            f"data {spec!r}: {'not a folder' if path.exists() else 'no such folder'} ({path}). Use one of "
            f"{', '.join(_BUILTIN)}, a folder with one sub-folder of images per class, or hf:<dataset name>."
        )
    load = _files_loader(path)
    if load is not None:
        return InMemoryImageDataset(*load(path, files_split), transform)
    return ImageFolderDataset(_split_folder(path, split), transform)


def _files_loader(folder: Path) -> Callable[[Path, str], tuple[torch.Tensor, torch.Tensor, list[str]]] | None:
    """How to read a folder that holds one of the in-memory formats, recognised by its file names rather
    than by a dataset name: the IDX files of MNIST / Fashion-MNIST, or the CIFAR-10 npz shards. None for
    anything else."""
    names = {p.name for p in folder.iterdir() if p.is_file()}
    if any(f"{prefix}-images-idx3-ubyte{gz}" in names for prefix in ("train", "t10k") for gz in ("", ".gz")):
        return lambda f, split: _load_idx_pair(f, split, _idx_classes(f))
    if "test_batch.npz" in names or any(n.startswith("data_batch_") and n.endswith(".npz") for n in names):
        return _load_cifar10
    return None


def _idx_classes(folder: Path) -> list[str] | None:
    """Class names for IDX files, which hold none: ``meta.json``'s "classes" if there is one, Fashion-MNIST's
    for a folder named so, else None (the label numbers)."""
    meta = folder / "meta.json"
    if meta.is_file():
        return list(json.loads(meta.read_text())["classes"])
    return _FASHION_CLASSES if folder.name.lower().replace("_", "-") == "fashion-mnist" else None


def other_photos(spec: str | Path, transform: Callable | None = None) -> ImageFolderDataset | None:
    """The photos of none of the classes that a folder dataset's training split holds in ``OTHER_FOLDER``
    (``<data>/_other/`` or ``<data>/train/_other/``), all labelled 0; None when it holds none. The fine-tuning
    of a folder lets them choose its "none of my classes" score and threshold (``ood.choose_with_others``)."""
    path = Path(spec).expanduser()
    root = _split_folder(path, "train") if path.is_dir() else path
    if not (root / OTHER_FOLDER).is_dir() or not _image_files(root / OTHER_FOLDER):
        return None
    return ImageFolderDataset(root, transform, classes=[OTHER_FOLDER])


def _split_folder(path: Path, split: str) -> Path:
    """timm's layout: a root holding train/ and val/ (or validation/, test/) sub-folders; else the root."""
    names = ("test", "val", "validation") if split == "test" else ("val", "validation", "test")
    held_out = [path / n for n in names if (path / n).is_dir()]
    if not (path / "train").is_dir() or not held_out:
        return path
    return path / "train" if split == "train" else held_out[0]


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """An IDX file (LeCun's MNIST format, optionally gzipped): big-endian int32 magic, dims, then uint8."""
    if not path.is_file() and path.with_suffix("").is_file():
        path = path.with_suffix("")  # already gunzipped
    try:
        raw = path.read_bytes()
        raw = gzip.decompress(raw) if path.suffix == ".gz" else raw
    except FileNotFoundError as e:
        raise ImageDataError(
            f"{path} not found. Set the VIT_DATA environment variable to the folder holding "
            "mnist/, fashion-mnist/ and cifar10/"
        ) from e
    except (OSError, EOFError, zlib.error) as e:
        raise ImageDataError(f"{path}: cannot read or decompress ({e}); the download is corrupt") from e
    ndim = magic & 0xFF  # 2051 = 0x0803: uint8 (0x08), 3 dims; 2049 = 0x0801: 1 dim
    if len(raw) < 4 * (1 + ndim) or int.from_bytes(raw[:4], "big") != magic:
        found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
        raise ImageDataError(f"{path}: not an IDX file with magic number {magic} (found {found}); corrupt file")
    dims = [int(d) for d in np.frombuffer(raw, ">i4", count=ndim, offset=4)]
    if len(raw) != 4 * (1 + ndim) + math.prod(dims):
        raise ImageDataError(f"{path}: header declares {dims} but holds {len(raw) - 4 * (1 + ndim)} bytes; corrupt")
    return np.frombuffer(raw, np.uint8, offset=4 * (1 + ndim)).reshape(dims)


def _load_idx_pair(folder: Path, split: str, classes: list[str] | None) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``split``'s images and labels; ``classes`` None: named by their numbers, 0 to 9 (or the largest label)."""
    prefix = "train" if split == "train" else "t10k"
    x = _read_idx(folder / f"{prefix}-images-idx3-ubyte.gz", 2051)
    y = _read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", 2049)
    if classes is None:
        classes = [str(i) for i in range(max(10, int(y.max(initial=0)) + 1))]
    if len(x) != len(y) or y.max(initial=0) >= len(classes):
        raise ImageDataError(f"{folder}: {len(x)} images but {len(y)} labels (max {y.max()}); corrupt files")
    return torch.from_numpy(x.copy()).unsqueeze(1), torch.from_numpy(y.astype(np.int64)), classes


def _load_cifar10(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    names = [f"data_batch_{i}.npz" for i in range(1, 6)] if split == "train" else ["test_batch.npz"]
    xs, ys = [], []
    for name in names:
        path = folder / name
        if not path.is_file():
            raise ImageDataError(
                f"{path} not found. Set the VIT_DATA environment variable to the folder holding "
                "cifar10/ with data_batch_1..5.npz and test_batch.npz"
            )
        try:
            with np.load(path, allow_pickle=False) as shard:
                x, y = shard["x"], shard["y"]
        except Exception as e:
            raise ImageDataError(f"{path}: not a readable npz with arrays x and y ({e}); corrupt file") from e
        if x.dtype != np.uint8 or x.shape[1:] != (32, 32, 3) or y.shape != (len(x),) or y.max(initial=0) > 9:
            raise ImageDataError(f"{path}: expected x uint8 (N, 32, 32, 3) and y (N,) in 0..9, got {x.shape} {y.shape}")
        xs.append(x)
        ys.append(y)
    meta = folder / "meta.json"
    classes = json.loads(meta.read_text())["classes"] if meta.is_file() else _CIFAR10_CLASSES
    images = torch.from_numpy(np.concatenate(xs)).permute(0, 3, 1, 2).contiguous()  # HWC -> CHW
    return images, torch.from_numpy(np.concatenate(ys).astype(np.int64)), list(classes)


_BUILTIN = {
    "mnist": lambda folder, split: _load_idx_pair(folder, split, None),
    "fashion-mnist": lambda folder, split: _load_idx_pair(folder, split, _FASHION_CLASSES),
    "cifar10": _load_cifar10,
}


_HF_SPLITS = {"train": ("train",), "test": ("test", "validation", "val"), "val": ("validation", "val", "test")}


def _hf_dataset(name: str, split: str, transform: Callable | None) -> HFImageDataset:
    try:
        import datasets
    except ImportError as e:
        raise ImageDataError(f"hf:{name} needs the Hugging Face datasets package: pip install datasets") from e
    try:
        splits = datasets.load_dataset(name)
    except Exception as e:
        raise ImageDataError(
            f"hf:{name}: could not load the dataset ({type(e).__name__}: {e}). It needs the Hugging Face Hub "
            "(network) or a cached copy; check the name on huggingface.co/datasets"
        ) from e
    wanted = _HF_SPLITS[split]
    found = [s for s in wanted if s in splits]
    if not found:
        raise ImageDataError(f"hf:{name} has splits {list(splits)}; none of {list(wanted)} for split={split!r}")
    return HFImageDataset(splits[found[0]], name, transform)
