"""The from-scratch baseline for mpp_then_finetune: the same ViT and schedule on the same 5,000 images."""

from train import load_recipe

recipe = dict(
    model_args=load_recipe("cifar10_vit_cpu")["model_args"],  # the ViT of cifar10_vit_cpu
    data="cifar10",
    train_subset=5000,
    augment=dict(crop="pad", padding=4, hflip=True),
    label_smoothing=0.1,
    epochs=15,
    batch_size=128,
    opt="adamw",
    lr=1e-3,
    weight_decay=0.05,
    warmup_epochs=1,
    min_lr=1e-5,
)
