"""Cost of attention rollout on top of a forward pass, and against the common hook-based recipe.

    python -m bench.bench_explain                                  # CPU fp32: Ti/16 and B/16 at 224, batch 1 and 8
    python -m bench.bench_explain --device cuda --dtype bfloat16   # GPU

Per row, three things are timed on the same weights and input:

- ``forward``: ``model(x)``, our fused-attention forward (no attention materialised);
- ``rollout``: ``vit_core.explain.attention_rollout(model, x)``: forward with ``return_attention=True``
  plus the read-out row propagated down the layers (vector-matrix products);
- ``hooks``: the common recipe (jacobgil/vit-explain): timm's VisionTransformer with fused attention
  turned off, forward hooks on every ``attn_drop`` collecting the probabilities, then the full (T, T)
  matrix product over the layers (batched here, and with the row normalisation fixed).

The three are interleaved repeat by repeat so machine noise hits them alike; the table shows median
times, the median of the per-repeat ratios, and the ratio of the fastest repeats (the least disturbed
estimate on a busy machine). Target: rollout / forward <= 1.15. The script also checks
that the rollout maps equal the hook recipe's.

``--costs`` times every relevance map instead, one image per call: ``python -m bench.bench_explain --costs
bundled vit_base_patch16_224`` (the bundled model, and ViT-B/16 at 224 with random weights). Per method the
median time per map and the median ratio to a plain forward pass timed in the same repeats (interleaved, the
order rotated). RISE is timed with the others where its ``explain.RISE_MASKS`` forward passes take under
``--rise-limit`` seconds; otherwise the table gives that many forward passes as an estimate.
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch

import vit_core
from vit_core import explain
from vit_core.explain import attention_rollout, lrp
from vit_core.models.config import TIMM_MODEL_ARGS
from webapp.registry.catalog import BUNDLED


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def hook_rollout(twin: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """vit-explain's recipe: hooks on timm's unfused attention, full matrix rollout (mean fusion)."""
    attentions = []
    hooks = [blk.attn.attn_drop.register_forward_hook(lambda m, i, o: attentions.append(o)) for blk in twin.blocks]
    try:
        with torch.no_grad():
            twin(x)
    finally:
        for h in hooks:
            h.remove()
    B, _, T, _ = attentions[0].shape
    eye = torch.eye(T, device=x.device)
    result = eye.expand(B, T, T)
    with torch.no_grad():
        for attn in attentions:
            a = (attn.float().mean(dim=1) + eye) / 2
            a = a / a.sum(dim=-1, keepdim=True)
            result = a @ result
    mask = result[:, 0, 1:]
    side = int((T - 1) ** 0.5)
    mask = mask.reshape(B, side, side)
    return mask / mask.amax(dim=(1, 2), keepdim=True)


def bench_row(name: str, batch: int, device: str, dtype: torch.dtype, repeats: int) -> dict:
    torch.manual_seed(0)
    model = vit_core.create_model(name).to(device, dtype).eval()
    twin = timm.models.vision_transformer.VisionTransformer(**{k: getattr(model.config, k) for k in TIMM_MODEL_ARGS})
    twin.load_state_dict(model.state_dict())
    twin = twin.to(device, dtype).eval()
    for blk in twin.blocks:
        blk.attn.fused_attn = False
    x = torch.randn(batch, 3, 224, 224, device=device, dtype=dtype)

    def forward():
        with torch.no_grad():
            model(x)

    fns = {"forward": forward, "rollout": lambda: attention_rollout(model, x), "hooks": lambda: hook_rollout(twin, x)}
    max_diff = (attention_rollout(model, x) - hook_rollout(twin, x)).abs().max().item()
    for fn in fns.values():  # warm-up
        fn()
    times = {k: [] for k in fns}
    for r in range(repeats):
        order = list(fns)[r % 3 :] + list(fns)[: r % 3]  # rotate who goes first
        for k in order:
            _sync(device)
            t0 = time.perf_counter()
            fns[k]()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    ratio = {k: statistics.median(a / b for a, b in zip(times[k], times["forward"], strict=True)) for k in fns}
    return {
        "model": name,
        "batch": batch,
        **{f"{k}_ms": 1000 * statistics.median(v) for k, v in times.items()},
        "rollout_ratio": ratio["rollout"],
        "hooks_ratio": ratio["hooks"],
        # The fastest repeat of each: on a busy machine the least disturbed estimate of the true cost.
        "rollout_best": min(times["rollout"]) / min(times["forward"]),
        "hooks_best": min(times["hooks"]) / min(times["forward"]),
        "max_diff": max_diff,
    }


def _interleaved(fns: dict, repeats: int, device: str) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions run in turn within each repeat, the order rotated."""
    for fn in fns.values():  # warm-up
        fn()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            _sync(device)
            t0 = time.perf_counter()
            fns[k]()
            _sync(device)
            times[k].append(time.perf_counter() - t0)
    return times


