"""The app under attack: ``python app.py --model bundled`` in a memory cgroup of its own, and the app's queue
over plain HTTP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from .inputs import ROOT

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
MB = 2**20


class Cgroup:
    """A cgroup v1 memory controller of our own, capped at ``limit`` bytes; ``None`` path when not writable."""

    def __init__(self, limit: int) -> None:
        self.path: Path | None = CGROUP_ROOT / f"vit_core_hostile_{os.getpid()}"
        try:
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit))
            self.note = f"in its own memory cgroup capped at {limit / MB:,.0f} MB ({self.path})"
        except OSError as e:
            self.path = None
            self.note = (
                f"NOT capped: cannot create a cgroup v1 memory controller under {CGROUP_ROOT} ({e.strerror}); "
                "run as root on a machine with a writable cgroup v1 memory hierarchy to cap it"
            )

    def enter(self) -> None:
        """In the child before exec: move this process into the cgroup."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        if self.path is None:
            return 0
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class App:
    """``python app.py --model bundled`` in ``cgroup``, its temporary files under ``tmp``, behind one proxy
    (``FORWARDED_HOPS=1``: the right-most ``X-Forwarded-For`` entry is the client's address, as on a Space)."""

    def __init__(self, cgroup: Cgroup, tmp: Path, extra: list[str]) -> None:
        self.port, self.cgroup, self.log = _free_port(), cgroup, tmp / "app.log"
        self.gradio_tmp, self.tmpdir = tmp / "gradio", tmp / "tmp"
        self.tmpdir.mkdir(exist_ok=True)
        env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "FORWARDED_HOPS": "1"}
        env["GRADIO_TEMP_DIR"], env["TMPDIR"] = str(self.gradio_tmp), str(self.tmpdir)  # training's vit-train-*
        self.cmd = [sys.executable, str(ROOT / "app.py"), "--model", "bundled", "--port", str(self.port), *extra]
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self._start("w")

    def restart(self) -> None:
        """Stop the app (as a Space's restart does: SIGTERM) and start it again, its log appended."""
        self.stop()
        self._start("a")

    def _start(self, mode: str) -> None:
        with self.log.open(mode) as out:
            self.proc = subprocess.Popen(
                self.cmd,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=self.cgroup.enter,
            )
        deadline = time.time() + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the app exited:\n{self.log.read_text()}")
            try:
                httpx.get(f"{self.url}/gradio_api/info", timeout=5).raise_for_status()
                break
            except httpx.HTTPError:
                time.sleep(1)
        config = httpx.get(f"{self.url}/config", timeout=30).json()
        self.fn = {d["api_name"]: i for i, d in enumerate(config["dependencies"]) if d.get("api_name")}
        picker = next(c for c in config["components"] if str(c["props"].get("label", "")).startswith("Model:"))
        self.model = picker["props"]["value"]

    def _status(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(key)

    @property
    def rss(self) -> int:
        return self._status("VmRSS")

    @property
    def peak(self) -> int:
        return self._status("VmHWM")

    def reset_peak(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS

    @property
    def tracebacks(self) -> int:
        return self.log.read_text(errors="replace").count("Traceback (most recent call last)")

    @property
    def log_bytes(self) -> int:
        return self.log.stat().st_size

    def partial_files(self) -> list[Path]:
        """Gradio's temporary upload files (``tmp*``) in the app's upload folders (each process's own,
        ``tempfiles.process_folder``): what cut-off uploads leave."""
        return list(self.gradio_tmp.glob("vit-app-*/gradio/tmp*"))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Result:
    ok: bool
    message: str
    seconds: float
    output: list | None = None


class Raw:
    """The app's queue over plain HTTP, each call in a session of its own (so UI-only listeners are reachable
    as a browser reaches them)."""

    def __init__(self, app: App) -> None:
        self.app, self.base = app, f"{app.url}/gradio_api"

    def upload(self, path: Path) -> dict:
        with path.open("rb") as f:
            r = httpx.post(f"{self.base}/upload", files={"files": (path.name, f)}, timeout=300)
        r.raise_for_status()
        return {"path": r.json()[0], "meta": {"_type": "gradio.FileData"}, "orig_name": path.name}

    def call(self, api_name: str, data: list, event_data: dict | None = None, headers: dict | None = None) -> Result:
        session, t0 = uuid.uuid4().hex, time.perf_counter()
        body = {"data": data, "fn_index": self.app.fn[api_name], "session_hash": session, "event_data": event_data}
        try:
            r = httpx.post(f"{self.base}/queue/join", json=body, headers=headers, timeout=60)
            if r.status_code != 200:
                return Result(False, f"HTTP {r.status_code}: {r.text[:120]}", time.perf_counter() - t0)
            with httpx.stream("GET", f"{self.base}/queue/data", params={"session_hash": session}, timeout=600) as s:
                for line in s.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    msg = json.loads(line[5:])
                    if msg.get("msg") == "process_completed":
                        out = msg.get("output") or {}
                        ok = bool(msg.get("success")) and "error" not in out
                        text = str(out.get("error") if not ok else "")
                        return Result(ok, text, time.perf_counter() - t0, out.get("data"))
        except httpx.HTTPError as e:
            return Result(False, f"{type(e).__name__}: {e}", time.perf_counter() - t0)
        return Result(False, "stream ended", time.perf_counter() - t0)


def training_workers(parent: int | None = None) -> list[int]:
    """The live training processes (``webapp.jobs.worker``, not zombies), those whose parent is ``parent`` when
    given: ``/proc`` read directly, so that a worker the app lost track of is counted too."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if b"webapp.jobs.worker" in cmdline and fields[0] != "Z" and (parent is None or int(fields[1]) == parent):
            found.append(int(stat.parent.name))
    return found
