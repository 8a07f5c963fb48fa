"""Training speed one switch at a time, each with its loss curve against eager fp32: which settings buy the model
FLOPs utilisation (MFU) without changing the training.

    python -m bench.mfu_ablation [--device cuda] [--rows eager,compile,...] [--deadline 300] [--curve-steps 200]

On CUDA: ViT-B/16 at batch 256 with AdamW on random 224 px images, the curves over 200 steps. On a CPU (``--device
cpu``): a tiny ViT (``bench.mfu_switches.CPU_SPEC``), 50 steps, every switch a CPU can run; the CUDA-only ones
(CUDA graphs, SDPA's memory-efficient kernel) are printed as skipped with the reason. The rows and how a curve is
compared: ``bench.mfu_switches``. MFU is the forward and backward matrix FLOPs
(``bench.bench_model.train_flops_per_image``) times images/s over the GPU's bf16 peak (none on a CPU).

Each row trains its curve (compilation in its first steps), then is timed on the same trainer. The first row is
eager, whose curve is the reference; the noise floor is eager from another seed. Nothing starts once
``--deadline`` seconds have passed (compilation included): a row that would is printed as skipped. The compiler's
cache is ``--inductor-cache`` (a folder under runs/ by default), so that a later call (of
``bash bench/gpu_checks.sh`` on a machine that stays up) starts with ``max-autotune``'s choices already made; the
header says whether it held anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import timm
import torch

from .bench_model import bf16_peak_tflops, train_flops_per_image
from .mfu_switches import (
    CPU_SPEC,
    CUDA_SPEC,
    ROWS,
    ModelSpec,
    Row,
    curve,
    curve_data,
    make_model,
    mean_gap,
    skip_reason,
    smoothed,
    timed_steps,
    trainer,
)


@dataclass
class Result:
    """One row's measurement: images/s, its curve, its gap to eager's, and its seconds (compilation included)."""

    ips: float
    losses: list[float]
    gap: float
    seconds: float


class Ablation:
    """The rows' measurements on one device, against eager's curve (per batch) and the noise floor."""

    def __init__(self, spec: ModelSpec, device: str, steps: int) -> None:
        self.spec, self.device, self.steps = spec, device, steps
        self.references: dict[int, list[float]] = {}  # eager's curve at each batch scale

    def reference(self, scale: int) -> list[float]:
        """Eager's curve at ``scale`` reference batches (in passes of one reference batch above 1)."""
        if scale not in self.references:
            step = trainer(Row(), self.spec, self.device, passes=self.spec.batch if scale > 1 else None)
            self.references[scale] = curve(step, curve_data(self.spec, self.device, scale), self.steps)
        return self.references[scale]

    def floor(self) -> float:
        """The noise floor: eager's curve against eager's from another seed."""
        other = curve(trainer(Row(), self.spec, self.device, seed=1), curve_data(self.spec, self.device), self.steps)
        return mean_gap(self.reference(1), other)

    def measure(self, row: Row) -> Result:
        t0 = time.time()
        try:
            data = curve_data(self.spec, self.device, row.batch_scale)
            step = trainer(row, self.spec, self.device)
            losses = curve(step, data, self.steps)
            seconds_per_step = timed_steps(step, *data[0], self.device)
        finally:
            torch.compiler.reset()
        gap = mean_gap(self.reference(row.batch_scale), losses)
        return Result(len(data[0][0]) / seconds_per_step, losses, gap, time.time() - t0)


