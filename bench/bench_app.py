"""Latency of one classify call in the app, against Gradio's own round trip, measured in one run.

    python -m bench.bench_app [--model PATH_OR_REPO] [--device cpu [cuda]] [--repeats 20]

Starts the app and a Gradio identity app (image in, the same image out) on 127.0.0.1, sends copies of
``examples/cat_chelsea.jpg`` (451x300, each with its corner changed and saved as JPEG, so that the app's cache of
analyses answers none) to both with ``gradio_client`` from a process of its own (a client in the servers' process
would compete with them for Python's lock), and prints medians of:
- compute: decode + model (the views the model was calibrated for) + the default map inside the app, what the
  UI shows as the time taken for a new photo, target <= 100 ms on CPU;
- end to end: request to overlay file through gradio_client, for the app and for the identity app,
  and their ratio (target <= 2);
- where a new photo's time goes: each of the app's steps (``bench.app_budget``), and Gradio's share, the end to
  end time less those steps;
- the time to the first answer and to the full answer (``vit_core.explain.answer``, in process, as
  ``bench.app_budget`` measures them), as multiples of one plain forward pass measured beside them
  (``--model vit-b16``: a ViT-B/16 with seeded random weights, ``bench.app_budget.seeded_b16``).

With several devices (``--device cpu cuda``) the app is started on each in turn, and the last lines give each
device's times as ratios to the first's.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import gradio as gr
import torch
from gradio_client import Client, handle_file

import app

from .app_budget import PHOTO, answers_table, copies, measure_answers, measure_steps, seeded_b16, table


def client_times(url: str, api_name: str, files: list[str]) -> tuple[list[float], list[float]]:
    """Run in a process of its own: milliseconds end to end per call of ``api_name`` on ``files`` and, for
    /classify, the compute time the app reports, without the first call (a warm-up)."""
    client = Client(url, verbose=False)
    ends, computes = [], []
    for f in files:
        t0 = time.perf_counter()
        out = client.predict(handle_file(f), api_name=api_name)
        ends.append((time.perf_counter() - t0) * 1000)
        if api_name == "/classify":
            _, overlay, compute_ms, *_ = out
            assert Path(overlay).is_file()
            computes.append(compute_ms)
    return ends[1:], computes[1:]


def measure(model: str, device: str, files: list[str], more: list[str], others: list[str]) -> dict:
    """Start the app on ``device`` and an identity app; the medians of their times over ``files``, of each
    of the app's steps (``bench.app_budget``) over ``more``, and of the first and full answers over ``others``."""
    ctx = app.setup(model, device)
    ours = app.build_ui(ctx)
    ours.queue(default_concurrency_limit=1)
    ours.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True)
    identity = gr.Interface(
        lambda path: path, gr.Image(type="filepath"), gr.Image(type="filepath"), api_name="identity"
    )
    identity.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True)
    try:
        with multiprocessing.get_context("spawn").Pool(1) as client:
            ends, computes = client.apply(client_times, (ours.local_url, "/classify", files))
            ends_id, _ = client.apply(client_times, (identity.local_url, "/identity", files))
        loaded, _ = ctx.models.get(ctx.models.default)
        return {
            "steps": measure_steps(ctx, more),
            "answers": measure_answers(ctx, others),
            "model": f"{loaded.num_params():,} parameters",
            "threads": torch.get_num_threads(),
            "compute": statistics.median(computes),
            "end": statistics.median(ends),
            "identity": statistics.median(ends_id),
        }
    finally:
        ours.close()
        identity.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="bundled")
    p.add_argument("--device", default=["cpu"], nargs="+", choices=["cpu", "cuda"])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    model = seeded_b16() if args.model == "vit-b16" else args.model

    with tempfile.TemporaryDirectory() as tmp:
        n = args.repeats + 1  # new copies for each device and use: the app's cache of analyses is the process's
        runs = {
            d: measure(model, d, *(copies(Path(tmp), n, (3 * i + k) * n) for k in range(3)))
            for i, d in enumerate(args.device)
        }
    for device, r in runs.items():
        gpu = f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""
        print(
            f"model: {args.model} ({r['model']}), device {device}{gpu}, threads {r['threads']}, "
            f"photo {PHOTO.name} 451x300, {args.repeats} new copies, medians"
        )
        print(f"compute (in the app, as shown):        {r['compute']:7.1f} ms   target <= 100 ms")
        print(f"end to end, app /classify:             {r['end']:7.1f} ms")
        print(f"end to end, Gradio identity function:  {r['identity']:7.1f} ms")
        print(f"ratio app / identity:                  {r['end'] / r['identity']:7.2f}      target <= 2")
        print(f"where a new photo's time goes on {device} (bench.app_budget, medians):")
        print(table(r["steps"], r["end"]))
        print(f"the first answer first on {device} (vit_core.explain.answer, medians):")
        print(answers_table(r["answers"], args.model))
    first, base = next(iter(runs.items()))
    for device, r in list(runs.items())[1:]:
        print(
            f"{device} / {first}: compute {r['compute'] / base['compute']:.3f}, end to end {r['end'] / base['end']:.3f}"
        )


if __name__ == "__main__":
    main()
