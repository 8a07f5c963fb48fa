"""Masked patch prediction pre-training (paper section 4.6) on 45,000 CIFAR-10 images, labels unused.

50% of the patch embeddings are corrupted (80% [mask], 10% another patch, 10% kept) and the model predicts
each corrupted patch's 3-bit mean colour (512 classes). Images 5,000..49,999 of a fixed shuffle: disjoint
from the 5,000 labelled images mpp_then_finetune uses. The model is mpp_scratch_baseline's.
"""

from train import load_recipe

recipe = dict(
    task="mpp",
    model_args=load_recipe("cifar10_vit_cpu")["model_args"],  # the ViT of cifar10_vit_cpu
    data="cifar10",
    train_subset=[5000, 50000],
    eval_subset=2000,
    augment=dict(crop="pad", padding=4, hflip=True),
    epochs=8,
    batch_size=128,
    opt="adamw",
    lr=1e-3,
    weight_decay=0.05,
    warmup_epochs=0.5,
    min_lr=1e-5,
)
