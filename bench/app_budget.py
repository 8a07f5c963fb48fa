"""Where one Classify request's time goes: the app's own steps for a new photo, timed one by one in process.

    python -m bench.app_budget [--model PATH_OR_REPO] [--device cpu|cuda] [--repeats 20]

Each copy of ``examples/cat_chelsea.jpg`` (451x300, a JPEG with its corner changed so that nothing is cached)
goes through the same functions ``webapp.tabs.classify.answer`` calls, in its order, each step timed on its own
(the device synchronised after each): reading the upload (bytes, SHA-256, header), decoding, preprocessing
(resize, crop, normalise), the model's views (``calibration.predict``: the views the model was calibrated for,
with their attentions and the OOD score), the default map (``analysis.relevance``), drawing the overlay with its
colour bar (``render.map_on_image``) and encoding it as Gradio does. A plain forward pass of one view is timed
too, for the cost of one view. ``python -m bench.bench_app`` prints this table beside its end-to-end times, and the
share left over there (end to end minus these steps) is Gradio's: upload, queue, events, download.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

import app
from vit_core.calibration import calibrated_views, predict
from webapp import analysis, render
from webapp.catalog import ROOT
from webapp.settings import parse_settings
from webapp.ui.context import Context

PHOTO = ROOT / "examples" / "cat_chelsea.jpg"
# The steps outside the model, whose sum issue #53 bounds at 15 ms on the CPU for this photo.
NON_MODEL = ("read", "decode", "preprocess", "overlay", "encode")


def copies(folder: Path, n: int, start: int = 0) -> list[str]:
    """``n`` JPEG copies of the photo (quality 95, as a camera or phone saves one), each with its top-left 8x8
    block changed (copies ``start`` to ``start + n - 1``): files the app has not seen."""
    photo = Image.open(PHOTO).convert("RGB")
    paths = []
    for i in range(start, start + n):
        photo.paste((i % 256, i // 256 % 256, 0), (0, 0, 8, 8))
        paths.append(folder / f"cat_{i}.jpg")
        photo.save(paths[-1], quality=95)
    return [str(p) for p in paths]


def measure_steps(ctx: Context, files: list[str]) -> dict[str, float]:
    """Median milliseconds of each step of a new photo's Classify on ``ctx``'s default model, over ``files``
    (the first one a warm-up)."""
    model, transform = ctx.models.get(ctx.models.default)
    device = ctx.device
    settings = parse_settings(model, ctx.default_method.title)
    times: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], object]) -> object:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.setdefault(name, []).append((time.perf_counter() - t0) * 1000)
        return out

    for f in files:
        upload = analysis.Upload(f)
        header = timed("read", lambda u=upload: (u.digest, u.header)[1])
        img = timed("decode", lambda u=upload: analysis.decode(u.file(), transform))
        x = timed("preprocess", lambda i=img: transform(i).unsqueeze(0).to(device))
        with torch.inference_mode(), analysis.autocast(device):
            timed("one view's forward", lambda x=x: model(x))
        with analysis.autocast(device):
            p = timed("model views", lambda x=x: predict(model, x, return_attention=True))
        a = analysis.Analysis(
            model=model,
            shown=render.display_copy(img, analysis.MAX_SIDE),
            size=header.size,
            crop=tuple(transform.crop_box(*header.size)),
            x=x.cpu(),
            probs=p.probs[0].float().cpu(),
            attentions=[t.float().cpu() for t in p.attentions],
        )
        heat = timed("map", lambda a=a: analysis.relevance(a, settings, device))
        overlay = timed("overlay", lambda a=a, h=heat: render.map_on_image(a.shown, a.box, h, 0.5, "map"))
        timed("encode", lambda o=overlay: o.save(io.BytesIO(), render.OVERLAY_FORMAT))
    out = {name: statistics.median(t[1:]) for name, t in times.items()}
    out["views"] = len(calibrated_views(model))
    return out


def table(steps: dict[str, float], end_to_end: float | None = None) -> str:
    """The steps as a Markdown table, with Gradio's share when the end-to-end median is known."""
    rows = [
        ("read the upload (bytes, SHA-256, header)", steps["read"]),
        ("decode", steps["decode"]),
        ("preprocess (resize, crop, normalise, to the device)", steps["preprocess"]),
        (f"model: {steps['views']:g} views, attentions, OOD score", steps["model views"]),
        ("  (one view's plain forward, for scale)", steps["one view's forward"]),
        ("default map", steps["map"]),
        ("overlay and colour bar", steps["overlay"]),
        (f"encode the overlay ({render.OVERLAY_FORMAT.upper()})", steps["encode"]),
    ]
    total = sum(v for name, v in steps.items() if name not in ("views", "one view's forward"))
    non_model = sum(steps[name] for name in NON_MODEL)
    lines = ["| step | ms |", "|---|---:|", *(f"| {name} | {ms:.1f} |" for name, ms in rows)]
    lines.append(f"| **the app's steps** | **{total:.1f}** |")
    lines.append(f"| outside the model (read, decode, preprocess, overlay, encode) | {non_model:.1f} |")
    if end_to_end is not None:
        gradio = end_to_end - total
        lines.append(f"| Gradio and the client (end to end {end_to_end:.1f} minus the steps) | {gradio:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bundled")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    ctx = app.setup(args.model, args.device)
    with tempfile.TemporaryDirectory() as tmp:
        steps = measure_steps(ctx, copies(Path(tmp), args.repeats + 1))
    print(f"model: {args.model}, device {args.device}, threads {torch.get_num_threads()}, medians of {args.repeats}")
    print(table(steps))


if __name__ == "__main__":
    main()
