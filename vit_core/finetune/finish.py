"""What follows a fine-tuning run with a held-out split (``finish_run``): the calibration on the held-out images,
the held-out evaluation and the result page's details, and the model card; the same for the Train tab, the command
line's ``finetune_folder`` and a recipe the engine runs (``train.run``), so that each writes the same card."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..calibration import TEMPERATURE_NOT_SET, CalibrationOptions, at_search_edge
from ..data import Batches, build_transform, other_photos, with_transform
from ..io.calibration_file import write_calibration
from ..io.model_card import prepare_upload
from ..training.engine import TrainResult
from ..training.evaluation import CalibrationImages, calibrate_model, evaluate, write_eval
from ..training.recipe import Recipe
from ..training.run_folder import CARD_NAME, commit
from .held_out import card_section, held_out_details, held_out_files
from .stages import ProbeFeatures

# the details of an ``_other`` folder's use (``ood.OthersChoice``)
OTHERS_KEYS = ("others", "others_chose", "others_measured", "others_turned_away", "others_auroc", "score")
HELD_OUT_SPLIT = "held-out"  # eval_held-out_flip.json: the held-out images evaluated as predict() answers


def finish_run(
    out: Path,
    recipe: Recipe,
    result: TrainResult,
    *,
    calibrate: bool = True,
    progress: bool = True,
    features: ProbeFeatures | None = None,
    strategy: str = "the whole model, as the recipe says",
    stages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """After a run with ``val_fraction``: with ``calibrate``, fit the model's temperature (image and mirror) and
    its Mahalanobis "none of my classes" detector on the held-out images (the statistics from the training
    images, without augmentation), store them (``calibration_file.write_calibration``) and evaluate the held-out images
    as ``predict`` answers (``eval_held-out_flip.json``); then write the model card ``README.md``. A temperature
    at the edge of its search (``calibration.at_search_edge``) is not kept: T = 1, and the calibration says the
    held-out images could not set it. ``features``: a probe's cached features stand in for the model
    (``stages.probe``); ``strategy``: what ran, in one sentence; ``stages``: each stage's record
    (``stages.StageRecord``), the card's table of them. Returns the held-out ``top1``, ``temperature``, OOD
    ``threshold`` and the result page's ``details`` (``held_out_details``, ``stages``, and of the "none of my
    classes" check: ``held_out_turned_away`` of the ``held_out`` photos); empty without ``calibrate``."""
    model, measured = result.model, {}
    if calibrate:
        name = Path(recipe.data).name
        net, held, fit, tta = model, result.test_set, None, "flip"
        others = other_photos(recipe.data, build_transform(model.pretrained_cfg))
        if features is not None:
            net, held, fit, tta, others = features.net, features.held_out, features.fit, features.tta, features.others
        fit = fit or with_transform(result.train_set, build_transform(model.pretrained_cfg))
        images = CalibrationImages(
            held_out=held,
            held_out_name=f"the {len(result.test_set)} images held out of {name} (val_fraction {recipe.val_fraction})",
            fit=fit,
            fit_name=f"the {len(result.train_set)} training images of {name}",
            others=others,
        )
        calibration, fitted = calibrate_model(net, images, options=CalibrationOptions(tta=tta), progress=progress)
        note = None
        if at_search_edge(calibration.temperature):
            note = (
                f"{TEMPERATURE_NOT_SET}: the held-out images could not set the temperature (its fit on them ran to the "
                f"edge of its range, T = {calibration.temperature:.3g})"
            )
            calibration = dataclasses.replace(
                calibration, temperature=1.0, fitted_on=f"{note}; {calibration.fitted_on}"
            )
        write_calibration(out, calibration)
        model.calibration = net.calibration = calibration
        batches = Batches(held, recipe.eval_batch_size, next(net.parameters()).device, train=False)
        classes = list(result.train_set.classes)
        ev = evaluate(net, batches, len(classes), tta=calibration.tta)
        # the folders by name: the record is read into a model card, which must not carry this machine's paths
        what = {"labels": classes, "model": out.name, "data": Path(recipe.data).name, "split": HELD_OUT_SPLIT}
        what["tta"] = calibration.tta
        write_eval(ev | what, out)
        files = held_out_files(recipe.data, recipe.val_fraction)
        details = held_out_details(net, batches, files, classes)
        details |= {"ece": ev["ece"], "threshold": fitted.get("threshold"), "temperature_note": note}
        details |= {key: fitted[key] for key in ("kept", "held_out_turned_away", *OTHERS_KEYS) if key in fitted}
        details |= {"held_out": len(result.test_set), "stages": stages or [], "strategy": strategy}
        measured = {"top1": ev["top1"], "temperature": calibration.temperature, "threshold": fitted.get("threshold")}
        measured["details"] = details
    _, card = prepare_upload(out, out.name)
    if measured:
        card += card_section(measured["details"])
    commit(out, {CARD_NAME: lambda f: f.write(card.encode())})
    return measured
