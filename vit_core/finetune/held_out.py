"""What a fine-tuned model's result page shows of its held-out images: per-class accuracy, the confusion matrix,
and the files it got wrong with what it answered, as ``predict`` answers them (calibrated views); and the model
card's section of the same."""

from __future__ import annotations

from collections.abc import Iterable
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


def card_section(details: dict[str, Any], strategy: str) -> str:
    """The model card's "Held-out results" section: the strategy, per-class accuracy, ECE and threshold, the
    confusion matrix and the misclassified files."""
    classes = list(details["accuracy"])
    threshold = details.get("threshold")
    lines = [
        "\n## Held-out results\n",
        f"Strategy: {strategy}.\n",
        f'ECE {details["ece"]:.3f}; "none of my classes" threshold '
        + ("none" if threshold is None else f"{threshold:.4g}")
        + (f"; {details['temperature_note']}" if details.get("temperature_note") else "")
        + ".\n",
        *([others_sentence(details) + "\n"] if details.get("others") else []),
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


def others_sentence(details: dict[str, Any]) -> str:
    """What the photos of other things (an ``_other`` folder) chose for "none of my classes", and how it did."""
    return (
        f"{details['others_chose']} of {details['others']} photos of other things chose the {details['score']} "
        f"score (AUROC {details['others_auroc']:.3f} against the held-out photos) and set its threshold, which keeps "
        f"{details['kept']:.0%} of the held-out photos; it turns away {details['others_turned_away']:.0%} of the "
        f"{details['others_measured']} that measure it."
    )
