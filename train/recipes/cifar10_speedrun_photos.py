"""The bundled ``cifar10_speedrun_bf16`` model fine-tuned on CIFAR-10 and real photos of cats and dogs, for issue
#45: photos people take, shrunk to 32 px, are not CIFAR-10's test images (dogs 71.2% right on
``photos/cats_and_dogs/val`` against 90.0% on CIFAR-10's test dogs).

A short warm restart (SGDR, Loshchilov & Hutter 2017) from the bundle's weights with its own head (``keep_head``):
the same 45,000 training images and augmentation, plus the 2,000 photos of ``photos/cats_and_dogs/train``
(``vit_core.data.photos``: each once as the app shrinks it and once as another photo of the same thing, a
random crop, colour, blur and JPEG compression), at 15% of the base run's peak learning rates, warmup then a
straight line to 0, lookahead averaging as before. The photos' ``val`` split and ``ants_and_bees`` stay unseen.
"""

from train import load_recipe

base = load_recipe("cifar10_speedrun_bf16")
SCALE = 0.15  # of the base run's peak learning rates: a fine-tune, not a second training
EPOCHS = 3  # 49,000 images an epoch

recipe = base | dict(
    model_args={},  # the checkpoint's model
    init="models/cifar10_speedrun",
    keep_head=True,
    stem_init="pytorch",  # the checkpoint's weights, not an initialisation
    freeze_stem=True,  # the CNN and its BatchNorm statistics as trained: CIFAR-10's features stay; twice as fast
    logit_adjust=True,  # the photos make cats and dogs 1.44 times as common as the other classes: not in answers
    photos={"folder": "photos/cats_and_dogs", "classes": {"cats": "cat", "dogs": "dog"}, "copies": 2},
    lr=base["lr"] * SCALE,
    stem_optimizer=None,
    epochs=EPOCHS,
    warmup_epochs=0.5,
    seed=2,
)
