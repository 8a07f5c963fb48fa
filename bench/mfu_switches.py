"""The switches of ``bench.mfu_ablation``: one training setting per row, its step, its loss curve and its speed.

A row is eager fp32 (AdamW foreach; fp32 weights, under bf16 autocast on CUDA, plain fp32 on a CPU) with one
switch changed: SDPA's kernel forced (``math``, the unfused formula, against the fused ``flash`` or
``efficient`` kernels that the model's forward takes whenever no attention weights are returned), fused AdamW,
bf16 weights (alone, or with fp32 master weights for the optimizer: Micikevicius et al. 2018, "Mixed Precision
Training"), ``torch.compile`` (the whole model, or only each block's LayerNorms and MLP, so that the compiler fuses
LayerNorm and GELU into their neighbours), CUDA graphs (``reduce-overhead``), ``max-autotune``, a larger batch in
one pass, channels-last for the patch embedding; then the switches that keep the curve, combined.

Curves: every row trains from the same weights on the same 16 fixed batches of random images with random labels
(which a ViT learns to fit), and its curve is compared with eager's: the mean absolute difference of 10-step
means (``mean_gap``). The noise floor is eager against eager from another seed (other initial weights); a row
is within noise when its gap to eager is no larger. A larger batch is compared with eager at that batch in
passes of the reference batch, whose gradient is the same.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field

import timm
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import vit_core

NAME = "vit_base_patch16_224"


@dataclass(frozen=True)
class ModelSpec:
    """The model a run trains: ``NAME`` with these overrides (timm's and ours take the same), and its batch."""

    overrides: dict = field(default_factory=dict)
    batch: int = 256
    classes: int = 10  # of the curves' random labels
    lr: float = 1e-4  # the curves' AdamW learning rate
    steps: int = 200  # the curves' length

    @property
    def img_size(self) -> int:
        return self.overrides.get("img_size", 224)


CUDA_SPEC = ModelSpec()  # ViT-B/16 at 224 px, batch 256: the setting
# A tiny ViT for a CPU: a few milliseconds a step, so that every switch's 50-step curve runs in seconds
CPU_SPEC = ModelSpec(
    dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10), batch=32, lr=3e-3, steps=50
)

KERNELS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class Row:
    lib: str = "ours"  # or "timm", the same weights
    attention: str = "auto"  # SDPA's own choice; "math", "flash", "efficient": that kernel forced
    fused_adamw: bool = False
    weights: str = "fp32"  # "fp32", "bf16" (weights and optimizer state), "bf16-master" (fp32 master weights)
    compile: str | None = None  # a torch.compile mode, None: eager
    compile_scope: str = "model"  # "model", or "norm-mlp": each block's LayerNorms and MLP only
    batch_scale: int = 1  # the batch in one pass, in reference batches
    channels_last: bool = False  # the patch embedding's convolution in NHWC

    def label(self) -> str:
        parts = [self.lib, f"AdamW {'fused' if self.fused_adamw else 'foreach'}", f"weights {self.weights}"]
        parts.append(f"compile {self.compile or 'no'}" + (" (norm+MLP)" if self.compile_scope != "model" else ""))
        if self.attention != "auto":
            parts.append(f"SDPA {self.attention}")
        if self.batch_scale != 1:
            parts.append(f"batch x{self.batch_scale}")
        if self.channels_last:
            parts.append("channels-last")
        return ", ".join(parts)


_BEST = dict(fused_adamw=True, weights="bf16-master", compile="default")
ROWS: dict[str, Row] = {
    "eager": Row(),
    "sdpa-math": Row(attention="math"),
    "sdpa-flash": Row(attention="flash"),
    "sdpa-efficient": Row(attention="efficient"),
    "fused-adamw": Row(fused_adamw=True),
    "bf16-weights": Row(weights="bf16"),
    "bf16-master": Row(weights="bf16-master"),
    "channels-last": Row(channels_last=True),
    "batch-x2": Row(batch_scale=2),
    "compile": Row(compile="default"),
    "compile-norm-mlp": Row(compile="default", compile_scope="norm-mlp"),
    "cuda-graphs": Row(compile="reduce-overhead"),
    "combined": Row(**_BEST),
    "timm-combined": Row(lib="timm", **_BEST),
    "max-autotune-no-cudagraphs": Row(**_BEST | dict(compile="max-autotune-no-cudagraphs")),
    "max-autotune": Row(**_BEST | dict(compile="max-autotune")),
}


def skip_reason(row: Row, device: str) -> str | None:
    """Why ``row`` cannot run on ``device`` (None: it can)."""
    if device == "cuda":
        return None
    if row.compile in CUDA_GRAPH_MODES:
        return f"compile mode {row.compile} records CUDA graphs, which need a CUDA device"
    if row.attention == "efficient":
        return "SDPA's memory-efficient kernel is CUDA-only (a CPU has the flash kernel and the math one)"
    return None


