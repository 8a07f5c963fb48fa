"""The public app under hostile load, in a memory cgroup of its own: does it hold, and does it give back?

    python -m bench.hostile [--quick] [--only WORDS] [--cap-mb 5120] [--public] [--settle 30] [--app-args ...]

Starts ``python app.py --model bundled`` (no network) as a subprocess inside a cgroup v1 memory controller
capped at ``--cap-mb`` (created under /sys/fs/cgroup/memory and removed at the end; without a writable one
it says so and runs uncapped), behind one pretend proxy (``FORWARDED_HOPS=1``), with 1,000 files (27 MB) that a
killed process left in its upload folder, then sends, over plain HTTP, raw sockets and ``gradio_client``:

Round one (``bench/hostile/load.py``): a 9.3 MB zip of 64 one-colour 49.9 MP PNGs to /batch; a mixed burst of
49.9 MP requests to every compute listener at once, the API's and the page's; four rounds of five 49.9 MP
classifies at once (two with ``--quick``); 100 classifies at once from one client, and one from another client
a second later; a 1 GB upload; zips of 1,000,000 and 200,000 empty entries.

Round two (``bench/hostile/attacks.py``, issue 44): five 300 MB JSON bodies declared in Content-Length, five
chunked, three 300 MB model choices; one /batch listing 200 times a zip whose end record declares 1 entry over
150,000; 30,000 page calls with fresh session hashes (3,000 with ``--quick``); requests that used to log a
traceback each (cut-off uploads, values of the wrong type, too few values, unknown fn_index); 20 uploads cut off
at 10 of 20 MB; 100 compare requests from one address under forged X-Forwarded-For addresses; URLs as images.

Round four (``bench/hostile/round4.py``, issue 66; ``--only round4``): 20,000 idle connections from one address,
8 models through ``max_loaded=2``, the server SIGKILLed mid-job and restarted, a worker stopped with SIGSTOP, a zip
of only ``_other`` photos and an offline Hub push.

Round three (``bench/hostile/round3.py``, issue 57; ``--only round3`` runs it alone): a 2,000 x 36 MP PNG zip to
/train; Cancel while a job decodes 100 36 MP PNGs; the smallest training set (2 classes of 2 photos); ten jobs of
mixed kinds then a restart (what training holds, ``vit-train-*`` folders left); 20 new sessions a second from one
address; 200 addresses of one IPv6 /64 (the right-most X-Forwarded-For entry rotated) and a newcomer; two
streams of one session; Gradio's own cancel route naming a training visitor's session from another address.
The innocent client has an address of its own (``attacks.INNOCENT``).

For each: requests served / refused, the peak RSS above the idle baseline (VmHWM, reset before each case),
the RSS ``--settle`` seconds later, another client's classify time during the attack against the same request
alone, log bytes per hostile request, Gradio's temporary upload files left, the disk left, the tracebacks the
server logged, and whether the server is alive.
Targets: alive through all with no OOM kill; peak above baseline <= 1.5 GB for every burst; RSS after a burst <=
baseline + max(20%, 300 MB); the other client answered within 10 s during the flood; the 1 GB upload refused
at once; under 300 log bytes per hostile request; no temporary upload file left; the dead process's files gone.
Every request sends an image the server has not seen, so the cache of analyses answers none of them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from . import attacks, load, round3, round4
from .attacks import INNOCENT
from .inputs import Inputs
from .load import Row, settings
from .server import MB, App, Cgroup, Raw

PEAK_TARGET = 1536 * MB
LOG_TARGET = 300  # bytes per hostile request
STALE_FILES = 1000


def _plant_stale(root: Path) -> None:
    """What a killed app process leaves in its own folder (``tempfiles.process_folder``: ``vit-app-*``, its lock
    file no longer held): hashed upload folders and ``tmp*`` files, an hour old."""
    old = time.time() - 3600
    folder = root / "vit-app-killed" / "gradio"
    folder.mkdir(parents=True)
    (root / "vit-app-killed" / ".in-use").touch()
    for i in range(STALE_FILES):
        path = folder / (f"tmp{i:05d}" if i % 2 else f"{i:064x}/photo.jpg")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(27_000))
        os.utime(path, (old, old))
    os.utime(root / "vit-app-killed", (old, old))


def _cases(raw: Raw, app: App, inputs: Inputs, args: argparse.Namespace) -> list:
    sessions, logged = (3000, 30) if args.quick else (30000, 300)
    return [
        ("64 x 49.9 MP zip to /batch", lambda row: load.case_zip64(raw, inputs, row), True),
        ("mixed 49.9 MP burst, every listener", lambda row: load.case_mixed(raw, inputs, row), True),
        *[
            (f"five 49.9 MP classifies, round {i + 1}", lambda row: load.case_round(raw, inputs, row), True)
            for i in range(2 if args.quick else 4)
        ],
        ("100 classifies from one client", lambda row: load.case_flood(app, inputs, row), True),
        ("1 GB upload", lambda row: load.case_upload(app, 1024 * MB, row), False),
        ("zip of 1,000,000 empty entries", lambda row: load.case_entries(raw, inputs, 1_000_000, row), False),
        ("zip of 200,000 empty entries", lambda row: load.case_entries(raw, inputs, 200_000, row), False),
        ("300 MB bodies: 5 declared, 5 chunked, 3 choices", lambda row: attacks.case_bodies(raw, inputs, row), True),
        ("/batch listing a lying zip 200 times", lambda row: attacks.case_batch_parse(raw, inputs, row), True),
        (f"{sessions:,} fresh sessions", lambda row: attacks.case_sessions(raw, sessions, row), True),
        ("requests that logged tracebacks", lambda row: attacks.case_log(raw, inputs, logged, row), False),
        ("20 uploads cut off at 10 of 20 MB", lambda row: attacks.case_cut_uploads(raw, 20, row), False),
        ("100 compares under forged X-Forwarded-For", lambda row: attacks.case_spoofed(raw, inputs, row), True),
        ("an http URL as the image", lambda row: attacks.case_url(raw, inputs, row), False),
        *[(f"round3: {name}", case, burst) for name, case, burst in _round3(raw, inputs)],
        *[(f"round4: {name}", case, burst) for name, case, burst in round4.cases(raw, inputs)],
    ]


def _round3(raw: Raw, inputs: Inputs) -> list:
    return [
        ("2,000 x 36 MP PNG zip to /train", lambda row: round3.case_png_zip(raw, inputs, row), False),
        ("Cancel while decoding 100 x 36 MP", lambda row: round3.case_cancel_decoding(raw, inputs, row), True),
        ("the smallest training set, 2 x 2", lambda row: round3.case_smallest(raw, inputs, row), True),
        ("10 jobs of mixed kinds, then a restart", lambda row: round3.case_jobs_restart(raw, inputs, row), True),
        ("20 new sessions/s from one address", lambda row: round3.case_new_sessions(raw, inputs, row), True),
        ("200 addresses of one IPv6 /64", lambda row: round3.case_ipv6(raw, inputs, row), True),
        ("two streams of one session", lambda row: round3.case_two_streams(raw, inputs, row), False),
        ("Gradio's cancel route from another address", lambda row: round3.case_gradio_cancel(raw, inputs, row), False),
    ]


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="vit_hostile_"))
    cgroup = Cgroup(args.cap_mb * MB)
    inputs = Inputs(tmp)
    app = None
    rows: list[Row] = []
    try:
        extra = (["--public"] if args.public else []) + args.app_args.split()
        print(f"starting python app.py --model bundled {' '.join(extra)} {cgroup.note}", flush=True)
        _plant_stale(tmp / "gradio")
        app = App(cgroup, tmp, extra)
        print(next(line for line in app.log.read_text().splitlines() if line.startswith("memory budget")), flush=True)
        stale = sum(p.is_file() and p.stat().st_mtime < time.time() - 1800 for p in app.gradio_tmp.rglob("*"))
        raw = Raw(app)
        alone = []
        for _ in range(3):  # warm up (imports, the first request's allocations), then the reference time
            cat = raw.upload(inputs.unique_cat())
            alone.append(raw.call("classify", [cat, *settings(app.model)], headers=INNOCENT).seconds)
        time.sleep(args.settle)
        baseline, reference = app.rss, sorted(alone)[1]
        print(f"idle baseline RSS {baseline / MB:,.0f} MB; a classify alone {reference:.2f} s", flush=True)
        for name, case, burst in _cases(raw, app, inputs, args):
            if args.only and not any(word in name for word in args.only.split(",")):
                continue
            row = Row(name, burst=burst, reference=reference)
            rows.append(row)
            print(f"- {name} ...", flush=True)
            app.reset_peak()
            log_before, tracebacks_before = app.log_bytes, app.tracebacks
            try:
                case(row)
            except Exception as e:  # a dead server: recorded, the next cases say so too
                row.note += f" failed: {type(e).__name__}: {e}"
            row.alive = app.alive
            if not row.alive:
                break
            row.peak = app.peak - baseline
            row.log_bytes = 0 if "restart" in row.case else app.log_bytes - log_before
            row.tracebacks = app.tracebacks - tracebacks_before
            row.disk_free = shutil.disk_usage(tmp).free
            row.partial_files = len(app.partial_files())
            time.sleep(args.settle)
            row.after = app.rss - baseline
        return report(rows, baseline, cgroup, args, stale, app.tracebacks)
    finally:
        if app is not None:
            app.stop()
        cgroup.remove()
        shutil.rmtree(tmp, ignore_errors=True)


def report(
    rows: list[Row], baseline: int, cgroup: Cgroup, args: argparse.Namespace, stale: int, tracebacks: int
) -> int:
    settle = f"{args.settle:.0f} s after"
    print()
    print(
        f"| case | served / refused | peak above baseline | {settle} | other client's classify | log bytes a "
        "request | tmp files left | disk free | tracebacks | alive | notes |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|")
    for r in rows:
        wait = "-" if r.wait is None else f"{r.wait:.1f} s (alone {r.reference:.1f} s: x{r.wait / r.reference:.1f})"
        print(
            f"| {r.case} | {r.served} / {r.refused} | {r.peak / MB:+,.0f} MB | {r.after / MB:+,.0f} MB | {wait} | "
            f"{r.log_bytes / max(1, r.requests):,.0f} | {r.partial_files} | {r.disk_free / 2**30:,.1f} GB | "
            f"{r.tracebacks} | {'yes' if r.alive else 'NO'} | {r.note} |"
        )
    refusals = sorted({m for r in rows for m in r.messages})
    if refusals:
        print("\nrefusals, as the clients read them:")
        for m in refusals[:12]:
            print(f"  {m[:160]}")
    settle_limit = max(0.2 * baseline, 300 * MB)
    flood = next((r for r in rows if r.case.startswith("100 classifies")), None)
    upload = next((r for r in rows if r.case.startswith("1 GB")), None)
    sessions = next((r for r in rows if "new sessions/s" in r.case), None)
    ipv6 = next((r for r in rows if "IPv6" in r.case), None)
    cancel = next((r for r in rows if "cancel route" in r.case), None)
    checks = {
        "alive through all, no OOM kill": all(r.alive for r in rows) and cgroup.oom_kills() == 0,
        "peak above baseline <= 1.5 GB for every burst": all(r.peak <= PEAK_TARGET for r in rows if r.burst),
        f"RSS {settle} a burst <= baseline + {settle_limit / MB:,.0f} MB": all(
            r.after <= settle_limit for r in rows if r.burst
        ),
        "the other client answered within 10 s during the flood": flood is None
        or (flood.wait is not None and flood.wait <= 10),
        "the 1 GB upload refused at once (< 5 s)": upload is None
        or (upload.refused == 1 and (upload.seconds or 1e9) < 5),
        f"at most {LOG_TARGET} log bytes a hostile request": all(
            r.log_bytes <= LOG_TARGET * r.requests for r in rows if not r.burst or r.refused
        ),
        "no temporary upload file left": all(r.partial_files == 0 for r in rows),
        "no traceback in the server's log over the run": tracebacks == 0,
        "no vit-train-* folder left after the restart": all(r.orphans == 0 for r in rows),
        "20 new sessions/s: the innocent client's median <= 2x alone": sessions is None
        or (sessions.wait is not None and sessions.wait <= 2 * (sessions.reference or 0)),
        "a newcomer beside one IPv6 /64's 200 addresses served within 10 s": ipv6 is None
        or (ipv6.wait is not None and ipv6.wait <= 10),
        f"the {STALE_FILES:,} files of a dead process swept at start": stale == 0,
        "Gradio's cancel route refused another address, the job done": cancel is None
        or (cancel.served == 0 and "Done" in cancel.note),
    }
    print(
        f"\nbaseline {baseline / MB:,.0f} MB; OOM kills in the cgroup: {cgroup.oom_kills()}; "
        f"files of the dead process left: {stale}; tracebacks in the server's log: {tracebacks}"
    )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="two rounds of five classifies instead of four, fewer sessions")
    p.add_argument(
        "--only", default="", help="run only the cases whose names contain one of these comma-separated words"
    )
    p.add_argument("--cap-mb", type=int, default=5120, help="the app's memory cgroup limit (default 5120)")
    p.add_argument("--public", action="store_true", help="run the app with --public")
    p.add_argument("--settle", type=float, default=30.0, help="seconds between a case and its RSS reading")
    p.add_argument("--app-args", default="", help="more options for app.py, e.g. '--concurrency 4'")
    args = p.parse_args()
    raise SystemExit(run(args))


if __name__ == "__main__":
    main()
