"""torchrun with one process (NCCL on a GPU, gloo on a CPU), killed and resumed, against one plain process.

    python -m bench.torchrun_resume                  # CPU: gloo
    python -m bench.torchrun_resume --device cuda    # GPU: NCCL

Trains the ``mnist_tiny`` recipe (7,930 parameters) for ``--epochs`` epochs of ``--steps`` steps (500 steps
by default) on a generated image folder of ten classes (squares of ten sizes), three ways:

1. ``python -m train``: one process, no process group, to the end;
2. ``torchrun --nproc_per_node 1 -m train``: the process joins a group (DDP over NCCL or gloo) and the whole
   launcher is killed with SIGKILL once ``--kill-after`` epochs are committed;
3. ``torchrun --nproc_per_node 1 -m train --resume``: continues the killed run to the end.

It prints each epoch's train and test loss of run 1 and of runs 2+3, and the largest difference in the final
weights. A resume restores every RNG and DDP with one process sums gradients over one process, so on a CPU the
two must be bit-identical; CUDA kernels may reorder floating-point sums, so there the check allows ``--rtol``.
Exits 1 when they differ by more.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
CLASSES = 10


def make_folder(root: Path, n_train: int, seed: int = 0) -> Path:
    """``root/{train,test}/class_k/*.png``: 28x28 grey noise with a bright square of side 4 + 2k somewhere."""
    g = torch.Generator().manual_seed(seed)
    for split, n in (("train", n_train), ("test", max(n_train // 4, CLASSES))):
        for i in range(n):
            k, img = i % CLASSES, torch.rand(28, 28, generator=g) * 0.3
            side = 4 + 2 * k
            r, c = torch.randint(0, 29 - side, (2,), generator=g).tolist()
            img[r : r + side, c : c + side] += 0.7
            folder = root / split / f"class_{k}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray((img * 255).byte().numpy(), mode="L").save(folder / f"{i}.png")
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _epochs_done(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def _train_args(data: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [
        "-m", "train", "--recipe", "mnist_tiny", "--data", str(data), "--out", str(out),
        "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--no-progress",
        "--set", f"device={args.device!r}", "warmup_epochs=1",
    ]  # fmt: skip


def _torchrun(port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port)]  # fmt: skip


def _run(cmd: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{log.read_text()[-3000:]}")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts its workers in sessions of their own)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


def _run_and_kill(cmd: list[str], env: dict[str, str], log: Path, run: Path, after: int) -> float:
    """Start ``cmd`` and SIGKILL it with every process below it once ``after`` epochs are committed, as a
    machine failure would; returns the seconds it ran."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 1800
            while _epochs_done(run) < after and proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            if proc.poll() is not None:
                raise SystemExit(f"the torchrun run ended before it was killed:\n{log.read_text()[-3000:]}")
        finally:
            for pid in [*reversed(_descendants(proc.pid)), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()
    return time.perf_counter() - t0


def compare(device: str, epochs: int, kill_after: int, batch_size: int, n_train: int, work: Path) -> dict:
    """Run the three trainings in ``work``; return their per-epoch metrics and the weights' largest difference."""
    args = argparse.Namespace(device=device, epochs=epochs, batch_size=batch_size)
    data = make_folder(work / "data", n_train)
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    plain, ddp = work / "plain", work / "torchrun"
    _run([sys.executable, *_train_args(data, plain, args)], env, work / "plain.log")
    killed_s = _run_and_kill(
        _torchrun(_free_port()) + _train_args(data, ddp, args), env, work / "killed.log", ddp, kill_after
    )
    killed_at = torch.load(ddp / "checkpoint.pt", map_location="cpu", weights_only=True)["epoch"]
    _run(
        [*_torchrun(_free_port()), "-m", "train", "--resume", "--out", str(ddp), "--no-progress"],
        env,
        work / "resumed.log",
    )
    runs = {"plain": plain, "torchrun": ddp}
    rows = {name: [json.loads(line) for line in (run / "metrics.jsonl").open()] for name, run in runs.items()}
    a, b = load_file(plain / "model.safetensors"), load_file(ddp / "model.safetensors")
    weight_diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    started = (work / "killed.log").read_text()
    return {
        "rows": rows,
        "weight_diff": weight_diff,
        "killed_at": killed_at,
        "killed_after_s": killed_s,
        "steps_per_epoch": -(-n_train // batch_size),
        "group": next((line for line in started.splitlines() if "process(es)" in line), "?"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--kill-after", type=int, default=2, help="kill once this many epochs are committed")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=125, help="steps per epoch (the folder holds steps x batch images)")
    p.add_argument("--rtol", type=float, default=None, help="allowed relative loss difference (0 on CPU, 1e-3 on CUDA)")
    args = p.parse_args()
    rtol = args.rtol if args.rtol is not None else (0.0 if args.device == "cpu" else 1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        r = compare(args.device, args.epochs, args.kill_after, args.batch_size, args.steps * args.batch_size, Path(tmp))
    print(f"torch {torch.__version__}, device {args.device}; torchrun run: {r['group'].split(', ', 1)[-1]}")
    print(
        f"{args.epochs} epochs x {r['steps_per_epoch']} steps of batch {args.batch_size}; torchrun and its worker were "
        f"SIGKILLed after {r['killed_after_s']:.1f} s with epoch {r['killed_at']} committed, then resumed"
    )
    print(f"{'epoch':>5s} | {'train loss plain':>17s} {'torchrun':>17s} | {'test loss plain':>17s} {'torchrun':>17s}")
    worst = 0.0
    for x, y in zip(r["rows"]["plain"], r["rows"]["torchrun"], strict=True):
        for key in ("train_loss", "test_loss"):
            worst = max(worst, abs(x[key] - y[key]) / abs(x[key]))
        losses = " | ".join(f"{x[key]:17.12f} {y[key]:17.12f}" for key in ("train_loss", "test_loss"))
        print(f"{x['epoch']:5d} | {losses}")
    same = worst <= rtol
    print(f"largest relative loss difference {worst:.3g} (allowed {rtol:g}), weight difference {r['weight_diff']:.3g}")
    print("SAME LOSSES" if same else "LOSSES DIFFER")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
