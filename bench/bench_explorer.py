"""Latency of the explorer and of live re-renders, against a plain classify, in one run of the app.

    python -m bench.bench_explorer [--model bundled] [--device cpu|cuda] [--repeats 20]

Starts the app on 127.0.0.1 and times, through ``gradio_client`` (request to files downloaded), interleaved:

- classify, new photo: ``/classify`` on a photo the app has not seen (decode, forward pass, map, overlay);
- classify, same photo: ``/classify`` again on one photo (its forward pass is cached);
- live re-render: ``/classify`` with another opacity, the function the settings controls call (cached);
- explorer click: ``/explore`` at another point, what a click on a patch computes (cached; the click also
  redraws the picture clicked on);

all with attention rollout (the explorer's own map), and prints their medians and the ratios of the re-render
and the click to a plain classify (target <= 1.5).
Then the same in-process, without HTTP: what the page's handlers compute (``classify``; for a click, ``point``,
the click to image pixels, then ``redraw``, which also redraws the picture clicked on, with the patch outlined).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from gradio_client import Client, handle_file
from PIL import Image

import app
from vit_core.explain.methods import ROLLOUT
from webapp.inference import render
from webapp.inference.settings import PREDICTED
from webapp.registry.catalog import ROOT
from webapp.tabs import classify, explore
from webapp.ui.endpoints import Context, Prepared

PHOTO = ROOT / "examples" / "cat_chelsea.jpg"


def _timed(fn, i: int) -> float:
    t0 = time.perf_counter()
    fn(i)
    return (time.perf_counter() - t0) * 1000


def _report(title: str, times: dict[str, list[float]]) -> None:
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(title)
    for name, ms in medians.items():
        print(f"  {name + ':':28s} {ms:8.1f} ms")
    plain, same = medians["classify, new photo"], medians["classify, same photo"]
    for name in ("live re-render (opacity)", "explorer click"):
        print(f"  {name} / classify, new photo:  {medians[name] / plain:5.2f}   target <= 1.5")
        print(f"  {name} / classify, same photo: {medians[name] / same:5.2f}")


def _click(ctx: Context, image: str, choice: str, click: SimpleNamespace) -> tuple:
    """A click on the explorer's picture as the page handles it: the point, then the maps and the picture."""
    subject = {"image": image, "model_choice": choice}
    x, y = explore.point(ctx, Prepared(subject, event=click))
    return explore.redraw(ctx, Prepared({**subject, "x": x, "y": y}))


def _in_process(ctx: Context, fresh: list[str], same: str, repeats: int) -> dict[str, list[float]]:
    """The UI's handlers called directly: what a click or a settings change computes on the server."""
    choice = ctx.models.default
    settings = dict(
        method=ROLLOUT.title, target=PREDICTED, layer=-1, head="mean", head_fusion="mean", discard_ratio=0.0
    )
    a = ctx.analysis(Prepared({"image": same, "model_choice": choice}))
    vw = render.fit(a.shown.size, explore.VIEW_SIDE)[0]
    left, top, right, bottom = (v * vw / a.size[0] for v in a.crop)
    clicks = [
        SimpleNamespace(index=(left + (i * 37) % max(1, int(right - left)), top + (i * 53) % max(1, int(bottom - top))))
        for i in range(repeats + 1)
    ]
    calls = {
        "classify, new photo": lambda i: classify.classify(ctx, fresh[i], choice, **settings, opacity=0.5),
        "classify, same photo": lambda i: classify.classify(ctx, same, choice, **settings, opacity=0.5),
        "live re-render (opacity)": lambda i: classify.classify(
            ctx, same, choice, *settings.values(), 0.3 + 0.6 * (i % 2), 5
        ),
        "explorer click": lambda i: _click(ctx, same, choice, clicks[i]),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(repeats + 1):  # interleaved; the first round warms up
        for name, call in calls.items():
            t = _timed(call, i)
            if i:
                times[name].append(t)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bundled")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()

    import torch

    ctx = app.setup(args.model, args.device)
    ui = app.build_ui(ctx)
    ui.queue(default_concurrency_limit=1)
    ui.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(ui.local_url, verbose=False)
        photo = Image.open(PHOTO).convert("RGB")
        w, h = photo.size
        with tempfile.TemporaryDirectory() as tmp:
            # One copy per repeat with one pixel changed: other bytes, so the app has not seen it.
            fresh, local = [], []
            for i in range(2 * (args.repeats + 1)):  # half for HTTP, half in-process
                copy = photo.copy()
                copy.putpixel((i % w, 0), (i % 256, i // 256, 0))
                copy.save(Path(tmp) / f"{i}.png")
                if i <= args.repeats:
                    fresh.append(handle_file(str(Path(tmp) / f"{i}.png")))
                else:
                    local.append(str(Path(tmp) / f"{i}.png"))
            same = handle_file(str(PHOTO))
            left = (w - min(w, h)) / 2
            points = [(left + (i * 37) % min(w, h), (i * 53) % min(w, h)) for i in range(args.repeats + 1)]
            calls = {
                "classify, new photo": lambda i: client.predict(fresh[i], method=ROLLOUT.title, api_name="/classify"),
                "classify, same photo": lambda i: client.predict(same, method=ROLLOUT.title, api_name="/classify"),
                "live re-render (opacity)": lambda i: client.predict(
                    same, method=ROLLOUT.title, opacity=0.3 + 0.6 * (i % 2), api_name="/classify"
                ),
                "explorer click": lambda i: client.predict(same, x=points[i][0], y=points[i][1], api_name="/explore"),
            }
            times: dict[str, list[float]] = {name: [] for name in calls}
            for i in range(args.repeats + 1):  # interleaved; the first round warms up
                for name, call in calls.items():
                    t = _timed(call, i)
                    if i:
                        times[name].append(t)
            handlers = _in_process(ctx, local, str(PHOTO), args.repeats)
        model, _ = ctx.models.get(ctx.models.default)
        print(
            f"model: {ctx.models.default} ({model.num_params():,} parameters), device {args.device}, "
            f"threads {torch.get_num_threads()}, photo {PHOTO.name} {w}x{h}, {args.repeats} repeats, medians"
        )
        _report("through HTTP (gradio_client: request, compute, files downloaded):", times)
        _report("in-process (the UI's handlers; the click redraws the view too):", handlers)
    finally:
        ui.close()


if __name__ == "__main__":
    main()
