"""Training-step throughput of a recipe's model on this CPU with ``cpu_precision=bf16`` against fp32, one run.

    python -m bench.bench_cpu_bf16                               # the bundle's recipe, batch 256
    python -m bench.bench_cpu_bf16 --recipe cifar10_vit_cpu --batch 128

A step is what the engine does for one batch (autocast forward, loss in fp32, backward, SGD step), on random
images of the recipe's size in its memory layout; repeats alternate fp32 and bf16 so that machine noise hits
both alike, and the median ratio bf16 / fp32 is printed (> 1: bf16 is faster). The engine turns bf16 on only
where the CPU has bf16 units (AVX-512 BF16 or AMX): elsewhere this bench times the emulation it avoids.
``--batch`` is the images per pass: on a CPU smaller passes stay in cache, which is what the recipe key
``micro_batch`` buys (compare ``--batch 1024`` with ``--batch 256``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from train import load_recipe
from vit_core import VisionTransformer
from vit_core.training.engine import cpu_has_bf16
from vit_core.training.recipe import Recipe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="cifar10_speedrun")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args()

    recipe = Recipe.from_dict(load_recipe(args.recipe))
    torch.manual_seed(0)
    model = VisionTransformer(recipe.scratch_config([str(i) for i in range(10)])).train()
    c, (h, w) = model.config.in_chans, model.config.img_hw
    x, y = torch.randn(args.batch, c, h, w), torch.randint(0, 10, (args.batch,))
    if recipe.channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def step(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
            loss = F.cross_entropy(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    print(f"{args.recipe}: batch {args.batch}, {torch.get_num_threads()} threads, CPU bf16 units: {cpu_has_bf16()}")
    rates: dict[bool, list[float]] = {False: [], True: []}
    for bf16 in (False, True):  # warm-up: oneDNN picks its kernels on the first calls
        step(bf16)
    for _ in range(args.repeats):
        for bf16 in (False, True):
            t0 = time.perf_counter()
            for _ in range(args.iters):
                step(bf16)
            rates[bf16].append(args.batch * args.iters / (time.perf_counter() - t0))
    fp32, bf16 = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"training step: fp32 {fp32:.0f} img/s, bf16 {bf16:.0f} img/s, ratio bf16/fp32 {bf16 / fp32:.2f}")


if __name__ == "__main__":
    main()
