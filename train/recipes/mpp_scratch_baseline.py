"""The from-scratch baseline for mpp_then_finetune: the same ViT and schedule on the same 5,000 images."""

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
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        crop_pct=1.0,
        interpolation="bicubic",
    ),
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
