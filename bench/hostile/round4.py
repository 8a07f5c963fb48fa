"""Round four (issue 66; ``--only round4`` runs it alone): connections that never speak, models pinned in memory,
a server killed mid-job, a worker stopped, and errors that must say what happened. Each case fills its ``Row``
and prints its figures.

- 20,000 idle connections from one address (two processes of 10,000, as the attack was), then a newcomer's
  ``GET /`` and the innocent client's classify; the log's growth, the RSS's, and the attacker's connections
  still open after the header timeout.
- 8 model folders through ``Models(Options(max_loaded=2))``, one image analysed by each: model objects alive
  (weak references), in this process (the registry and the cache are the server's own classes).
- a server SIGKILLed while its job trains: the worker's life after its server, the workers after the restart,
  and the half-written run folders the picker offers after it.
- a worker stopped with SIGSTOP: how long after its stop the job ends and what its visitor reads; the "try again
  in N min" another visitor is told meanwhile against the real wait.
- a zip of only ``_other`` photos, and a Hub push while ``HF_HUB_OFFLINE`` is set: the sentences.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import weakref
import zipfile
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

import vit_core
from webapp.inference import analysis
from webapp.registry.models import Models
from webapp.registry.options import Options

from .inputs import Inputs
from .load import Row
from .round3 import ATTACKER, _client, _ending, _innocent, _train, zip_of_photos
from .server import MB, Raw, Result, training_workers

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import socket, sys, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(int(sys.argv[2])):
    try:
        held.append(socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10))
    except OSError:
        break
print(len(held), flush=True)
sys.stdin.read()
open_now = 0
for s in held:
    s.setblocking(False)
    try:
        open_now += s.recv(1) != b""
    except BlockingIOError:
        open_now += 1
    except OSError:
        pass
print(open_now, flush=True)
"""


def _gone(pid: int, timeout: float) -> float | None:
    """Seconds until ``pid`` is gone (or a zombie), None if it outlives ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return time.monotonic() - t0
        except OSError:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def case_idle_connections(raw: Raw, inputs: Inputs, row: Row, n: int = 20000) -> None:
    """``n`` idle connections from one address in two processes, then a newcomer and the innocent client."""
    app = raw.app
    rss0, log0 = app.rss, app.log_bytes
    holders = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(app.port), str(n // 2)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    opened = sum(int(h.stdout.readline() or 0) for h in holders)
    rss_held = app.rss
    t0 = time.perf_counter()
    try:
        status = httpx.get(app.url + "/", timeout=30).status_code
    except httpx.HTTPError as e:
        status = type(e).__name__
    newcomer = time.perf_counter() - t0
    row.wait = _innocent(raw, inputs, n=3)
    time.sleep(12)  # past the header timeout
    still = 0
    for h in holders:
        h.stdin.close()
        still += int(h.stdout.readline() or 0)
        h.wait()
        h.stdout.close()
    row.hostile, row.refused = opened, opened - still
    row.add(Result(status == 200, f"newcomer GET / {status}", newcomer))
    row.note = (
        f"{opened:,} opened; a newcomer's GET / {status} in {newcomer:.2f} s; the innocent classify "
        f"{row.wait:.2f} s; RSS +{(rss_held - rss0) / MB:,.0f} MB while held; log +{app.log_bytes - log0:,} bytes; "
        f"{still:,} still open 12 s later"
    )


def case_models(raw: Raw, inputs: Inputs, row: Row) -> None:
    """8 model folders, one image analysed by each, ``max_loaded=2``: model objects alive."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = vit_core.ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
        folders = []
        for i in range(8):
            folders.append(str(vit_core.save_pretrained(vit_core.create_model(cfg), Path(tmp) / f"m{i}")))
        photo = Path(tmp) / "photo.png"
        Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photo)
        models = Models(torch.device("cpu"), Options(max_loaded=2, allow_any=True))
        models.set_default(folders[0])
        refs = []
        for f in folders:
            model, transform = models.get(f, wait=60)
            analysis.analyse(model, transform, models.key_of(f), str(photo), torch.device("cpu"))
            refs.append(weakref.ref(model))
            del model
        gc.collect()
        alive = sum(r() is not None for r in refs)
    row.add(Result(alive <= 3, f"{alive} of 8 alive", 0.0))
    row.note = f"max_loaded=2, 8 models each analysing an image: {alive} of 8 model objects alive (target <= 3)"


def _picker_runs(raw: Raw) -> list[str]:
    config = httpx.get(raw.app.url + "/config", timeout=30).json()
    picker = next(c for c in config["components"] if str(c["props"].get("label", "")).startswith("Model:"))
    return [str(c[1]) for c in picker["props"].get("choices", []) if "runs/app-" in str(c[1])]


