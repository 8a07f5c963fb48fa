"""Throughput of our ViT vs timm's on the same variant and weights, measured in one run.

    python -m bench.bench_model                       # CPU fp32: Ti/16 and S/16 at batch 8 and 1
    python -m bench.bench_model --device cuda         # GPU bf16 autocast: B/16 at batch 256
    python -m bench.bench_model --device cuda --compile   # the same, then both under torch.compile

Each row times inference (images/s) and one training step (forward, backward, AdamW step) for both
libraries, alternating ours and timm's repeat by repeat so that machine noise hits both alike, and
prints the median ratio ours/timm (>= 1.0 means we are at least as fast).

On a GPU each row also gives the training step's model FLOPs utilisation (MFU): the matrix FLOPs of a forward
and backward pass (counted by ``torch.utils.flop_counter``, 2 per multiply-add, attention included) times
images/s, over the GPU's dense bf16 peak (from its name, or ``--peak-tflops``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

import vit_core

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s, matched on the device name.
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100 PCIe": 756.0, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0}


def bf16_peak_tflops(device: str) -> float | None:
    """The data-sheet bf16 peak of this CUDA device, or None if it is not in the table."""
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in BF16_PEAK_TFLOPS.items() if key in name), None)


def train_flops_per_image(model: torch.nn.Module, device: str, *, img_size: int = 224) -> float:
    """Matrix FLOPs of one image's forward and backward pass (what MFU counts; the optimizer step is not)."""
    x = torch.randn(2, 3, img_size, img_size, device=device)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / 2


LIBS = ("ours", "timm")


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


def bench_row(
    name: str, batch: int, device: str, dtype: torch.dtype, repeats: int, iters: int, compile: bool = False
) -> dict:
    torch.manual_seed(0)
    ref = timm.create_model(name).to(device)
    ours = vit_core.create_model(name).to(device)
    ours.load_state_dict(ref.state_dict())
    flops = train_flops_per_image(ref, device)
    ours_fn, ref_fn = (torch.compile(ours), torch.compile(ref)) if compile else (ours, ref)
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    autocast = torch.autocast(device, dtype=dtype) if dtype != torch.float32 else nullcontext()

    def infer(model, fn):
        model.eval()

        def step():
            with torch.inference_mode(), autocast:
                fn(x)

        return step

    def train(model, fn):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

        def step():
            with autocast:
                loss = torch.nn.functional.cross_entropy(fn(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    out = {"model": name, "batch": batch, "train_flops_per_image": flops}
    for mode, make in (("infer", infer), ("train", train)):
        fns = {"ours": make(ours, ours_fn), "timm": make(ref, ref_fn)}
        for fn in fns.values():  # warm-up (allocator, kernels, optimizer state, compilation)
            _timer(fn, device, 3 if compile else 2)
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
    p.add_argument("--compile", action="store_true", help="after the eager rows, the same under torch.compile")
    p.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak for MFU (default: by its name)")
    args = p.parse_args()
    if args.device == "cuda":
        rows, dtype = [("vit_base_patch16_224", 256)], torch.bfloat16
    else:
        rows, dtype = [(n, b) for n in ("vit_tiny_patch16_224", "vit_small_patch16_224") for b in (8, 1)], torch.float32
    peak = args.peak_tflops or (bf16_peak_tflops(args.device) if args.device == "cuda" else None)
    gpu = f" ({torch.cuda.get_device_name()}, bf16 peak {peak} TFLOP/s)" if args.device == "cuda" else ""
    print(
        f"device={args.device}{gpu} dtype={str(dtype).removeprefix('torch.')} threads={torch.get_num_threads()} "
        f"torch={torch.__version__} timm={timm.__version__}"
    )
    print(
        f"{'model':24s} {'batch':>5s} {'compile':>7s} | {'infer img/s ours':>16s} {'timm':>8s} {'ratio':>6s} | "
        f"{'train img/s ours':>16s} {'timm':>8s} {'ratio':>6s} | {'MFU ours':>8s} {'timm':>6s}"
    )
    for compile in (False, True) if args.compile else (False,):
        for name, batch in rows:
            r = bench_row(name, batch, args.device, dtype, args.repeats, args.iters, compile)
            mfu = [r["train_flops_per_image"] * r[f"train_{lib}"] / (peak * 1e12) if peak else None for lib in LIBS]
            print(
                f"{name:24s} {batch:5d} {'yes' if compile else 'no':>7s} | "
                f"{r['infer_ours']:16.1f} {r['infer_timm']:8.1f} {r['infer_ratio']:6.3f} | "
                f"{r['train_ours']:16.1f} {r['train_timm']:8.1f} {r['train_ratio']:6.3f} | "
                + " ".join(f"{m:8.1%}" if m is not None else f"{'n/a':>8s}" for m in mfu),
                flush=True,
            )
    print(f"training FLOPs per image (forward + backward): {r['train_flops_per_image'] / 1e9:.1f} GFLOP")


if __name__ == "__main__":
    main()
