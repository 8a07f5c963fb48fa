"""CIFAR-10 from scratch, the GPU recipe: ViT with 4x4 patches, width 192, 9 blocks, 12 heads (2.7M params).

The setting of Lee et al. 2021 ("Vision Transformer for Small-Size Datasets"), whose plain ViT reaches 93.6%
in 100 epochs; omihub777/ViT-CIFAR reaches 90.9% in 200. A ViT without the inductive biases of a CNN needs
strong regularisation on 50,000 images (the paper's section 4.2 point): RandAugment, Mixup/CutMix, label
smoothing, random erasing, stochastic depth, and a long schedule (300 epochs) with warmup and cosine decay.
Meant for one GPU (bf16 autocast); the same command runs data-parallel under torchrun.
"""

recipe = dict(
    model_args=dict(
        img_size=32,
        patch_size=4,
        embed_dim=192,
        depth=9,
        num_heads=12,
        mlp_ratio=2.0,
        drop_path_rate=0.1,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        crop_pct=1.0,
        interpolation="bicubic",
    ),
    data="cifar10",
    augment=dict(crop="pad", padding=4, hflip=True, rand_augment="rand-m9-mstd0.5-inc1", re_prob=0.25),
    mixup=0.8,
    cutmix=1.0,
    label_smoothing=0.1,
    epochs=300,
    batch_size=128,
    opt="adamw",
    lr=1e-3,
    weight_decay=0.05,
    warmup_epochs=10,
    min_lr=1e-5,
    workers=8,  # RandAugment is a per-image PIL op: DataLoader workers
    precision="bf16",
)
