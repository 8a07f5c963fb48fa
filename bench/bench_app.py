"""Latency of one classify call in the app, against Gradio's own round trip, measured in one run.

    python -m bench.bench_app [--model PATH_OR_REPO] [--device cpu|cuda] [--repeats 20]

Starts the app and a Gradio identity app (image in, the same image out) on 127.0.0.1, sends
``examples/cat_chelsea.jpg`` (451x300) to both with ``gradio_client``, and prints medians of:
- compute: decode + model + explanation inside the app (what the UI shows as the time taken; the forward
  pass is cached, so repeats of one photo measure the map), target <= 100 ms on CPU;
- end to end: request to overlay file through gradio_client, for the app and for the identity app,
  and their ratio (target <= 2).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import gradio as gr
from gradio_client import Client, handle_file

import app
from webapp.catalog import ROOT

PHOTO = ROOT / "examples" / "cat_chelsea.jpg"


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bundled")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()

    import torch

    ctx = app.setup(args.model, args.device)
    ours = app.build_ui(ctx)
    ours.queue(default_concurrency_limit=1)
    ours.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True)
    identity = gr.Interface(
        lambda path: path, gr.Image(type="filepath"), gr.Image(type="filepath"), api_name="identity"
    )
    identity.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True)
    try:
        c_ours = Client(ours.local_url, verbose=False)
        c_id = Client(identity.local_url, verbose=False)
        photo = handle_file(str(PHOTO))
        compute = []

        def call_ours():
            _, overlay, compute_ms, *_ = c_ours.predict(photo, api_name="/classify")
            compute.append(compute_ms)
            assert Path(overlay).is_file()

        end_ours = _median_ms(call_ours, args.repeats)
        end_id = _median_ms(lambda: c_id.predict(photo, api_name="/identity"), args.repeats)
        model, _ = ctx.models.get(ctx.models.default)
        print(
            f"model: {args.model} ({model.config.name}, {model.num_params():,} parameters), device {args.device}, "
            f"threads {torch.get_num_threads()}, photo {PHOTO.name} 451x300, {args.repeats} repeats, medians"
        )
        print(f"compute (in the app, as shown):        {statistics.median(compute[1:]):7.1f} ms   target <= 100 ms")
        print(f"end to end, app /classify:             {end_ours:7.1f} ms")
        print(f"end to end, Gradio identity function:  {end_id:7.1f} ms")
        print(f"ratio app / identity:                  {end_ours / end_id:7.2f}      target <= 2")
    finally:
        ours.close()
        identity.close()


if __name__ == "__main__":
    main()
