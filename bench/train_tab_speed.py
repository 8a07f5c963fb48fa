"""The Train tab's fine-tuning of ViT-B/16 (random weights offline: the speed, not the accuracy) on a folder of
photos, timed as the tab runs it: ``vit_core.finetune.finetune_folder`` with the tab's recipe at 224 px.

    python -m bench.train_tab_speed --data ../shared/data/photos/ants_and_bees/train --device cuda --epochs 5

Prints the wall time of the whole call (loading, training ``--epochs`` epochs, calibration, model card) and of
its training, the optimizer steps, images/s, and the held-out accuracy (chance, with random
weights). Issue #53's target on one H100/H200: at least 5 epochs of a full fine-tune of 243 photos within 60 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import vit_core
from vit_core.finetune import FinetuneOptions, finetune_folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a folder of <class>/<images>")
    p.add_argument("--model", default="vit_base_patch16_224", help="a timm variant name, random weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the model (the recipe's compile key)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        init = Path(tmp) / "init"
        vit_core.save_pretrained(vit_core.create_model(args.model), init)
        t0 = time.time()
        overrides = {"device": args.device, "compile": args.compile, "epochs": args.epochs}
        r = finetune_folder(
            args.data, init, Path(tmp) / "run", options=FinetuneOptions(minutes=None, overrides=overrides)
        )
        wall = time.time() - t0
    epochs = len(r.history)
    gpu = f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""
    print(
        f"{args.model} on {args.data} ({r.train_images} train / {r.val_images} held out), device {args.device}{gpu}, "
        f"{args.epochs} epochs, compile {args.compile}"
    )
    print(
        f"whole call {wall:.1f} s, training {r.train_seconds:.1f} s: {r.steps} steps, {epochs} epochs, "
        f"{epochs * r.train_images / r.train_seconds:.0f} images/s; held-out {r.val_accuracy:.1f}% (random weights)"
    )
    print(f"target: >= 5 epochs within 60 s: {'MET' if epochs >= 5 and wall <= 60 else 'NOT MET'}")


if __name__ == "__main__":
    main()
