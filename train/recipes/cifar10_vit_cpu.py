"""CIFAR-10 from scratch on a CPU in about half an hour: a small ViT (4x4 patches, width 64, 6 blocks, 0.2M params).

The budget variant of cifar10_vit, and the root of the CPU recipes: the CIFAR-10 input (32 px, the dataset's
mean and std) and the schedule that cifar10_hybrid and the mpp_* recipes start from. Sized on one core of a
shared 2-core AMD EPYC VM (about 500 images/s; run it with OMP_NUM_THREADS=1 where other jobs share the cores,
since PyTorch's spinning threads slow down badly under contention). Light augmentation only (random shift and
flip, label smoothing): a short schedule underfits rather than overfits.
"""

recipe = dict(
    model_args=dict(
        img_size=32,
        patch_size=4,
        embed_dim=64,
        depth=6,
        num_heads=4,
        mlp_ratio=2.0,
        global_pool="avg",
        class_token=False,
        mean=(0.4914, 0.4822, 0.4465),  # CIFAR-10's training images, per channel
        std=(0.2470, 0.2435, 0.2616),
        crop_pct=1.0,
        interpolation="bicubic",
    ),
    data="cifar10",
    augment=dict(crop="pad", padding=4, hflip=True),
    label_smoothing=0.1,
    epochs=15,
    batch_size=128,
    opt="adamw",
    lr=2e-3,
    weight_decay=0.05,
    warmup_epochs=1,
    min_lr=1e-5,
)