def inductor_cache(folder: str) -> str:
    """Point the compiler's cache at ``folder`` (before anything compiles); whether it held anything."""
    path = Path(folder).resolve()
    had = path.is_dir() and any(path.iterdir())
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else folder  # no server path in the log
    return f"inductor cache {shown} ({'warm: an earlier call filled it' if had else 'cold'})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, help="the reference batch (default: 256 on CUDA, 32 on a CPU)")
    p.add_argument("--deadline", type=float, default=300.0, help="seconds after which no row starts")
    p.add_argument("--curve-steps", type=int, help="default: 200 on CUDA, 50 on a CPU")
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--rows", help=f"which rows, by name (default: all): {', '.join(ROWS)}")
    p.add_argument(
        "--inductor-cache",
        default="runs/inductor_cache",
        help="the compiler's cache (TORCHINDUCTOR_CACHE_DIR, which importing torch sets), kept between calls",
    )
    args = p.parse_args()
    cache = inductor_cache(args.inductor_cache)
    names = list(ROWS) if args.rows is None else args.rows.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        p.error(f"unknown rows {', '.join(unknown)}; rows: {', '.join(ROWS)}")
    spec = CUDA_SPEC if args.device == "cuda" else CPU_SPEC
    spec = dataclasses.replace(spec, batch=args.batch or spec.batch, steps=args.curve_steps or spec.steps)
    start = time.time()
    run(spec, args.device, names, deadline=start + args.deadline, peak=args.peak_tflops, cache=cache)


def run(spec: ModelSpec, device: str, names: list[str], *, deadline: float, peak: float | None, cache: str) -> None:
    """Print the table of ``names``' rows and the summary."""
    if device == "cuda":
        peak = peak or bf16_peak_tflops("cuda")
        where = f"{torch.cuda.get_device_name()} (bf16 peak {peak} TFLOP/s)"
    else:
        where = f"CPU, {torch.get_num_threads()} threads (no peak: no MFU)"
    flops = train_flops_per_image(make_model("ours", spec, device), device, img_size=spec.img_size)
    ablation = Ablation(spec, device, spec.steps)
    floor = ablation.floor()
    print(
        f"{where}, torch {torch.__version__}, timm {timm.__version__}; {spec.overrides or 'ViT-B/16'} batch "
        f"{spec.batch}, {flops / 1e9:.3f} GFLOP per image (forward + backward); {cache}\n"
        f"loss curves over {spec.steps} steps (10-step means) from the same weights on the same 16 batches; noise "
        f"floor (eager against eager from another seed, mean gap of 10-step means): {floor:.4f}",
        flush=True,
    )
    print(
        "| row | setting | img/s | MFU | loss (first -> last 10-step mean) | gap to eager | curve | seconds |\n"
        "|---|---|---:|---:|---|---:|---|---:|",
        flush=True,
    )
    results: dict[str, Result] = {}
    for name in names:
        row = ROWS[name]
        reason = skip_reason(row, device) or ("deadline" if time.time() > deadline else None)
        if reason:
            print(f"| {name} | {row.label()} | skipped: {reason} | | | | | |", flush=True)
            continue
        try:
            r = results[name] = ablation.measure(row)
        except Exception as e:  # a switch this torch cannot run is a row's result, not the end of the table
            print(f"| {name} | {row.label()} | failed: {type(e).__name__}: {str(e)[:150]} | | | | | |", flush=True)
            continue
        mfu = f"{flops * r.ips / (peak * 1e12):.1%}" if peak else "-"
        s = smoothed(r.losses)
        verdict = "within noise" if r.gap <= floor else "OUTSIDE NOISE"
        print(
            f"| {name} | {row.label()} | {r.ips:.0f} | {mfu} | {s[0]:.3f} -> {s[-1]:.3f} | {r.gap:.4f} | {verdict} | "
            f"{r.seconds:.0f} |",
            flush=True,
        )
    summary(results, floor, flops, peak)


def summary(results: dict[str, Result], floor: float, flops: float, peak: float | None) -> None:
    """The fastest row within noise, and ours against timm in the combined setting."""
    if "combined" in results and "timm-combined" in results:
        print(f"ours / timm, combined: {results['combined'].ips / results['timm-combined'].ips:.3f}")
    kept = {n: r for n, r in results.items() if r.gap <= floor}
    if not kept:
        print("no row measured within noise")
        return
    best = max(kept, key=lambda n: kept[n].ips)
    mfu = f", MFU {flops * kept[best].ips / (peak * 1e12):.1%}" if peak else ""
    print(f"fastest within noise: {best} ({ROWS[best].label()}), {kept[best].ips:.0f} img/s{mfu}", flush=True)


if __name__ == "__main__":
    main()