def cost_rows(name: str, device: str, repeats: int, rise_limit: float) -> list[dict]:
    """Cost of one map by every method for one image: milliseconds and the ratio to a forward pass. ``name``:
    a variant (random weights) or "bundled"."""
    torch.manual_seed(0)
    if name == "bundled":
        name, model = BUNDLED.name, vit_core.from_pretrained(BUNDLED)
    else:
        model = vit_core.create_model(name)
    model = model.to(device).eval()
    x = torch.randn(1, model.config.in_chans, *model.config.img_hw, device=device)

    def forward():
        with torch.no_grad():
            model(x)

    fns = {
        "forward": forward,
        "raw attention": lambda: explain.attention_maps(model, x, layer=-1),
        "attention rollout": lambda: explain.attention_rollout(model, x),
        "gradient rollout": lambda: explain.gradient_rollout(model, x),
        "Chefer et al.": lambda: lrp.chefer(model, x),
        "AttnLRP": lambda: lrp.attnlrp(model, x),
    }
    forward()  # warm-up, then an estimate of RISE's cost from three forward passes
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(3):
        forward()
    _sync(device)
    rise_estimate = explain.RISE_MASKS * (time.perf_counter() - t0) / 3
    if rise_estimate < rise_limit:
        fns["RISE"] = lambda: explain.rise(model, x)
    times = _interleaved(fns, repeats, device)
    rows = []
    for k, v in times.items():
        ratio = statistics.median(a / b for a, b in zip(v, times["forward"], strict=True))
        rows.append({"model": name, "method": k, "ms": 1000 * statistics.median(v), "ratio": ratio})
    if "RISE" not in fns:
        forward_ms = 1000 * statistics.median(times["forward"])
        rows.append(
            {
                "model": name,
                "method": "RISE (estimate)",
                "ms": explain.RISE_MASKS * forward_ms,
                "ratio": explain.RISE_MASKS,
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["vit_tiny_patch16_224", "vit_base_patch16_224"])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--costs", nargs="+", help="time every map on these models instead ('bundled' or a variant name)")
    p.add_argument("--rise-limit", type=float, default=120.0, help="time RISE only under this many seconds per map")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.costs:
        print(f"device={args.device} threads={torch.get_num_threads()} repeats={args.repeats} batch=1 fp32")
        print("| model | method | ms per map | ratio to a forward pass |")
        print("|---|---|---|---|")
        for name in args.costs:
            for r in cost_rows(name, args.device, args.repeats, args.rise_limit):
                print(f"| {r['model']} | {r['method']} | {r['ms']:.1f} | {r['ratio']:.2f} |", flush=True)
        return
    dtype = getattr(torch, args.dtype)
    print(f"device={args.device} dtype={args.dtype} threads={torch.get_num_threads()} repeats={args.repeats}")
    print(
        "| model | batch | forward ms | rollout ms | hooks ms | rollout/forward | hooks/forward "
        "| rollout/forward (best) | hooks/forward (best) | max map diff |"
    )
    print("|" + "---|" * 10)
    for name in args.models:
        for batch in args.batch:
            r = bench_row(name, batch, args.device, dtype, args.repeats)
            print(
                f"| {r['model']} | {r['batch']} | {r['forward_ms']:.1f} | {r['rollout_ms']:.1f} | {r['hooks_ms']:.1f} "
                f"| {r['rollout_ratio']:.3f} | {r['hooks_ratio']:.3f} "
                f"| {r['rollout_best']:.3f} | {r['hooks_best']:.3f} | {r['max_diff']:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
