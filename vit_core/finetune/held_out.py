"""What a fine-tuned model's result page shows of its held-out images: per-class accuracy, the confusion matrix,
and the files it got wrong with what it answered, as ``predict`` answers them (calibrated views); the model
card's section of the same, its "none of my classes" check in words (``none_sentence``); and which photos of a
folder a run did not train on (``unseen_images``), the only ones ``python -m train eval`` may call a test."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..calibration import predict
from ..data import build_dataset, stratified_split

MAX_LISTED = 50  # misclassified files the model card lists (the returned details hold them all)


def held_out_files(data: str, val_fraction: float) -> list[str]:
    """The held-out images' paths, relative to the folder ``data``, in the order ``stratified_split`` holds
    them out (the order of the held-out dataset)."""
    folder = build_dataset(data, "train")
    _, held = stratified_split(folder.targets, val_fraction)
    return [folder.samples[i][0].relative_to(data).as_posix() for i in held.tolist()]


def unseen_images(model: str | Path, data: str, split: str) -> tuple[torch.Tensor, int] | None:
    """Where ``model`` is a run folder that trained on a folder with a held-out split (its ``recipe.json``'s
    ``val_fraction``) and the folder ``data``'s ``split`` holds some of the photos it trained on: (the indices
    of ``data``'s photos it did not train on, how many it did). None where none of them trained it (or nothing
    says which did)."""
    path = Path(model) / "recipe.json"
    recipe = json.loads(path.read_text()) if path.is_file() else {}
    if recipe.get("val_fraction") is None or not Path(str(recipe.get("data"))).is_dir() or not Path(data).is_dir():
        return None
    folder = build_dataset(recipe["data"], "train")
    kept, _ = stratified_split(folder.targets, recipe["val_fraction"])
    trained = {folder.samples[i][0].resolve() for i in kept.tolist()}
    files = [p.resolve() for p, _ in getattr(build_dataset(data, split), "samples", [])]
    unseen = [i for i, f in enumerate(files) if f not in trained]
    return None if len(unseen) == len(files) else (torch.tensor(unseen, dtype=torch.long), len(files) - len(unseen))


@torch.no_grad()
def held_out_details(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], files: list[str], classes: list[str]
) -> dict[str, Any]:
    """``accuracy`` per class (%, None for a class with no held-out image), the ``confusion`` matrix (rows: true
    class, columns: predicted) and ``misclassified``: [{file, label, predicted, confidence}] for the held-out
    ``batches`` (in the order of ``files``)."""
    n = len(classes)
    confusion = torch.zeros(n, n, dtype=torch.int64)
    wrong, i = [], 0
    for x, y in batches:
        probs = predict(model, x).probs.cpu()
        conf, pred = probs.max(-1)
        for t, p, c in zip(y.tolist(), pred.tolist(), conf.tolist(), strict=True):
            confusion[t, p] += 1
            if t != p:
                wrong.append(dict(file=files[i], label=classes[t], predicted=classes[p], confidence=c))
            i += 1
    rows = confusion.sum(1)
    accuracy = {
        c: None if rows[k] == 0 else 100 * confusion[k, k].item() / rows[k].item() for k, c in enumerate(classes)
    }
    return dict(accuracy=accuracy, confusion=confusion.tolist(), misclassified=wrong)


def card_section(details: dict[str, Any]) -> str:
    """The model card's "What was trained" and "Held-out results" sections, in words a person reads: each stage
    with its epochs, steps, images seen and held-out accuracy; per-class accuracy, the confusion matrix, the
    "none of my classes" check said by what it turns away (never a raw score), and the misclassified files."""
    classes = list(details["accuracy"])
    lines = ["\n## What was trained\n", f"{details.get('strategy') or 'The whole model, as the recipe says'}.\n"]
    if details.get("stages"):
        lines += [
            "| stage | epochs | steps | images seen | seconds | held-out accuracy |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for st in details["stages"]:
            top1 = "-" if st["held_out_top1"] is None else f"{st['held_out_top1']:.1f}%"
            kept = " (kept)" if st["kept"] else ""
            lines.append(f"| {st['name']}{kept} | {st['epochs']} | {st['steps']} | {st['images_seen']:,} | "
                         f"{st['seconds']:.0f} | {top1} |")  # fmt: skip
        lines.append("\nHeld-out accuracy here: one view of each held-out photo; below, as `predict` answers.\n")
    lines += [
        "\n## Held-out results\n",
        f"Calibration error (ECE) {details['ece']:.3f}"
        + (f"; {details['temperature_note']}" if details.get("temperature_note") else "")
        + ".\n",
        none_sentence(details) + "\n",
        "| class | held-out accuracy | " + " | ".join(f"as {c}" for c in classes) + " |",
        "|---|---:|" + "---:|" * len(classes),
    ]
    for c, row in zip(classes, details["confusion"], strict=True):
        acc = details["accuracy"][c]
        lines.append(f"| {c} | {'-' if acc is None else f'{acc:.1f}%'} | " + " | ".join(map(str, row)) + " |")
    wrong = details["misclassified"]
    lines.append(f"\nMisclassified held-out images: {len(wrong)}" + (":\n" if wrong else ".\n"))
    lines += [
        f"- `{w['file']}`: {w['label']}, answered {w['predicted']} ({w['confidence']:.0%})" for w in wrong[:MAX_LISTED]
    ]
    if len(wrong) > MAX_LISTED:
        lines.append(f"- and {len(wrong) - MAX_LISTED} more")
    return "\n".join(lines) + "\n"


def none_sentence(details: dict[str, Any]) -> str:
    """The "none of my classes" check in plain words, with no raw score: how many of its own held-out photos it
    turns away, and with an ``_other`` folder what its photos of other things chose and how it did on them."""
    if details.get("threshold") is None:
        return '"None of my classes": no check was fitted, so every photo gets one of its classes.'
    text = (
        '"None of my classes": a photo less like the photos it learned than '
        f'{details.get("kept", 0.95):.0%} of its held-out photos is answered "none of my classes"'
    )
    if details.get("held_out_turned_away") is not None:
        text += f"; of its own {details['held_out']} held-out photos it turns away {details['held_out_turned_away']}"
    if details.get("others"):
        text += (
            f". {details['others_chose']} of {details['others']} photos of other things (`_other`) chose how photos "
            f"are scored ({details['score']}) and set it; it turns away {details['others_turned_away']:.0%} of the "
            f"{details['others_measured']} that measure it"
        )
    return text + "."
