"""The model card's sections in words a person reads (``model_card.render_model_card`` puts them together): the
results of a run as a short table, the calibration and its "none of my classes" rule, and the recipe as it may
be published. A card is pushed to the Hub as it is, so no section carries this machine's paths (folders are
named, ``folder_name``) or a raw out-of-distribution score (the rule is said by the share of held-out photos it
keeps)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

SPLITS = ("train", "val", "test")  # a folder's split sub-folders: named with their parent ("ants_and_bees/train")
_ACCURACY_WORDS = {  # metrics.jsonl's accuracy keys (model_card.ACCURACY_KEYS) in words
    "ema_test_top1": "top-1 accuracy on the evaluation images (EMA weights)",
    "test_top1": "top-1 accuracy on the evaluation images",
    "test_acc": "accuracy on the evaluation images",
    "val_top1": "top-1 accuracy on the validation images",
    "val_acc": "accuracy on the validation images",
}


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def folder_name(spec: str) -> str:
    """A local folder by its name, never its path: its last part, with its parent's for a split sub-folder
    (``/home/me/photos/ants_and_bees/train`` -> ``ants_and_bees/train``)."""
    path = Path(spec)
    if path.name in SPLITS and path.parent.name:
        return f"{path.parent.name}/{path.name}"
    return path.name or spec


def public_recipe(recipe: Any) -> Any:
    """``recipe`` with every path in it (absolute, or under the home folder) replaced by the folder's name."""
    if isinstance(recipe, dict):
        return {k: public_recipe(v) for k, v in recipe.items()}
    if isinstance(recipe, list):
        return [public_recipe(v) for v in recipe]
    if isinstance(recipe, str) and (recipe.startswith("~") or Path(recipe).is_absolute()):
        return folder_name(recipe)
    return recipe


def results_section(metrics: list[dict[str, Any]], key: str | None) -> str:
    """What a run trained and how it did, a short table: the last accuracy (``key`` of the last row that has it)
    and the best during training where that was higher, the epochs, the training time and the last training loss;
    a cancelled run, or one its budget ended, says so."""
    row = next((r for r in reversed(metrics) if key and is_number(r.get(key))), metrics[-1])
    last = metrics[-1]
    lines = ["## Results\n", "| | |", "|---|---|"]
    if key:
        unit = "%" if "top1" in key else ""
        lines.append(f"| {_ACCURACY_WORDS.get(key, 'accuracy')} | {_fmt(row[key])}{unit} |")
        best = max(r[key] for r in metrics if is_number(r.get(key)))
        if best != row[key]:
            lines.append(f"| best during training | {_fmt(best)}{unit} |")
    if is_number(last.get("epoch")):
        lines.append(f"| epochs trained | {last['epoch']} |")
    if is_number(last.get("elapsed_s")):
        minutes, seconds = divmod(round(last["elapsed_s"]), 60)
        lines.append(f"| training time | {f'{minutes} min ' if minutes else ''}{seconds} s |")
    if is_number(last.get("train_loss")):
        lines.append(f"| last training loss | {last['train_loss']:.3f} |")
    if last.get("stopped") == "asked":  # vit_core.training.progress.Hooks.should_stop: a cancelled run
        lines.append(
            f"\n**Incomplete**: the training was cancelled in epoch {last.get('epoch')}, after {last.get('steps')} "
            "of its steps, before its schedule ended."
        )
    elif last.get("stopped") == "budget":
        lines.append(f"\nThe training ended when its time budget was spent, in epoch {last.get('epoch')}.")
    return "\n".join(lines) + "\n"


def _fmt(v: float) -> str:
    return str(v) if isinstance(v, int) else f"{v:.4g}"


def calibration_section(calibration: dict[str, Any] | None, evals: list[dict[str, Any]], images: list[str]) -> str:
    """Temperature, calibration error per evaluation, the OOD rule and the reliability diagrams."""
    lines = ["## Calibration\n"]
    t = (calibration or {}).get("temperature")
    if is_number(t):
        views = f" for `{calibration['tta']}` views" if calibration.get("tta") else ""
        fitted = f", fitted on {calibration['fitted_on']}" if calibration.get("fitted_on") else ""
        lines.append(f"Probabilities are `softmax(logits / T)` with temperature T = {t:.4g}{views}{fitted}.\n")
    else:
        why = f" Recorded: {calibration['fitted_on']}." if (calibration or {}).get("fitted_on") else ""
        lines.append(
            "Calibration unknown: no temperature is stored for this checkpoint, so its probabilities are the plain "
            f"softmax (`python -m train calibrate` fits one on held-out training images).{why}\n"
        )
    rows = [e for e in evals if is_number(e.get("ece"))]
    if rows:
        lines += ["| evaluation | images | top-1 | ECE, softmax | ECE, calibrated |", "|---|---:|---:|---:|---:|"]
        for e in rows:
            data = folder_name(e["data"]) if isinstance(e.get("data"), str) else "?"
            what = f"{data} {e.get('split', '?')}" + (f", {e['tta']} views" if e.get("tta") else "")
            calibrated = f"{e['ece']:.4f}" if e.get("temperature") is not None else "-"
            uncal = e.get("ece_uncalibrated", e["ece"])
            lines.append(f"| {what} | {e.get('count', '?')} | {e['top1']:.2f}% | {uncal:.4f} | {calibrated} |")
        lines.append("\nECE: expected calibration error over 15 equal-width confidence bins (Guo et al. 2017).\n")
    ood = (calibration or {}).get("ood")
    if isinstance(ood, dict) and is_number(ood.get("threshold")):
        keep = f"{ood['keep']:.0%}" if is_number(ood.get("keep")) else "most"
        on = f" ({ood['fitted_on']})" if ood.get("fitted_on") else ""
        lines.append(
            f'"None of my classes": an image less like the training images than {keep} of the held-out '
            f"in-distribution images (by the `{ood.get('score')}` score, `vit_core.calibration.ood`) is reported as "
            f"none of its classes{on}. `vit_core.calibration.unlikeness` says any image's score the same way.\n"
        )
    lines += [f"![{Path(i).stem}]({i})" for i in images]
    return "\n".join(lines) + "\n"


def _fmt(v: float) -> str:
    return str(v) if isinstance(v, int) else f"{v:.4g}"