def case_server_killed(raw: Raw, inputs: Inputs, row: Row) -> None:
    """SIGKILL the server 5 s into a job's training; restart it: the worker's life after it, and what is offered."""
    app = raw.app
    job = _train(_client(raw, ATTACKER), zip_of_photos(inputs, 4), minutes=1.0)
    deadline = time.time() + 300
    while not any("Training" in str(u[0]) or "step" in str(u[0]) for u in job.outputs()) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(5.0)
    workers = training_workers(app.proc.pid)
    runs = sorted(p.name for p in (ROOT / "runs").glob("app-*")) if (ROOT / "runs").is_dir() else []
    app.proc.send_signal(signal.SIGKILL)
    app.proc.wait()
    lived = [_gone(w, 60) for w in workers]
    app._start("a")
    offered = _picker_runs(raw)
    left = sorted(p.name for p in (ROOT / "runs").glob("app-*")) if (ROOT / "runs").is_dir() else []
    row.add(Result(bool(workers) and all(t is not None and t < 10 for t in lived), "worker gone", 0.0))
    row.add(Result(not offered, f"{len(offered)} half-written runs offered", 0.0))
    shown = ", ".join("never" if t is None else f"{t:.2f} s" for t in lived)
    row.note = (
        f"{len(workers)} worker(s) during the job; gone after the SIGKILL in {shown}; "
        f"{len(training_workers())} workers after the restart; run folders under runs/ at the kill {len(runs)}, "
        f"after the restart {len(set(left) & set(runs))} of them; offered by the picker {len(offered)}"
    )


def case_stopped_worker(raw: Raw, inputs: Inputs, row: Row) -> None:
    """SIGSTOP the worker while it trains: when the job ends and what its visitor reads; what others are told."""
    app = raw.app
    job = _train(_client(raw, ATTACKER), zip_of_photos(inputs, 4), minutes=1.0)
    deadline = time.time() + 300
    while not training_workers(app.proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(8.0)
    (worker,) = training_workers(app.proc.pid)
    os.kill(worker, signal.SIGSTOP)
    stopped = time.monotonic()
    other = _ending(_train(_client(raw, "198.51.100.200"), zip_of_photos(inputs, 2)))
    told = re.search(r"try again in (\d+) min", other.message)
    r = _ending(job)
    ended = time.monotonic() - stopped
    row.add(Result(ended <= 30 and "stopped answering" in r.message, r.message, ended))
    row.messages.append(f"the visitor: {r.message}")
    row.messages.append(f"another visitor meanwhile: {other.message}")
    truth = told is not None and 60 * int(told[1]) >= ended
    row.note = (
        f"ended {ended:.1f} s after its stop (target 30 s); its visitor read '{r.message[:90]}'; another was told "
        f"'{told[0] if told else other.message[:60]}' ({'true' if truth else 'not true'})"
    )


def case_errors(raw: Raw, inputs: Inputs, row: Row) -> None:
    """A zip of only ``_other`` photos to /train; a Hub push while offline (the library's call)."""
    only = inputs.folder / "only_other.zip"
    with zipfile.ZipFile(zip_of_photos(inputs, 2)) as src:
        jpeg = src.read(src.namelist()[0])
    with zipfile.ZipFile(only, "w") as zf:
        for i in range(12):
            zf.writestr(f"_other/{i}.jpg", jpeg)
    r = _ending(_train(_client(raw, ATTACKER), only))
    row.add(Result("2 class folders" in r.message, r.message, r.seconds))
    row.messages.append(f"_other only: {r.message}")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_" + "x" * 30}
    code = "import vit_core; vit_core.push_to_hub(vit_core.create_model('vit_tiny_patch16_224'), 'alice/x')"
    push = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    said = push.stderr.strip().splitlines()[-1] if push.stderr.strip() else "(nothing)"
    row.add(Result("HF_HUB_OFFLINE is set" in said and "OfflineModeIsEnabled" not in said, said, 0.0))
    row.messages.append(f"push offline: {said}")
    row.note = f"_other only: '{r.message[:70]}'; push offline: '{said[-80:]}'"


def cases(raw: Raw, inputs: Inputs) -> list:
    return [
        ("20,000 idle connections from one address", lambda row: case_idle_connections(raw, inputs, row), False),
        ("8 models through max_loaded=2", lambda row: case_models(raw, inputs, row), False),
        ("the server SIGKILLed mid-job, restarted", lambda row: case_server_killed(raw, inputs, row), False),
        ("a worker stopped with SIGSTOP", lambda row: case_stopped_worker(raw, inputs, row), False),
        ("errors: _other only, an offline push", lambda row: case_errors(raw, inputs, row), False),
    ]
