"""Stage 3 of the bundled model (issue #54): the bundle fine-tuned again with real photos of seven of its ten
classes, so that photos people take of them are answered as well as cats and dogs now are. The photos are those of
``photos/cats_and_dogs`` and ``photos/cars_birds_deer_frogs_horses`` (automobile, bird, deer, frog, horse; 182
each; the bundle on their ``val`` splits: horse 66.7%, bird 88.5%). Needs only the checkout:
it starts from ``models/cifar10_speedrun``.

CIFAR-10's training images 0-19,999 (of the 45,000 the bundle trained on) with the same augmentation, the cats and
dogs in 6 copies each and the five new classes in 10 (about as many images of each class as the cats and dogs get),
ants and bees as outliers at weight 0.1, 2 epochs at 15% of stage 1's peak learning rate, the CNN trained too, and
the loss held to the bundle's own answers on the images it gets right (``distill``): the bundle is the teacher, so
airplane, ship and truck, which have no photos, keep what it knew, and a third of CIFAR-10 an epoch is enough to
hold it (the whole of it would triple the time). Checked on a held-out 20% of the photo ``train`` splits
(``bench.photo_split``) and CIFAR-10's held-out training images before shipping; the attempts and their numbers are
in ``train/recipes/README.md``. Then
``python -m train calibrate --model runs/cifar10_speedrun_photos7 --tta flip-translate --keep 0.90``: the recipe's
photos join the "none of my classes" statistics.
"""

from train import load_recipe

base = load_recipe("cifar10_speedrun_photos")
NEW = "photos/cars_birds_deer_frogs_horses"
FIVE = {c: c for c in ("automobile", "bird", "deer", "frog", "horse")}  # its folders carry CIFAR-10's names

recipe = base | dict(
    init="models/cifar10_speedrun",  # the bundle: its head, its calibration replaced by the run's own
    photos=[
        base["photos"],
        {"folder": NEW, "classes": FIVE, "copies": 10},
    ],
    train_subset=[0, 20000],
    epochs=2,
    seed=3,
)
