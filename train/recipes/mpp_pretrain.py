"""Masked patch prediction pre-training (paper section 4.6) on 45,000 CIFAR-10 images, labels unused.

50% of the patch embeddings are corrupted (80% [mask], 10% another patch, 10% kept) and the model predicts
each corrupted patch's 3-bit mean colour (512 classes). Images 5,000..49,999 of a fixed shuffle: disjoint
from the 5,000 labelled images mpp_then_finetune uses. The model is mpp_scratch_baseline's.
"""

recipe = dict(
    task="mpp",
    model_args=dict(
        img_size=32,
        patch_size=4,
        embed_dim=64,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
        global_pool="avg",
        class_token=False,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        crop_pct=1.0,
        interpolation="bicubic",
    ),
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
