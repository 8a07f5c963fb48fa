"""``python -m train eval``: a checkpoint evaluated on a dataset split. A run folder that trained on some of the
photos given (a folder fine-tuned with a held-out split) is evaluated on the others only, and refused where it
trained on all of them: a model's training photos are no test of it (``vit_core.finetune.held_out.unseen_images``).
What it prints names folders relative to the working folder or by name, never by an absolute path; top-5 only for
six classes or more (below that it is nearly always 100%)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from vit_core.finetune.held_out import unseen_images
from vit_core.training.evaluation import TTA_MODES, evaluate_checkpoint, format_confusion, write_eval
from vit_core.training.recipe import RecipeError

from . import prog, shown

MIN_TOP5_CLASSES = 6  # top-5 of fewer classes says little (of five, it is always 100%)


def eval_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{prog()} eval", description="Evaluate a checkpoint on a dataset split.")
    p.add_argument("--model", required=True, help="run folder, checkpoint folder, Hub repo id, or timm:<name>")
    p.add_argument("--data", required=True, help="dataset: mnist | fashion-mnist | cifar10 | a folder | hf:<name>")
    p.add_argument("--split", default="test", choices=("train", "test", "val"))
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument(
        "--subset",
        type=int,
        nargs="+",
        metavar="N",
        help="evaluate on N images, or with two numbers A B on images A..B-1, of the split's fixed shuffle (as a "
        "recipe's train_subset): --split train --subset 45000 50000 are the images `train calibrate` holds out",
    )
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


def eval_images(numbers: list[int] | None) -> int | list[int] | None:
    """``eval --subset``: N (the first N images of the fixed shuffle) or A B (images A..B-1), as ``fixed_subset``
    takes them."""
    if numbers is None:
        return None
    if len(numbers) == 1 and numbers[0] > 0:
        return numbers[0]
    if len(numbers) == 2 and 0 <= numbers[0] < numbers[1]:
        return numbers
    raise RecipeError(f"--subset takes N > 0, or A B with 0 <= A < B; got {' '.join(map(str, numbers))}")


def run_eval(argv: list[str]) -> None:
    args = eval_parser().parse_args(argv)
    subset, note = eval_images(args.subset), ""
    unseen = unseen_images(args.model, args.data, args.split) if Path(args.model).is_dir() else None
    if unseen is not None:  # a run folder's own training photos are no test of it
        indices, trained = unseen
        if not len(indices):
            raise RecipeError(
                f"all {trained} of these photos trained {shown(args.model)}: they are no test of it; evaluate it on "
                "photos it did not train on (its held-out photos are in eval_held-out_flip.json)"
            )
        if subset is not None:
            raise RecipeError(f"{trained} of these photos trained the model: evaluate without --subset")
        subset, note = indices, f", the {len(indices)} it did not train on; {trained} that trained it left out"
    result = evaluate_checkpoint(
        args.model,
        args.data,
        split=args.split,
        batch_size=args.batch_size,
        device=args.device,
        subset=subset,
        workers=args.workers,
        progress=not args.no_progress,
        tta=args.tta,
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun every process has the totals; one reports
        return
    if note:
        result["split"] = f"{args.split}-unseen"  # eval_<split>-unseen.json: not the split as a whole
    tta = f", {args.tta} TTA" if args.tta else ""
    top5 = f"  top-5 {result['top5']:.2f}%" if len(result["labels"]) >= MIN_TOP5_CLASSES else ""
    print(
        f"{shown(args.model)} on {shown(args.data)} {args.split} ({result['count']} images{tta}{note}): "
        f"top-1 {result['top1']:.2f}%{top5}  loss {result['loss']:.4f}"
    )
    if len(result["labels"]) <= 20:
        print("confusion matrix (rows: true, columns: predicted):")
        print(format_confusion(result["confusion"], result["labels"]))
    folder = args.out or (args.model if Path(args.model).is_dir() else None)
    if folder is None:
        folder = str(Path("runs") / ("eval-" + args.model.replace("/", "--").replace(":", "-")))
    if result["temperature"] is not None:
        print(
            f"calibration error (ECE, 15 bins): {result['ece']:.4f} with temperature {result['temperature']:.4g}, "
            f"{result['ece_uncalibrated']:.4f} with the plain softmax"
        )
    else:
        print(f"calibration error (ECE, 15 bins): {result['ece']:.4f} (no temperature stored: the plain softmax)")
    result |= {"model": Path(args.model).name if Path(args.model).is_dir() else args.model, "data": shown(args.data)}
    paths = write_eval(result, folder)
    print(f"wrote {', '.join(shown(p) for p in paths)}")
