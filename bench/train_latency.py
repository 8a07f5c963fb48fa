"""A visitor's Classify while another trains: its latency alone and during a training job, measured in one run.

    python -m bench.train_latency [--per-class 40] [--minutes 1.0] [--repeats 10]

Starts ``python app.py --public`` on 127.0.0.1 (no network), times ``/classify`` of ``examples/cat_chelsea.jpg``
from a second client alone, then while a first client's ``/train`` fine-tunes the bundled model on
``--per-class`` photos of each class of ``../shared/data/photos/ants_and_bees/train`` (the Train tab's job runs
in a process of its own with half the CPU threads, ``webapp.jobs.trainer``); a third ``/train`` meanwhile must be
refused ("a training job is running"). Prints the medians and their ratio (during / alone).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from gradio_client import Client, handle_file

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT.parent / "shared" / "data" / "photos" / "ants_and_bees" / "train"
CAT = ROOT / "examples" / "cat_chelsea.jpg"
BUNDLED = "bundled: CIFAR-10 hybrid ViT"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _zip(path: Path, per_class: int) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for folder in sorted(PHOTOS.iterdir()):
            for photo in sorted(folder.iterdir())[:per_class]:
                zf.write(photo, f"{folder.name}/{photo.name}")
    return path


def _timed(client: Client, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        client.predict(handle_file(str(CAT)), api_name="/classify")
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--per-class", type=int, default=40)
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    if not PHOTOS.is_dir():
        raise SystemExit(f"{PHOTOS} is absent")
    tmp = Path(tempfile.mkdtemp(prefix="train-latency-"))
    port = _free_port()
    env = os.environ | {"HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    command = [sys.executable, str(ROOT / "app.py"), "--public", "--host", "127.0.0.1", "--port", str(port)]
    with (tmp / "app.log").open("w") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url, deadline, second = f"http://127.0.0.1:{port}/", time.time() + 600, None
        while second is None and time.time() < deadline:
            try:
                second = Client(url, verbose=False)
            except Exception:
                time.sleep(1)
        if second is None:
            raise SystemExit("the app did not start within 600 s")
        _timed(second, 2)  # warm
        alone = _timed(second, args.repeats)
        photos = handle_file(str(_zip(tmp / "photos.zip", args.per_class)))
        job = Client(url, verbose=False).submit(photos, BUNDLED, args.minutes, False, api_name="/train")
        while not (job.outputs() and str(job.outputs()[-1][0]).startswith("Training")):
            time.sleep(0.5)  # the job has decoded its photos and its process is training
        # refused in its progress line (the first output), every other output unchanged
        line = str(Client(url, verbose=False).predict(photos, BUNDLED, args.minutes, False, api_name="/train")[0])
        print(f"a second training job: {line[:120]}" if line.startswith("⚠️") else "a second job was NOT refused")
        during = []
        while not job.done():
            during += _timed(second, 1)
        print(f"training updates streamed: {len(job.outputs())}; last: {str(job.outputs()[-1][2])[:100]!r}")
        med = [statistics.median(x) * 1000 for x in (alone, during)]
        print(f"classify alone:           median {med[0]:.0f} ms (n={len(alone)}, max {max(alone) * 1000:.0f})")
        print(f"classify during training: median {med[1]:.0f} ms (n={len(during)}, max {max(during) * 1000:.0f})")
        print(f"ratio during / alone: {med[1] / med[0]:.2f} ({os.cpu_count()} CPUs)")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
