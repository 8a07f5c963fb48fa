"""Command line: ``python -m train [--recipe NAME] ...``, ``python -m train eval ...``,
``python -m train calibrate ...``, ``python -m train list``.

    python -m train --recipe mnist_tiny --out runs/mnist_tiny
    python -m train --recipe cifar10_vit --epochs 5 --seed 0 --out runs/c10
    python -m train --resume --out runs/c10                       # continue a stopped run
    python -m train --recipe mnist_tiny --out runs/m --overwrite  # start over in a folder that holds a run
    python -m train --recipe cifar10_vit_cpu --init timm:vit_tiny_patch16_224 --img-size 224
    python -m train --recipe finetune_folder --data photos/ --minutes 3 --out runs/photos  # your own classes
    torchrun --nproc_per_node 4 -m train --recipe cifar10_vit     # data-parallel, same recipe
    python -m train eval --model runs/c10 --data cifar10
    python -m train eval --model runs/c10 --data cifar10 --tta flip   # average with the mirrored image
    python -m train eval --model runs/c10 --data cifar10 --split train --subset 45000 50000  # calibrate's held-out
    python -m train calibrate --model runs/c10                     # temperature + OOD threshold into config.json
    python -m train list

Errors in the input (recipe keys, data, checkpoints) end the program with a one-line message and exit
status 2; run with VIT_DEBUG=1 to see the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from vit_core.calibration import MAX_TEMPERATURE, MIN_TEMPERATURE, CalibrationOptions
from vit_core.calibration.ood import SCORES
from vit_core.data import ImageDataError
from vit_core.finetune import CARD_NAME, STRATEGIES, FinetuneOptions, Monitor, finetune_folder
from vit_core.io.calibration_file import write_calibration
from vit_core.io.files import RECIPE_NAME, CheckpointError
from vit_core.training.evaluation import (
    HELD_OUT,
    OOD_FIT,
    TTA_MODES,
    calibrate_checkpoint,
)
from vit_core.training.recipe import Recipe, RecipeError
from vit_core.training.run_folder import DiskFullError

from . import apply_overrides, fit_warmup, load_recipe, missing_start, override, prog, recipe_listing, shown
from .evaluate import run_eval
from .run import run_by_engine

USER_ERRORS = (
    RecipeError,
    CheckpointError,
    ImageDataError,
    DiskFullError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    FloatingPointError,  # a diverging loss
)


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description="Train or fine-tune a ViT from a recipe (train/recipes/). Subcommands: eval, calibrate, list.",
    )
    p.add_argument("--recipe", help="recipe name in train/recipes/ or path to a .py recipe")
    p.add_argument("--out", help="run folder (default runs/<recipe name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start a new run in an --out that is not empty: a run's own files are replaced, every other file kept",
    )
    p.add_argument("--stop-after", type=int, metavar="N", help="stop after epoch N (resume later)")
    p.add_argument("--data", help="dataset: mnist | fashion-mnist | cifar10 | a folder | hf:<name>")
    p.add_argument("--epochs", type=int)
    p.add_argument(
        "--minutes",
        type=float,
        help="wall-clock budget for the training: the schedule runs on the clock (budget_minutes)",
    )
    p.add_argument("--batch-size", type=int, help="global batch size (over all processes)")
    p.add_argument("--lr", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument("--init", help="fine-tune from a checkpoint: run folder, Hub repo id, or timm:<model name>")
    p.add_argument("--img-size", type=int, help="input resolution (with --init: position embeddings interpolated)")
    p.add_argument("--subset", type=int, metavar="N", help="train on N images (a fixed random subset)")
    p.add_argument("--eval-subset", type=int, metavar="N", help="evaluate on N test images")
    p.add_argument("--workers", type=int, help="DataLoader worker processes")
    p.add_argument(
        "--set",
        nargs="+",
        action="extend",  # `--set a=1 --set b=2` keeps both, as `--set a=1 b=2` does
        default=[],
        metavar="KEY=VALUE",
        help="any recipe key, e.g. augment.re_prob=0.25",
    )
    p.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="a folder fine-tuned within --minutes (finetune_folder): auto spends it in stages, the probe first, "
        "the best kept; the others force one way",
    )
    p.add_argument("--push-to-hub", metavar="REPO", help="upload the run to this Hugging Face Hub repo afterwards")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create a private repo")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    return p


def calibrate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{prog()} calibrate",
        description="Fit a checkpoint's temperature and out-of-distribution threshold on held-out training images "
        "and store them in its folder (config.json 'calibration', ood.safetensors). No test image is used. A "
        "temperature fitted on images the run's recipe trained on is reported, not stored.",
    )
    p.add_argument("--model", required=True, help="checkpoint or run folder (written to)")
    p.add_argument("--data", help="the dataset it was trained on (default: its recipe.json's)")
    p.add_argument(
        "--held-out",
        type=int,
        nargs=2,
        default=list(HELD_OUT),
        metavar=("START", "STOP"),
        help="training images START..STOP-1 of the fixed shuffle fit the temperature and the threshold "
        f"(default {HELD_OUT[0]} {HELD_OUT[1]}: train with --set train_subset=[0,{HELD_OUT[0]}] to keep them unseen)",
    )
    p.add_argument(
        "--fit",
        type=int,
        nargs=2,
        default=list(OOD_FIT),
        metavar=("START", "STOP"),
        help=f"training images whose features give the OOD statistics (default {OOD_FIT[0]} {OOD_FIT[1]}); the "
        "photos of the run's recipe (its 'photos') join them",
    )
    p.add_argument(
        "--without-photos",
        action="store_true",
        help="the OOD statistics from the --fit images alone, not also the recipe's training photos",
    )
    p.add_argument(
        "--tta",
        choices=(*TTA_MODES, "none"),
        default="flip",
        help="the views calibrated for, which predict() and the app then average",
    )
    p.add_argument("--ood", choices=(*SCORES, "none"), default="mahalanobis", help="the out-of-distribution score")
    p.add_argument("--keep", type=float, default=0.95, help="share of held-out images under the OOD threshold")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")
    return p


def run_train(argv: list[str]) -> None:
    args = train_parser().parse_args(argv)
    options = {  # typed by argparse: applied as they are, after --set
        "data": args.data,
        "epochs": args.epochs,
        "budget_minutes": args.minutes,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "device": args.device,
        "compile": args.compile,
        "init": args.init,
        "train_subset": args.subset,
        "eval_subset": args.eval_subset,
        "workers": args.workers,
        "model_args.img_size": args.img_size,
    }
    options = {key: value for key, value in options.items() if value is not None}
    if args.out is None:
        if args.recipe is None:
            raise RecipeError("give --recipe NAME (python -m train list) or, with --resume, the run's --out")
        args.out = str(Path("runs") / Path(args.recipe).stem)
    if args.recipe is not None:
        base = load_recipe(args.recipe)
    else:
        run_recipe = Path(args.out) / RECIPE_NAME
        if not run_recipe.is_file():
            raise RecipeError(f"no --recipe given and {run_recipe} does not exist")
        base = json.loads(run_recipe.read_text())
    if args.init is not None and base.get("init") is None:
        # a from-scratch recipe fine-tuned from --init: the checkpoint defines the architecture
        base = base | {"model": None, "model_args": {}}
    recipe, note = fit_warmup(base, args.set, override(apply_overrides(base, args.set), options))
    missing_start(recipe, base, args.recipe)
    if note and not args.resume:
        print(note, file=sys.stderr)
    recipe, world = Recipe.from_dict(recipe), int(os.environ.get("WORLD_SIZE", "1"))
    if recipe.val_fraction is not None and recipe.budget_minutes is not None and not args.resume and world == 1:
        # a folder within a budget: the strategy the measured speed affords, as the Train tab (finetune)
        finetuning = FinetuneOptions(
            minutes=recipe.budget_minutes, strategy=args.strategy, overrides=recipe.to_dict(), overwrite=args.overwrite
        )
        monitor = Monitor(progress_bar=not args.no_progress)
        r = finetune_folder(recipe.data, recipe.init, args.out, options=finetuning, monitor=monitor)
        print(f"{r.strategy_reason}; calibrated on the held-out images; wrote {shown(Path(args.out) / CARD_NAME)}")
    else:
        run_by_engine(args, recipe)
    if args.push_to_hub and int(os.environ.get("RANK", "0")) == 0:
        from vit_core.io.hub import push_to_hub

        url = push_to_hub(args.out, args.push_to_hub, private=args.private)
        print(f"pushed {args.out} to {url}")


def run_calibrate(argv: list[str]) -> None:
    args = calibrate_parser().parse_args(argv)
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        raise RecipeError(f"--model {folder}: not a checkpoint folder (calibrate writes into the folder)")
    recipe = json.loads((folder / RECIPE_NAME).read_text()) if (folder / RECIPE_NAME).is_file() else {}
    data = args.data or recipe.get("data")
    if not isinstance(data, str):
        raise RecipeError(f"{folder} has no {RECIPE_NAME} naming its data; give --data")
    held_out = tuple(args.held_out)
    seen = _trained_on(recipe, held_out) if recipe else None
    images = f"the held-out images {held_out[0]}..{held_out[1] - 1}"
    unseen = f"train with --set train_subset=[0,{held_out[0]}] to keep them unseen"
    if seen:
        print(
            f"note: the run's recipe trained on {images}: a temperature fitted there is too low for new images (they "
            f"would get overconfident probabilities), so it is measured but not stored ({unseen})",
            file=sys.stderr,
        )
    elif seen is None:
        print(
            f"note: no {RECIPE_NAME} says whether the model was trained on {images}; if it was, the stored "
            f"temperature is too low for new images ({unseen})",
            file=sys.stderr,
        )
    tta = None if args.tta == "none" else args.tta
    calibration, report = calibrate_checkpoint(
        folder,
        data,
        held_out=held_out,
        fit=tuple(args.fit),
        options=CalibrationOptions(
            tta=tta, ood=None if args.ood == "none" else args.ood, keep=args.keep, store_temperature=not seen
        ),
        seen=seen,
        photos=None if args.without_photos else recipe.get("photos"),
        batch_size=args.batch_size,
        device=args.device,
        progress=not args.no_progress,
    )
    write_calibration(folder, calibration)
    print(
        f"{folder}: temperature {report['temperature']:.4g} on {report['images']} held-out images "
        f"({tta or 'single'} views): NLL {report['nll']:.4f} -> {report['nll_calibrated']:.4f}, "
        f"ECE {report['ece']:.4f} -> {report['ece_calibrated']:.4f}" + (" (not stored)" if seen else "")
    )
    if not MIN_TEMPERATURE * 1.01 < report["temperature"] < MAX_TEMPERATURE / 1.01:
        print(
            "note: the temperature is at the end of its range: the held-out images are (nearly) all classified right "
            "with growing margins, so they cannot say how sure the model should be; use more or harder held-out images",
            file=sys.stderr,
        )
    if calibration.ood is not None:
        print(f"OOD score {calibration.ood.score}: threshold {report['threshold']:.4g} keeps {args.keep:.0%} of them")
    print(f"wrote the calibration into {folder / 'config.json'}; check it with python -m train eval --model {folder}")


def _trained_on(recipe: dict, held_out: tuple[int, int]) -> bool:
    """Whether a run's recipe (its own ``train_subset``) trained on images ``held_out`` of the fixed shuffle."""
    subset = recipe.get("train_subset")
    if subset is None:
        return True
    start, stop = (0, subset) if isinstance(subset, int) else subset
    return start < held_out[1] and held_out[0] < stop


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["list"]:
            print(recipe_listing(shutil.get_terminal_size().columns))
        elif argv[:1] == ["eval"]:
            run_eval(argv[1:])
        elif argv[:1] == ["calibrate"]:
            run_calibrate(argv[1:])
        else:
            run_train(argv)
    except USER_ERRORS as e:
        if os.environ.get("VIT_DEBUG"):
            raise
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    return 0


def _one_line(e: BaseException) -> str:
    """The message of ``e``; for an error re-raised from a DataLoader worker, the original's last line."""
    text = str(e).strip() or type(e).__name__
    if "Original Traceback" in text:
        text = text.splitlines()[-1].split(": ", 1)[-1]
    return " ".join(line.strip() for line in text.splitlines())


if __name__ == "__main__":
    raise SystemExit(main())
