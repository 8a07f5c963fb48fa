"""Where a run's processes stand: the device, the torchrun process group, and the random number
generators a bit-identical resume has to restore (torch, CUDA, numpy, python)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .recipe import RecipeError


@dataclass
class Processes:
    """This process's place in a (possibly single-process) data-parallel run."""

    rank: int
    world: int
    device: torch.device
    owns_group: bool  # this call joined the process group, so it leaves it

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """In a process group (under torchrun, even alone): gradients go through DDP and its backend."""
        return dist.is_initialized()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def close(self) -> None:
        if self.owns_group:
            dist.destroy_process_group()


def setup_processes(device: str) -> Processes:
    """Pick the device; join the process group that torchrun describes (RANK, WORLD_SIZE, ...) if any.

    Under torchrun the group is joined even by a single process, so that ``--nproc_per_node 1`` runs the
    same DDP and NCCL (or gloo) path as eight processes do."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RecipeError(f"device {device!r} requested but CUDA is not available; use --device cpu")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise RecipeError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if "RANK" not in os.environ and not dist.is_initialized():
        return Processes(0, 1, torch.device(device), False)
    owns = not dist.is_initialized()
    cuda = device.startswith("cuda")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if owns:
        dist.init_process_group("nccl" if cuda else "gloo")
    return Processes(dist.get_rank(), dist.get_world_size(), torch.device(device), owns)


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every generator's state as tensors and plain containers (``torch.load(weights_only=True)`` reads it)."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": np_state["state"]["pos"],
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(s: dict[str, Any]) -> None:
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))
    n = s["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