def make_model(lib: str, spec: ModelSpec, device: str, seed: int = 0) -> torch.nn.Module:
    """timm's ViT from ``seed``, or ours holding the same weights."""
    torch.manual_seed(seed)
    ref = timm.create_model(NAME, **spec.overrides)
    if lib == "timm":
        return ref.to(device)
    ours = vit_core.create_model(NAME, **spec.overrides)
    ours.load_state_dict(ref.state_dict())
    return ours.to(device)


class MasterWeights:
    """bf16 weights for the passes and fp32 copies that the optimizer updates (Micikevicius et al. 2018): an
    update far smaller than a weight is kept in the fp32 copy, where in bf16 (8 significant bits) it rounds away.
    Made from the fp32 model before it is cast, so the copies start from the exact weights."""

    def __init__(self, model: torch.nn.Module, optimizer: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optimizer = optimizer(self.master)

    def step(self) -> None:
        for p, m in zip(self.params, self.master, strict=True):
            m.grad = p.grad.float()
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)  # rounded to bf16 once, from the exact sum

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none=set_to_none)


def trainer(
    row: Row, spec: ModelSpec, device: str, *, seed: int = 0, passes: int | None = None
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A ``step(x, y) -> loss`` closure for ``row``: forward, backward (in ``passes`` images at a time, their
    gradients summed: the same gradient as one pass), one AdamW step."""
    model = make_model(row.lib, spec, device, seed).train()
    adamw = lambda params: torch.optim.AdamW(  # noqa: E731
        params, lr=spec.lr, fused=row.fused_adamw or None, foreach=None if row.fused_adamw else True
    )
    opt = MasterWeights(model, adamw) if row.weights == "bf16-master" else None
    if row.weights != "fp32":
        model = model.to(torch.bfloat16)
    opt = opt or adamw(list(model.parameters()))
    if row.channels_last:
        model.patch_embed.proj.to(memory_format=torch.channels_last)
    amp = device == "cuda" and row.weights == "fp32"  # on a CPU the reference is plain fp32
    autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16) if amp else nullcontext()  # noqa: E731
    kernel = lambda: sdpa_kernel(KERNELS[row.attention]) if row.attention != "auto" else nullcontext()  # noqa: E731
    forward = model
    if row.compile is not None and row.compile_scope == "model":
        forward = torch.compile(model, mode=row.compile)  # as the engine compiles
    elif row.compile is not None:  # LayerNorm and GELU fused with what is next to them, the rest eager
        for block in model.blocks:
            for name in ("norm1", "norm2", "mlp"):
                setattr(block, name, torch.compile(getattr(block, name), mode=row.compile))
    graphs = row.compile in CUDA_GRAPH_MODES

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if graphs:  # a new step: the graphs' previous outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        x = x.to(torch.bfloat16) if row.weights != "fp32" else x
        x = x.contiguous(memory_format=torch.channels_last) if row.channels_last else x
        n = passes or len(x)
        total = torch.zeros((), device=x.device)
        for start in range(0, len(x), n):
            with autocast(), kernel():
                loss = F.cross_entropy(forward(x[start : start + n]).float(), y[start : start + n])
            (loss * (n / len(x))).backward()
            total += loss.detach() * (n / len(x))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return step


def curve_data(spec: ModelSpec, device: str, scale: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """16 fixed batches of random images with random labels (seeded apart from the weights); at ``scale``,
    batches of ``scale`` of them."""
    g = torch.Generator(device=device).manual_seed(1234)
    shape = (spec.batch, 3, spec.img_size, spec.img_size)
    base = [
        (
            torch.randn(shape, device=device, generator=g),
            torch.randint(0, spec.classes, (spec.batch,), device=device, generator=g),
        )
        for _ in range(16)
    ]
    if scale == 1:
        return base
    return [
        (
            torch.cat([base[(i * scale + j) % 16][0] for j in range(scale)]),
            torch.cat([base[(i * scale + j) % 16][1] for j in range(scale)]),
        )
        for i in range(16)
    ]


def curve(
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: list[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
) -> list[float]:
    """The training losses of ``steps`` steps over ``data`` in turn."""
    return [float(step(*data[i % len(data)])) for i in range(steps)]


def smoothed(losses: list[float], k: int = 10) -> list[float]:
    return [sum(losses[i : i + k]) / k for i in range(0, len(losses) - k + 1, k)]


def mean_gap(a: list[float], b: list[float]) -> float:
    """Mean absolute difference of two curves' 10-step means."""
    sa, sb = smoothed(a), smoothed(b)
    return sum(abs(u - v) for u, v in zip(sa, sb, strict=True)) / len(sa)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_steps(
    step: Callable, x: torch.Tensor, y: torch.Tensor, device: str, *, repeats: int = 3, iters: int = 5
) -> float:
    """Seconds per training step on ``(x, y)`` (median of ``repeats`` timings of ``iters`` steps, after two
    warm-up steps)."""
    for _ in range(2):
        step(x, y)
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            step(x, y)
        _sync(device)
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)
