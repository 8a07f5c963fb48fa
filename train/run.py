"""``python -m train``'s run of a recipe by the engine: ``engine.train`` as the command line says, its interruption
and a full disk in plain words, then the calibration and model card of a run with a held-out split."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vit_core.finetune import CARD_NAME, finish_run
from vit_core.io.files import CHECKPOINT_NAME
from vit_core.training.engine import train
from vit_core.training.recipe import Recipe
from vit_core.training.run_folder import DiskFullError


def run_by_engine(args: argparse.Namespace, recipe: Recipe) -> None:
    """``engine.train`` on ``recipe`` as the command line says, then ``finish_run`` for a run with a held-out split."""
    resume = f"python -m train --resume --out {args.out}"
    try:
        result = train(
            recipe,
            args.out,
            resume=args.resume,
            stop_after=args.stop_after,
            progress=not args.no_progress,
            overwrite=args.overwrite,
        )
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with: {resume}", file=sys.stderr)
        raise SystemExit(130) from None
    except DiskFullError as e:
        then = (
            f"continue with: {resume}"
            if (Path(args.out) / CHECKPOINT_NAME).is_file()
            else "start it again with --overwrite"
        )
        raise DiskFullError(f"{e}; free some space, then {then}") from None
    if recipe.val_fraction is not None and int(os.environ.get("RANK", "0")) == 0:
        # the held-out images calibrate the model, and the folder gets its model card (vit_core.finetune)
        finish_run(Path(args.out), recipe, result, calibrate=result.stopped != "asked", progress=not args.no_progress)
        print(f"calibrated on the held-out images; wrote {Path(args.out) / CARD_NAME}")
