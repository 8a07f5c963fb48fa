"""A fine-tuning's whole budget: what follows the training (calibrating on the held-out images, the evaluations,
writing the run folder and its card) estimated from the model's speed measured here, so that a call whose budget
covers the whole job (``FinetuneOptions(within_budget=True)``, the Train tab's) trains only for what that
leaves, and one whose budget cannot cover it is refused in a sentence before it trains.

The passes after training, over the held-out images (H) and the training images (N) at the forward speed
``lpft.measure_speed`` timed: the engine's last evaluation (H), the temperature's fit on each image and its mirror
(2H), the OOD statistics (N), the held-out evaluation (2H) and the result page's answers (2H); then the photos
decoded again for the engine (``data.decode_all``) and the run folder written (the weights, the optimizer's state,
the card and its figures). ``FINISH_MARGIN`` covers the rest (the first batches' allocations, a machine shared
with other work); ``bench/results/train_memory.txt`` has the times measured with ``python -m bench.train_memory``.
"""

from __future__ import annotations

from ..training.recipe import RecipeError

HELD_OUT_PASSES = 7  # forward passes over each held-out image after training (see the module's docstring)
FINISH_MARGIN = 1.25  # on those passes and the decoding: 2,000 photos, full, ended 2.5 s past a 300 s budget here
DECODE_S = 0.004  # seconds to decode one stored photo (a JPEG of at most 320 px) and resize it: a few ms here
WRITE_S = 2.0  # the rest: the model card, its figures, the JSON files (16 photos: 1.7 s from training's end here)
WRITE_BYTES_PER_S = 100e6  # the weights and the optimizer's state (16 bytes a parameter), written at this rate
MIN_TRAIN_S = 1.0  # less than this left for training: the job is refused


class BudgetTooShort(RecipeError):
    """A budget that cannot cover what follows the training, whatever the training; the message says so."""


def finish_seconds(forward_s: float, train_images: int, held_out: int, params: int, others: int = 0) -> float:
    """Seconds that what follows the training takes, estimated (see the module's docstring): ``forward_s`` a
    forward pass of one image here, ``params`` the model's parameters, ``others`` the photos of other things
    (each and its mirror, decoded as they are read)."""
    passes = (train_images + HELD_OUT_PASSES * held_out + 2 * others) * forward_s
    decoding = (train_images + held_out + others) * DECODE_S
    return FINISH_MARGIN * (passes + decoding) + WRITE_S + 16 * params / WRITE_BYTES_PER_S


def training_seconds(left_s: float, finish_s: float) -> float:
    """What ``left_s`` seconds leave to training once ``finish_s`` are kept for what follows it; ``BudgetTooShort``
    when that is under ``MIN_TRAIN_S``."""
    if left_s - finish_s < MIN_TRAIN_S:
        raise BudgetTooShort(
            f"Calibrating and saving the new model would take about {finish_s:.0f} s here, and the time budget leaves "
            f"{max(left_s, 0):.0f} s: give it more time, or fewer photos."
        )
    return left_s - finish_s
