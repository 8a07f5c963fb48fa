"""CPU inference switches, one at a time, each with its agreement against fp32 (issue #65): an ablation in one run.

    python -m bench.cpu_switches [--images 2000] [--repeats 7] [--no-compile]

Rows, each against plain fp32 on one thread (the app's setting for the bundle) or, for ViT-B/16, on the
threads the app gives it (all cores): two threads; ``torch.compile`` (inductor, its C++ backend on the CPU);
bf16 autocast where the CPU has bf16 units (``torch.backends.cpu.get_cpu_capability()``, AVX-512 BF16 or AMX;
elsewhere bf16 is emulated and the row says so); int8 dynamic quantisation of every ``nn.Linear``
(``torch.ao.quantization.quantize_dynamic``: weights in int8, activations quantised per batch as they come).

Speed: the median over ``--repeats`` of one image's forward pass (the app's case), repeats alternating the rows
so that the machine's noise falls on each alike, as a ratio to the fp32 row (> 1: faster). Agreement: for the
bundled model, top-1 agreement with fp32 and the largest logit difference over the first ``--images`` CIFAR-10
test images (``../shared/data/cifar10/test_batch.npz``, batches of 250); for ViT-B/16 with seeded random weights
(``vit_core.create_model('vit_base_patch16_224')``, seed 0), the largest logit difference over 8 random images
(its random logits are close together, so top-1 agreement is a coarse measure there; it is given too).
A switch keeps the answer when every top-1 agrees; only such a switch may become the predict path's default.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
from torch import nn

import vit_core
from vit_core.training.engine import cpu_has_bf16
from webapp.registry.catalog import BUNDLED, ROOT

CIFAR_TEST = ROOT.parent / "shared" / "data" / "cifar10" / "test_batch.npz"
Forward = Callable[[torch.Tensor], torch.Tensor]


def cifar_images(model: nn.Module, n: int) -> torch.Tensor | None:
    """The first ``n`` CIFAR-10 test images, normalised as the model's preprocessing does (32x32, no resize)."""
    if not Path(CIFAR_TEST).is_file():
        return None
    x = torch.from_numpy(np.load(CIFAR_TEST)["x"][:n]).permute(0, 3, 1, 2).float() / 255
    mean, std = (torch.tensor(model.pretrained_cfg[k])[:, None, None] for k in ("mean", "std"))
    return (x - mean) / std


def switches(model: nn.Module, threads: int, compile_: bool) -> dict[str, tuple[int, Forward]]:
    """name -> (threads, forward) for each row; every forward runs under ``torch.inference_mode``."""

    def plain(m: nn.Module, autocast: bool = False) -> Forward:
        def run(x: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16) if autocast else nullcontext():
                return m(x).float()

        return run

    rows = {f"fp32, {threads} thread(s)": (threads, plain(model))}
    if threads == 1:
        rows["fp32, 2 threads"] = (2, plain(model))
    if compile_:
        rows["torch.compile (inductor)"] = (threads, plain(torch.compile(model)))
    bf16 = "bf16 autocast" + ("" if cpu_has_bf16() else " (emulated: no bf16 units)")
    rows[bf16] = (threads, plain(model, autocast=True))
    int8 = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    rows["int8 dynamic quantisation (linear layers)"] = (threads, plain(int8))
    return rows


def agreement(rows: dict[str, tuple[int, Forward]], images: torch.Tensor, batch: int) -> dict[str, tuple]:
    """name -> (top-1 agreement with the first row, largest |logit difference|) over ``images``."""
    logits = {}
    for name, (threads, fn) in rows.items():
        torch.set_num_threads(threads)
        logits[name] = torch.cat([fn(images[i : i + batch]) for i in range(0, len(images), batch)])
    ref = next(iter(logits.values()))
    return {
        name: (float((z.argmax(-1) == ref.argmax(-1)).float().mean()), float((z - ref).abs().max()))
        for name, z in logits.items()
    }


def speeds(rows: dict[str, tuple[int, Forward]], x: torch.Tensor, repeats: int) -> dict[str, float]:
    """name -> median ms of one forward of ``x``, the rows alternated, after a warm-up of each."""
    times: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(repeats + 1):
        for name, (threads, fn) in rows.items():
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            fn(x)
            if r:
                times[name].append((time.perf_counter() - t0) * 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def report(title: str, rows: dict, images: torch.Tensor, x: torch.Tensor, args: argparse.Namespace) -> None:
    agree = agreement(rows, images, 250)
    ms = speeds(rows, x, args.repeats)
    ref = next(iter(ms.values()))
    print(f"\n{title}")
    print("| switch | threads | ms per image | speed vs fp32 | top-1 agreement | largest logit difference | keeps it |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, (threads, _) in rows.items():
        a, d = agree[name]
        keeps = "yes" if a == 1.0 else "no"
        print(f"| {name} | {threads} | {ms[name]:.1f} | {ref / ms[name]:.2f} | {a:.4%} | {d:.2e} | {keeps} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    args = p.parse_args()
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"CPU capability {capability}, bf16 units: {cpu_has_bf16()}, torch {torch.__version__}")

    bundle = vit_core.from_pretrained(BUNDLED).eval()
    images = cifar_images(bundle, args.images)
    if images is None:
        print(f"no CIFAR-10 test images at {CIFAR_TEST.name}: the bundle's rows skipped")
    else:
        title = f"bundled model ({bundle.num_params():,} parameters), {len(images)} CIFAR-10 test images"
        report(title, switches(bundle, 1, args.compile), images, images[:1], args)

    torch.manual_seed(0)
    b16 = vit_core.create_model("vit_base_patch16_224").eval()
    x = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    report("ViT-B/16, seeded random weights, 8 random images", switches(b16, 2, args.compile), x, x[:1], args)


if __name__ == "__main__":
    main()
