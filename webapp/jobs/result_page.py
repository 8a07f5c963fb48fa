"""The Train tab's result page, read by people after a run: how the model was trained and why, held-out accuracy
per class, the confusion matrix, the held-out photos it got wrong (to open in Classify), and what its calibration
error and its "none of my classes" threshold mean, one plain sentence each.

Made from the run's result as the training process reports it (``webapp.jobs.worker``: ``FinetuneResult``'s
fields, the held-out ``details`` of ``vit_core.finetune.held_out``), so that the page and ``/train``'s last
output say the same. The misclassified photos are copied out of the uploaded images before the job deletes them
(``keep_misclassified``): the gallery and a click that opens one in Classify need them afterwards.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from PIL import Image

from vit_core.figures import confusion_figure
from vit_core.finetune.held_out import none_sentence

MAX_SHOWN = 48  # misclassified photos in the gallery (the model card lists up to 50, the result's details all)
STRATEGIES = {  # the kind of the stage kept (``FinetuneResult.strategy``, vit_core.finetune.stages) in words
    "full": "in stages, the whole model fine-tuned last and kept",
    "lp-ft": "in stages, a new head first, then the last blocks fine-tuned and kept",
    "probe": "a new head on the frozen model's features (a linear probe), kept as the best stage",
}


def strategy_sentence(result: dict[str, Any]) -> str:
    """How the model was trained and why, one sentence (the run's ``strategy`` and ``strategy_reason``)."""
    name = result.get("strategy")
    if not name:
        return ""
    words = STRATEGIES.get(name, name)
    reason = result.get("strategy_reason") or ""
    return f"**How it trained**: {words}" + (f" — {reason}." if reason else ".")


def accuracy_table(details: dict[str, Any]) -> str:
    """Held-out accuracy per class, a Markdown table: the class, its held-out photos, those right, the share."""
    rows = ["| class | held-out photos | right | accuracy |", "|---|---:|---:|---:|"]
    for k, (name, accuracy) in enumerate(details["accuracy"].items()):
        row = details["confusion"][k]
        shown = "–" if accuracy is None else f"{accuracy:.1f}%"
        rows.append(f"| {name} | {sum(row)} | {row[k]} | {shown} |")
    return "\n".join(rows)


def ece_sentence(details: dict[str, Any]) -> str:
    """The expected calibration error in plain words: how far its stated confidence is from how often it is
    right."""
    ece = details.get("ece")
    if ece is None:
        return ""
    note = details.get("temperature_note")
    return (
        f"**Confidence**: on the held-out photos, the confidence it states is {100 * ece:.1f} points away from how "
        f"often it is right, on average (expected calibration error {ece:.3f}; 0 is perfect)"
        + (f"; {note}." if note else ".")
    )


def threshold_sentence(details: dict[str, Any]) -> str:
    """The "none of my classes" check in plain words, with no raw score (``vit_core.finetune.held_out``'s sentence,
    the card's): what it turns away of the model's own held-out photos, and of its photos of other things."""
    return none_sentence(details)


def stages_table(details: dict[str, Any]) -> str:
    """What ran, stage by stage (the card's table, in three columns: a phone's width): what each took (epochs,
    steps, images seen, seconds), its held-out accuracy, and the stage kept."""
    stages = details.get("stages") or []
    if not stages:
        return ""
    rows = ["| stage | what it took | held-out |", "|---|---|---:|"]
    for st in stages:
        top1 = "-" if st["held_out_top1"] is None else f"{st['held_out_top1']:.1f}%"
        name = f"**{st['name']} (kept)**" if st["kept"] else st["name"]
        took = f"{_count(st['epochs'], 'epoch')}, {_count(st['steps'], 'step')}, {st['images_seen']:,} images"
        rows.append(f"| {name} | {took}, {st['seconds']:.0f} s | {top1} |")
    return "\n".join(rows)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("s" if n != 1 else "")


def confusion_image(result: dict[str, Any]) -> Image.Image | None:
    """The held-out confusion matrix drawn (rows: true class, columns: answered); None without details."""
    details = result.get("details") or {}
    if not details.get("confusion"):
        return None
    return confusion_figure(details["confusion"], list(details["accuracy"]), "Held-out photos: true class × answer")


def caption(wrong: dict[str, Any]) -> str:
    """A misclassified photo's caption: "true → answered (confidence)"."""
    return f"{wrong['label']} → {wrong['predicted']} ({wrong['confidence']:.0%})"


def keep_misclassified(result: dict[str, Any], data: Path, keep: Path) -> list[tuple[str, str]]:
    """Copy the first ``MAX_SHOWN`` misclassified held-out photos out of ``data`` (the job's uploaded images,
    which the job deletes) into ``keep``; the gallery's (path, caption) pairs."""
    shown = []
    for i, wrong in enumerate((result.get("details") or {}).get("misclassified", [])[:MAX_SHOWN]):
        source = data / wrong["file"]
        if source.resolve().parent.parent != data.resolve() or not source.is_file():
            continue  # a file of ours (class/name), never a path out of the folder
        keep.mkdir(parents=True, exist_ok=True)
        copy = keep / f"{i:03d}{source.suffix}"
        shutil.copyfile(source, copy)
        shown.append((str(copy), caption(wrong)))
    return shown


def _accuracy(result: dict[str, Any]) -> float:
    """The held-out accuracy the page states: the confusion matrix's, so that it agrees with the table below it
    (the run's ``val_accuracy`` can differ by a tie between views that a near-zero temperature rounds
    differently)."""
    confusion = (result.get("details") or {}).get("confusion")
    if not confusion:
        return result["val_accuracy"]
    right = sum(row[k] for k, row in enumerate(confusion))
    return 100 * right / max(sum(map(sum, confusion)), 1)


def summary(result: dict[str, Any], label: str | None) -> str:
    """The result page's text: the outcome, how it trained, the table, the two sentences, the run's facts and the
    model in use (``label``: the new model's; None: the previous one stays, the run was cancelled)."""
    details = result.get("details") or {}
    if not result["complete"]:
        blocks = [
            f"**Cancelled** after {result['steps']} steps: the model in use is unchanged. The incomplete run "
            "(uncalibrated, not measured on the held-out photos) is offered as a zip below."
        ]
    else:
        acc = f"**Done**: held-out accuracy **{_accuracy(result):.1f}%** on {result['val_images']} photos."
        blocks = [acc, strategy_sentence(result)]
        if details:
            blocks += [
                stages_table(details),
                accuracy_table(details),
                ece_sentence(details),
                threshold_sentence(details),
            ]
    steps = f", {result['steps']} steps" if result["steps"] else ""  # a linear probe kept has none
    facts = [f"- classes: {', '.join(result['classes'])}; {result['train_images']} photos{steps}"]
    if details.get("temperature_note"):  # T = 1 kept: the held-out photos could not set it (the sentence above)
        facts.append("- calibration: no temperature fitted (T = 1 kept)")
    elif result.get("temperature") is not None:
        facts.append(f"- calibration: temperature {result['temperature']:.3f}")
    if label is not None:
        facts.append(f"- the picker now uses **{label}**: Classify, Explore, Compare and Batch explain it")
    wrong = len(details.get("misclassified", []))
    if wrong:
        more = f" (the first {MAX_SHOWN} shown; the model card lists them)" if wrong > MAX_SHOWN else ""
        photos = "held-out photo" if wrong == 1 else "held-out photos"
        facts.append(f"- {wrong} {photos} misclassified{more}: click one below to open it in Classify")
    elif details:
        facts.append("- every held-out photo was answered right")
    return "\n\n".join([b for b in blocks if b] + ["\n".join(facts)])
