"""ViT-B/16 training speed on one GPU, one switch at a time: which settings buy the model FLOPs utilisation (MFU).

    python -m bench.mfu_ablation [--batch 256] [--deadline 240] [--curve-steps 200]

Each row is ours (or timm's, same weights) training at batch 256 with AdamW on random 224 px images, bf16: the
switches are the AdamW implementation (foreach, the default, or ``fused``), the weights' dtype (fp32 under bf16
autocast, or bf16 weights and optimizer state, no autocast), and ``torch.compile`` (none, ``default``,
``max-autotune-no-cudagraphs``, ``max-autotune``: the latter with CUDA graphs). MFU is the forward and backward
matrix FLOPs (``bench.bench_model.train_flops_per_image``) times images/s over the GPU's bf16 peak.

Then the loss curves: ``--curve-steps`` steps of the eager fp32-weight run and of the fastest row, from the same
weights on the same batches (a fixed set of 16 batches of random images with random labels, which a ViT-B learns
to fit), with a second eager run from another seed as the noise floor: the fastest row's curve must differ from
the eager one's by no more than the two eager curves differ (mean absolute difference of 10-step means).

Order: the rows without autotuning, timm at the fastest of them, the loss curves, then the autotuned rows (their
compilation takes minutes). Nothing starts once ``--deadline`` seconds have passed (compilation included): a row
that would is printed as skipped.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass

import timm
import torch
import torch.nn.functional as F

import vit_core

from .bench_model import bf16_peak_tflops, train_flops_per_image

NAME = "vit_base_patch16_224"


@dataclass(frozen=True)
class Row:
    lib: str = "ours"
    fused: bool = False
    bf16_weights: bool = False
    compile: str | None = None  # a torch.compile mode, None: eager

    def label(self) -> str:
        return (
            f"{self.lib:4s} AdamW {'fused  ' if self.fused else 'foreach'} "
            f"weights {'bf16' if self.bf16_weights else 'fp32'} compile {self.compile or 'no'}"
        )


ROWS = [
    Row(),
    Row(fused=True),
    Row(fused=True, bf16_weights=True),
    Row(fused=True, compile="default"),
    Row(fused=True, bf16_weights=True, compile="default"),
    Row(fused=True, bf16_weights=True, compile="max-autotune-no-cudagraphs"),
    Row(fused=True, bf16_weights=True, compile="max-autotune"),
]


def make_model(lib: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    ref = timm.create_model(NAME)
    if lib == "timm":
        return ref.cuda()
    ours = vit_core.create_model(NAME)
    ours.load_state_dict(ref.state_dict())
    return ours.cuda()


def trainer(row: Row, seed: int = 0, lr: float = 1e-6):
    """A ``step(x, y) -> loss`` closure for ``row``: one forward, backward and AdamW step."""
    model = make_model(row.lib, seed).train()
    if row.bf16_weights:
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=row.fused, foreach=None if row.fused else True)
    autocast = nullcontext() if row.bf16_weights else torch.autocast("cuda", dtype=torch.bfloat16)

    forward = model if row.compile is None else torch.compile(model, mode=row.compile)  # as the engine compiles

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast:
            loss = F.cross_entropy(forward(x.to(torch.bfloat16) if row.bf16_weights else x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def throughput(row: Row, batch: int, repeats: int = 3, iters: int = 5) -> float:
    """Training images/s of ``row`` (median of ``repeats`` timings of ``iters`` steps, after a warm-up)."""
    step = trainer(row)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (batch,), device="cuda")
    for _ in range(3):
        step(x, y)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            step(x, y)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / iters)
    return batch / statistics.median(times)


def curve(row: Row, batch: int, steps: int, seed: int) -> list[float]:
    """Training losses of ``row`` over ``steps`` steps on 16 fixed random batches (the data seeded apart from
    the weights)."""
    step = trainer(row, seed, lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(1234)
    shape = (batch, 3, 224, 224)
    data = [
        (torch.randn(shape, device="cuda", generator=g), torch.randint(0, 10, (batch,), device="cuda", generator=g))
        for _ in range(16)
    ]
    return [float(step(*data[i % 16])) for i in range(steps)]


def smoothed(losses: list[float], k: int = 10) -> list[float]:
    return [sum(losses[i : i + k]) / k for i in range(0, len(losses) - k + 1, k)]


def mean_gap(a: list[float], b: list[float]) -> float:
    sa, sb = smoothed(a), smoothed(b)
    return sum(abs(u - v) for u, v in zip(sa, sb, strict=True)) / len(sa)


def timed_row(row: Row, batch: int, flops: float, peak: float) -> float | None:
    """Print ``row``'s table line; its images/s (None: it failed)."""
    t0 = time.time()
    try:
        ips = throughput(row, batch)
    except Exception as e:  # a mode this torch cannot compile is a row's result, not the end of the table
        print(f"| {row.label()} | failed: {type(e).__name__}: {str(e)[:120]} | | |", flush=True)
        return None
    finally:
        torch.compiler.reset()
    print(f"| {row.label()} | {ips:.0f} | {flops * ips / (peak * 1e12):.1%} | {time.time() - t0:.0f} |", flush=True)
    return ips


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--deadline", type=float, default=300.0, help="seconds after which no row or curve starts")
    p.add_argument("--curve-steps", type=int, default=200)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--rows", help="which rows of ROWS, by index (e.g. 3,5; default: all)")
    p.add_argument("--curve-row", type=int, help="the row whose loss curve is compared (default: the fastest)")
    args = p.parse_args()
    rows = ROWS if args.rows is None else [ROWS[int(i)] for i in args.rows.split(",")]
    start = time.time()
    late = lambda: time.time() - start > args.deadline  # noqa: E731
    peak = args.peak_tflops or bf16_peak_tflops("cuda")
    flops = train_flops_per_image(make_model("ours"), "cuda")
    print(
        f"{torch.cuda.get_device_name()} (bf16 peak {peak} TFLOP/s), torch {torch.__version__}, "
        f"timm {timm.__version__}, {NAME} batch {args.batch}, {flops / 1e9:.1f} GFLOP per image (forward + backward)"
    )
    print("| setting | img/s | MFU | seconds (compile included) |\n|---|---:|---:|---:|", flush=True)
    results: dict[Row, float] = {}
    autotuned = [row for row in rows if row.compile and row.compile.startswith("max-autotune")]
    for row in [r for r in rows if r not in autotuned]:
        if late():
            print(f"| {row.label()} | skipped: deadline | | |", flush=True)
        elif (ips := timed_row(row, args.batch, flops, peak)) is not None:
            results[row] = ips
    best = max(results, key=results.get) if results else rows[0]
    twin = Row("timm", best.fused, best.bf16_weights, best.compile)
    if results and not late() and (ips := timed_row(twin, args.batch, flops, peak)) is not None:
        print(f"ours / timm at the fastest setting so far: {results[best] / ips:.3f}", flush=True)
    if late():
        print("loss curves: skipped, deadline")
    else:
        eager = curve(Row(), args.batch, args.curve_steps, seed=0)
        noise = curve(Row(), args.batch, args.curve_steps, seed=1)
        if args.curve_row is not None:
            best = ROWS[args.curve_row]
        fast = curve(best, args.batch, args.curve_steps, seed=0)
        torch.compiler.reset()
        floor, gap = mean_gap(eager, noise), mean_gap(eager, fast)
        print(
            f"loss curves over {args.curve_steps} steps (10-step means): eager {smoothed(eager)[0]:.3f} -> "
            f"{smoothed(eager)[-1]:.3f}, compared ({best.label()}) {smoothed(fast)[0]:.3f} -> "
            f"{smoothed(fast)[-1]:.3f}; "
            f"mean gap to eager {gap:.4f}, eager vs eager from another seed {floor:.4f}: "
            f"{'WITHIN NOISE' if gap <= floor else 'OUTSIDE NOISE'}",
            flush=True,
        )
    for row in autotuned:  # last: autotuning compiles for minutes
        if late():
            print(f"| {row.label()} | skipped: deadline | | |", flush=True)
        elif (ips := timed_row(row, args.batch, flops, peak)) is not None:
            results[row] = ips
    if not results:
        return
    best = max(results, key=results.get)
    print(f"fastest: {best.label()}, {results[best]:.0f} img/s, MFU {flops * results[best] / (peak * 1e12):.1%}")


if __name__ == "__main__":
    main()
