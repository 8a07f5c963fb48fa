"""Batches for training and evaluation: a fixed subset of a dataset, a subset of its classes, and one
process's share of it.

The in-memory datasets whose transform works on uint8 batches (no RandAugment) are indexed and
transformed a whole batch at a time on the training device; anything else goes through a DataLoader.
Both paths see the same images in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from .datasets import InMemoryImageDataset
from .images import ImageDataError


def fixed_subset(dataset: Dataset, spec: int | list[int] | torch.Tensor | None) -> Dataset:
    """``spec`` None: ``dataset``; a tensor: the images at those indices; N: N images; [a, b]: images a..b-1 of
    one permutation seeded with 0. The same images for every recipe and seed, so a labelled subset [0, n) and
    pre-training images [n, N) never overlap."""
    if spec is None:
        return dataset
    if isinstance(spec, torch.Tensor):  # the images at these indices (a run's held-out images, say)
        return index_subset(dataset, spec)
    start, stop = (0, spec) if isinstance(spec, int) else spec
    if stop > len(dataset):
        raise ImageDataError(f"subset up to {stop} images, but the dataset has only {len(dataset)}")
    return index_subset(dataset, torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[start:stop])


def index_subset(dataset: Dataset, idx: torch.Tensor) -> Dataset:
    """The images of ``dataset`` at ``idx``, with its ``classes``, ``targets`` and ``transform``."""
    if isinstance(dataset, InMemoryImageDataset):
        return dataset.subset(idx)
    sub = Subset(dataset, idx.tolist())
    sub.classes, sub.targets, sub.transform = dataset.classes, dataset.targets[idx], dataset.transform
    return sub


def with_transform(dataset: InMemoryImageDataset, transform: Callable | None) -> InMemoryImageDataset:
    """The same images in memory (not copied), seen through another transform: a training and a test view."""
    return InMemoryImageDataset(dataset.images, dataset.targets, dataset.classes, transform)


def stratified_split(targets: torch.Tensor, fraction: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out): indices of ``targets`` with ``fraction`` of each class's images held out (rounded, at
    least one of a class with two or more), drawn by one permutation per class seeded with ``seed``, so that
    every recipe holds out the same images. Both in ascending order."""
    kept, held = [], []
    g = torch.Generator().manual_seed(seed)
    for c in torch.unique(targets):
        idx = (targets == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)]
        n = min(len(idx) - 1, max(1, round(fraction * len(idx)))) if len(idx) > 1 else 0
        held.append(idx[:n])
        kept.append(idx[n:])
    return torch.cat(kept).sort().values, torch.cat(held).sort().values


def class_subset(dataset: Dataset, classes: list[str] | None) -> Dataset:
    """``classes`` None: ``dataset``; else only its images of those classes (names from ``dataset.classes``),
    labelled 0..n-1 in the order given: a closed set whose other classes stay unseen, for open-set
    recognition (Neal et al. 2018). Unknown names are an ``ImageDataError`` naming them."""
    if classes is None:
        return dataset
    unknown = [c for c in classes if c not in dataset.classes]
    if unknown or len(set(classes)) != len(classes) or not classes:
        raise ImageDataError(
            f"classes must be distinct names of the data's classes ({', '.join(dataset.classes)}); got {classes}"
        )
    relabel = torch.full((len(dataset.classes),), -1, dtype=torch.int64)
    relabel[[dataset.classes.index(c) for c in classes]] = torch.arange(len(classes))
    new_targets = relabel[dataset.targets]
    idx = (new_targets >= 0).nonzero().flatten()
    if isinstance(dataset, InMemoryImageDataset):
        return InMemoryImageDataset(dataset.images[idx], new_targets[idx], list(classes), dataset.transform)
    return _Relabelled(dataset, idx, relabel, list(classes))


class _Relabelled(Dataset):
    """``indices`` of ``dataset`` with labels mapped through ``relabel`` (for datasets decoded on access)."""

    def __init__(self, dataset: Dataset, indices: torch.Tensor, relabel: torch.Tensor, classes: list[str]) -> None:
        self.dataset, self.indices, self.relabel, self.classes = dataset, indices.tolist(), relabel, classes
        self.targets, self.transform = relabel[dataset.targets[indices]], dataset.transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x, y = self.dataset[self.indices[i]]
        return x, int(self.relabel[y])


class Batches:
    """One process's batches of a dataset, on its device.

    Training: every epoch a permutation seeded with ``seed + epoch`` (``DistributedSampler``), the last
    partial global batch dropped; process r takes elements r, r + N, ... With the transform's ``hflip``
    "alternate" (airbench, Jordan 2024: each image seen both ways round in every two epochs, where random
    flips show half of them the same way round both times), a fixed random half of the images, drawn with ``seed``,
    is flipped on even epochs and the other half on odd ones. Evaluation: every image once,
    in order, process r taking r, r + N, ... In-memory datasets whose transform works on uint8 batches
    are indexed and transformed a batch at a time on the device; anything else goes through a DataLoader
    with ``workers`` processes.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        device: torch.device,
        *,
        train: bool,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        workers: int = 0,
    ) -> None:
        self.device, self.batch_size, self.train = device, batch_size, train
        self.sampler = (
            DistributedSampler(dataset, world, rank, shuffle=True, seed=seed, drop_last=True) if train else None
        )
        self.indices = None if train else torch.arange(rank, len(dataset), world)
        tf = dataset.transform
        self.fast = isinstance(dataset, InMemoryImageDataset) and (tf is None or not tf.needs_pil)
        self.epoch, self.flipped_on_even = 0, None
        if train and getattr(tf, "augment", {}).get("hflip") == "alternate":
            if not self.fast:
                raise ImageDataError(
                    "augment hflip 'alternate' flips each image by its index: it needs an in-memory dataset "
                    "(mnist, fashion-mnist, cifar10) and no RandAugment"
                )
            draw = torch.rand(len(dataset), generator=torch.Generator().manual_seed(seed))
            self.flipped_on_even = (draw < 0.5).to(device)
        if self.fast:
            self.images, self.targets, self.transform = dataset.images.to(device), dataset.targets.to(device), tf
        else:
            self.loader = DataLoader(
                dataset if train else Subset(dataset, self.indices.tolist()),
                batch_size,
                sampler=self.sampler,
                drop_last=train,
                num_workers=workers,
                pin_memory=device.type == "cuda",
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        n = len(self.sampler) if self.train else len(self.indices)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.fast:
            for x, y in self.loader:
                yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            return
        order = torch.tensor(list(self.sampler)) if self.train else self.indices
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            idx = order[start : start + self.batch_size].to(self.device)
            x = self.images[idx]
            x = self.transform(x) if self.transform else x
            if self.flipped_on_even is not None:
                flip = self.flipped_on_even[idx] ^ (self.epoch % 2 == 1)
                x = torch.where(flip[:, None, None, None], x.flip(-1), x)
            yield x, self.targets[idx]
