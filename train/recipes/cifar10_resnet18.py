"""CIFAR-10 from scratch with timm's ResNet-18 made for 32 px: the CNN of the small-scale figure 5 (ViT vs hybrid
vs ResNet at equal CPU-minutes, `python -m bench.figure5`), at about the hybrid speedrun's cost per image.

timm's resnet18 with its stem adapted to 32x32 images (`vit_core.models.cnn`: a 3x3 convolution with stride 1, no max
pool) and stages 48, 96, 192, 384 wide (3/4 of timm's; 6.3M parameters): 0.65 GFLOP per image, against 0.50 for
cifar10_speedrun and 1.11 at timm's widths. Trained as CIFAR ResNets are, SGD with Nesterov momentum 0.9 and
weight decay 5e-4 at lr 0.1 per 128 images, with the speedrun's data, augmentation, label smoothing and
triangular schedule, on images 0-44,999.
"""

from train import load_recipe

cpu = load_recipe("cifar10_vit_cpu")
speedrun = load_recipe("cifar10_speedrun")

recipe = dict(
    model="timm:resnet18",
    model_args={k: cpu["model_args"][k] for k in ("img_size", "mean", "std", "crop_pct", "interpolation")}
    | dict(channels=(48, 96, 192, 384), crop_mode="squash"),
    data="cifar10",
    augment=speedrun["augment"],
    train_subset=[0, 45000],
    eval_subset=2000,
    label_smoothing=0.2,
    epochs=speedrun["epochs"],
    batch_size=512,
    opt="sgd",  # timm's "sgd" is Nesterov's
    momentum=0.9,
    lr=0.4,
    weight_decay=5e-4,
    sched="linear",
    warmup_epochs=speedrun["warmup_epochs"],
    min_lr=0.0,
    channels_last=True,
)
