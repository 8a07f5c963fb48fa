"""Throughput of our ViT vs timm's on the same variant and weights, measured in one run.

    python -m bench.bench_model                       # CPU fp32: Ti/16 and S/16 at batch 8 and 1
    python -m bench.bench_model --device cuda         # GPU bf16 autocast: B/16 at batch 256

Each row times inference (images/s) and one training step (forward, backward, AdamW step) for both
libraries, alternating ours and timm's repeat by repeat so that machine noise hits both alike, and
prints the median ratio ours/timm (>= 1.0 means we are at least as fast).
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import timm
import torch

import vit_core


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timer(fn, device: str, iters: int) -> float:
    """Seconds per call of ``fn``, over ``iters`` calls."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / iters


def bench_row(name: str, batch: int, device: str, dtype: torch.dtype, repeats: int, iters: int) -> dict:
    torch.manual_seed(0)
    ref = timm.create_model(name).to(device)
    ours = vit_core.create_model(name).to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    autocast = torch.autocast(device, dtype=dtype) if dtype != torch.float32 else nullcontext()

    def infer(model):
        model.eval()

        def step():
            with torch.inference_mode(), autocast:
                model(x)

        return step

    def train(model):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

        def step():
            with autocast:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    out = {"model": name, "batch": batch}
    for mode, make in (("infer", infer), ("train", train)):
        fns = {"ours": make(ours), "timm": make(ref)}
        for fn in fns.values():  # warm-up (allocator, kernels, optimizer state)
            _timer(fn, device, 2)
        times = {"ours": [], "timm": []}
        for _ in range(repeats):
            for lib, fn in fns.items():
                times[lib].append(_timer(fn, device, iters))
        med = {lib: statistics.median(t) for lib, t in times.items()}
        out[f"{mode}_ours"] = batch / med["ours"]
        out[f"{mode}_timm"] = batch / med["timm"]
        out[f"{mode}_ratio"] = med["timm"] / med["ours"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args()
    if args.device == "cuda":
        rows, dtype = [("vit_base_patch16_224", 256)], torch.bfloat16
    else:
        rows, dtype = [(n, b) for n in ("vit_tiny_patch16_224", "vit_small_patch16_224") for b in (8, 1)], torch.float32
    print(
        f"device={args.device} dtype={str(dtype).removeprefix('torch.')} threads={torch.get_num_threads()} "
        f"torch={torch.__version__} timm={timm.__version__}"
    )
    print(
        f"{'model':24s} {'batch':>5s} | {'infer img/s ours':>16s} {'timm':>8s} {'ratio':>6s} | "
        f"{'train img/s ours':>16s} {'timm':>8s} {'ratio':>6s}"
    )
    for name, batch in rows:
        r = bench_row(name, batch, args.device, dtype, args.repeats, args.iters)
        print(
            f"{name:24s} {batch:5d} | {r['infer_ours']:16.1f} {r['infer_timm']:8.1f} {r['infer_ratio']:6.3f} | "
            f"{r['train_ours']:16.1f} {r['train_timm']:8.1f} {r['train_ratio']:6.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
