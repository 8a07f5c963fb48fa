"""Stage 3 of the bundled model (issue #54): the bundle fine-tuned again with real photos of seven of its ten
classes, so that photos people take of them are answered as well as cats and dogs were. The photos are those of
``photos/cats_and_dogs`` and ``photos/cars_birds_deer_frogs_horses`` (automobile, bird, deer, frog, horse; 182
each; stage 2 on their ``val`` splits: horse 66.7%, bird 88.5%), their ``fit`` share (80% of each ``train``
split, by file-name hash: ``vit_core.data.photos.in_held_share``), the held 20% kept for choosing. It starts from
stage 2's run folder (``python -m train --recipe cifar10_speedrun_photos``; the shipped run started from the same
weights where they were then bundled, ``models/cifar10_speedrun``).

CIFAR-10's training images 0-19,999 (of the 45,000 the bundle trained on) with the same augmentation, the cats and
dogs in 6 copies each and the five new classes in 10 (about as many images of each class as the cats and dogs get),
the ``fit`` share of ants and bees as outliers at weight 0.1, 2 epochs at 15% of stage 1's peak learning rate, the
CNN trained too, and the loss held to the bundle's own answers on the images it gets right (``distill``): the
bundle is the teacher, so airplane, ship and truck, which have no photos, keep what it knew, and a third of
CIFAR-10 an epoch is enough to hold it (the whole of it would triple the time). Chosen on the held-out share
(``python -m bench.photo_answers --split held``) and CIFAR-10's held-out training images; ``val`` measured once,
at the end; the attempts and their numbers are in ``train/recipes/README.md``. Then
``python -m train calibrate --model runs/cifar10_speedrun_photos7 --tta flip-translate --keep 0.90``: the
recipe's photos join the "none of my classes" statistics.
"""

from train import load_recipe

base = load_recipe("cifar10_speedrun_photos")
NEW = "photos/cars_birds_deer_frogs_horses"
FIVE = {c: c for c in ("automobile", "bird", "deer", "frog", "horse")}  # its folders carry CIFAR-10's names

recipe = base | dict(
    init="runs/cifar10_speedrun_photos",  # stage 2's folder: its head; its calibration replaced by the run's own
    photos=[
        base["photos"] | {"share": "fit"},
        {"folder": NEW, "classes": FIVE, "copies": 10, "share": "fit"},
    ],
    outliers=base["outliers"] | {"share": "fit"},
    train_subset=[0, 20000],
    epochs=2,
    seed=3,
)
