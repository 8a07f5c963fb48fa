"""The Train tab's memory estimate against its training process's real peak, and its time budget against the whole
job's time, on the largest jobs the public limits allow.

    python -m bench.train_memory [--only NAMES] [--threads 1]

Each job is a zip of photos as a visitor uploads it, checked and written as the server does
(``webapp.jobs.trainset.from_zip``) and trained by the server's own trainer (``webapp.jobs.trainer.Trainer.run``: the
training process ``webapp.jobs.worker``, as the app starts it, with ``--threads`` threads). The process reports
its peak RSS (``ru_maxrss``: ``peak_bytes``); the table sets it against the Train tab's estimate for the job
(``webapp.jobs.trainset.training_bytes`` for the zip's photos, as the gate reserves it) and against the estimate before
issue 57 (``old_estimate``: what the gate reserved then, for 2,000 photos whatever the zip held), and the job's
budget against its whole time (``from_zip`` to the process's end) and its process's start (the budget runs from
there).

Jobs: every photo a 320 x 240 JPEG (what the training process keeps of any photo), but for one 40 MP WebP and one
40 MP PNG in the public-size jobs, the costliest photos to decode; two classes.

- ``small``: the bundled model, 16 photos, 0.2 minutes (the job ``tests/test_train_budget.py`` runs);
- ``bundled``: the bundled model, 2,000 photos (the public limit), 5 minutes (the public limit), the whole model
  fine-tuned (forced: the strategy whose passes hold the most, a training step, then calibration's batches of 500
  through the model; on a 2-core CPU the chooser picks the probe for it, ``bundled-auto``);
- ``vitb-full``: ViT-B/16 (random weights, 86 M parameters), 40 photos, the whole model fine-tuned (forced): a
  training step at the full batch of 32 (2,000 photos of it take hours on a CPU like this one);
- ``bundled-double``: the bundled model at twice its input size, the whole model fine-tuned, 700 photos (a
  calibration batch of 500 already, its largest pass), 5 minutes: calibrating 2,000 photos at that size takes
  longer than the public budget on a 2-core CPU, where such a job is refused before it trains.
"""

from __future__ import annotations

import argparse
import io
import math
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

import vit_core
from vit_core.models.model import VisionTransformer
from vit_core.models.variants import get_config
from webapp.inference import estimates
from webapp.jobs import trainset
from webapp.jobs.trainer import Trainer
from webapp.jobs.trainset import PUBLIC, from_zip

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "models" / "cifar10_speedrun"
MB = 2**20


@dataclass(frozen=True)
class Spec:
    """One job: the model (``bundled`` or ``vitb``), its photos, budget, size and strategy."""

    model: str
    photos: int
    minutes: float
    double: bool = False
    strategy: str = "auto"
    large: bool = False  # one 40 MP WebP and one 40 MP PNG among the photos


JOBS = {
    "small": Spec("bundled", 16, 0.2),
    "bundled": Spec("bundled", 2000, 5.0, strategy="full", large=True),
    "bundled-auto": Spec("bundled", 2000, 5.0, large=True),
    "vitb-full": Spec("vitb", 40, 4.0, strategy="full"),
    "bundled-double": Spec("bundled", 700, 5.0, double=True, strategy="full", large=True),
}


def photos_zip(path: Path, n: int, large: bool = False) -> Path:
    """``n`` photos in two classes (``c0``, ``c1``), each a little different; with ``large``, two of them 40 MP."""
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(n - 2 * large):
            buf = io.BytesIO()
            colour = (200 - 150 * (i % 2), (37 * i) % 256, 50 + 150 * (i % 2))
            Image.new("RGB", (320, 240), colour).save(buf, "JPEG", quality=90)
            zf.writestr(f"photos/c{i % 2}/{i:04d}.jpg", buf.getvalue())
        if large:
            for k, fmt in enumerate(("WEBP", "PNG")):
                buf = io.BytesIO()
                Image.new("RGB", (7999, 5000), (90, 120, 150)).save(buf, fmt)
                zf.writestr(f"photos/c{k}/large.{fmt.lower()}", buf.getvalue())
    return path


def old_estimate(cfg: vit_core.ViTConfig, params: int) -> int:
    """What the gate reserved for a training job before issue 57's measurements (``webapp.tabs.train.estimate``
    then): a 1,024 MB process, the weights three times, three forward passes of a batch of 32, 2,000 photos."""
    side = math.ceil(cfg.img_size * 1.15)
    photos = PUBLIC.max_images * 3 * side * side
    return estimates.REQUEST_BYTES + 1024 * MB + 12 * params + 3 * estimates.forward_bytes(cfg, 32) + photos


def _model(name: str, folder: Path) -> tuple[str, VisionTransformer]:
    """The job's starting checkpoint and the model it holds (ViT-B/16: random weights, saved once)."""
    if name == "bundled":
        return str(BUNDLED), vit_core.from_pretrained(str(BUNDLED))
    out = folder / "vit_base_random"
    if not out.is_dir():
        vit_core.save_pretrained(VisionTransformer(get_config("vit_base_patch16_224", num_classes=10)), out)
    return str(out), vit_core.from_pretrained(str(out))


def run_job(name: str, spec: Spec, folder: Path, threads: int) -> dict:
    """Run ``spec`` as the Train tab does; its numbers."""
    init, model = _model(spec.model, folder)
    cfg = model.config.replace(img_size=2 * model.config.img_size) if spec.double else model.config
    archive = photos_zip(folder / f"{name}.zip", spec.photos, spec.large)
    trainer = Trainer(None, folder / "runs", ttl=None, threads=threads)  # no model is registered: no registry
    job = trainer.start(name, spec.minutes)
    t0 = time.time()
    found = from_zip(archive, job.data, PUBLIC)
    first, peak, ending = None, None, "done"
    try:
        for report in trainer.run(job, init, cfg.img_size if spec.double else None, strategy=spec.strategy):
            first = first or time.time() - t0
            if "result" in report:
                peak, ending = report["peak_bytes"], report["result"]["strategy"]
    except RuntimeError as e:
        ending = f"refused: {e}"
    whole = time.time() - t0
    trainer.finish(job)
    images = found.images
    return dict(
        job=name,
        photos=images,
        old=old_estimate(cfg, model.num_params()),
        new=trainset.training_bytes(cfg, model.num_params(), images),
        peak=peak,
        budget=60 * spec.minutes,
        whole=whole,
        start=first,
        ending=ending,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated job names (default: all)")
    p.add_argument("--threads", type=int, default=1, help="the training process's threads (the app: half the cores)")
    args = p.parse_args()
    names = [n for n in JOBS if not args.only or n in args.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="train_memory_") as tmp:
        for name in names:
            print(f"- {name} ...", flush=True)
            rows.append(run_job(name, JOBS[name], Path(tmp), args.threads))
    print(
        "\n| job | photos | old estimate | new estimate | worker peak | peak / new | budget | whole job | "
        "process start | how it ended |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        peak = "-" if r["peak"] is None else f"{r['peak'] / MB:,.0f} MB"
        ratio = "-" if r["peak"] is None else f"{r['peak'] / r['new']:.2f}"
        print(
            f"| {r['job']} | {r['photos']:,} | {r['old'] / MB:,.0f} MB | {r['new'] / MB:,.0f} MB | {peak} | {ratio} | "
            f"{r['budget']:.0f} s | {r['whole']:.1f} s | {r['start'] or 0:.1f} s | {r['ending'][:90]} |"
        )


if __name__ == "__main__":
    main()
