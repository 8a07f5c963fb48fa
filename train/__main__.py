"""Command line: ``python -m train [--recipe NAME] ...``, ``python -m train eval ...``, ``python -m train list``.

    python -m train --recipe mnist_tiny --out runs/mnist_tiny
    python -m train --recipe cifar10_vit --epochs 5 --seed 0 --out runs/c10
    python -m train --resume --out runs/c10                       # continue a stopped run
    python -m train --recipe mnist_tiny --out runs/m --overwrite  # start over in a folder that holds a run
    python -m train --recipe cifar10_vit_cpu --init timm:vit_tiny_patch16_224 --img-size 224
    torchrun --nproc_per_node 4 -m train --recipe cifar10_vit     # data-parallel, same recipe
    python -m train eval --model runs/c10 --data cifar10
    python -m train eval --model runs/c10 --data cifar10 --tta flip   # average with the mirrored image
    python -m train list

Errors in the input (recipe keys, data, checkpoints) end the program with a one-line message and exit
status 2; run with VIT_DEBUG=1 to see the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vit_core.checkpoint import CheckpointError
from vit_core.data import ImageDataError
from vit_core.engine import train
from vit_core.evaluation import TTA_MODES, evaluate_checkpoint, format_confusion, write_eval
from vit_core.recipe import Recipe, RecipeError
from vit_core.run_folder import CHECKPOINT_NAME, RECIPE_NAME, DiskFullError

from . import apply_overrides, fit_warmup, list_recipes, load_recipe, override

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
        prog="python -m train",
        description="Train or fine-tune a ViT from a recipe (train/recipes/). Subcommands: eval, list.",
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
    p.add_argument("--push-to-hub", metavar="REPO", help="upload the run to this Hugging Face Hub repo afterwards")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create a private repo")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    return p


def eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m train eval", description="Evaluate a checkpoint on a dataset split.")
    p.add_argument("--model", required=True, help="run folder, checkpoint folder, Hub repo id, or timm:<name>")
    p.add_argument("--data", required=True, help="dataset: mnist | fashion-mnist | cifar10 | a folder | hf:<name>")
    p.add_argument("--split", default="test", choices=("train", "test", "val"))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--subset", type=int, metavar="N", help="evaluate on N images (a fixed random subset)")
    p.add_argument("--device", default="auto")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument(
        "--tta",
        choices=TTA_MODES,
        help="test-time augmentation: flip averages the image and its mirror; flip-translate adds the mirror pair "
        "shifted by 1/32 of the side up-left and down-right",
    )
    p.add_argument("--out", help="folder for eval_<split>.json and confusion_<split>.png (default: the model's folder)")
    p.add_argument("--no-progress", action="store_true")
    return p


def run_train(argv: list[str]) -> None:
    args = train_parser().parse_args(argv)
    options = {  # typed by argparse: applied as they are, after --set
        "data": args.data,
        "epochs": args.epochs,
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
    if note and not args.resume:
        print(note, file=sys.stderr)
    recipe = Recipe.from_dict(recipe)
    resume = f"python -m train --resume --out {args.out}"
    try:
        train(
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
    if args.push_to_hub and int(os.environ.get("RANK", "0")) == 0:
        from vit_core.hub import push_to_hub

        url = push_to_hub(args.out, args.push_to_hub, private=args.private)
        print(f"pushed {args.out} to {url}")


def run_eval(argv: list[str]) -> None:
    args = eval_parser().parse_args(argv)
    result = evaluate_checkpoint(
        args.model,
        args.data,
        split=args.split,
        batch_size=args.batch_size,
        device=args.device,
        subset=args.subset,
        workers=args.workers,
        progress=not args.no_progress,
        tta=args.tta,
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun every process has the totals; one reports
        return
    tta = f", {args.tta} TTA" if args.tta else ""
    print(
        f"{args.model} on {args.data} {args.split} ({result['count']} images{tta}): "
        f"top-1 {result['top1']:.2f}%  top-5 {result['top5']:.2f}%  loss {result['loss']:.4f}"
    )
    if len(result["labels"]) <= 20:
        print("confusion matrix (rows: true, columns: predicted):")
        print(format_confusion(result["confusion"], result["labels"]))
    folder = args.out or (args.model if Path(args.model).is_dir() else None)
    if folder is None:
        folder = str(Path("runs") / ("eval-" + args.model.replace("/", "--").replace(":", "-")))
    json_path, png_path = write_eval(result, folder)
    print(f"wrote {json_path} and {png_path}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["list"]:
            recipes = list_recipes()
            width = max(map(len, recipes), default=0)
            for name, doc in recipes.items():
                print(f"{name:{width}s}  {doc}")
        elif argv[:1] == ["eval"]:
            run_eval(argv[1:])
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
