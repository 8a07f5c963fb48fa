"""CIFAR-10 from scratch on a 2-core CPU in under two hours: a hybrid ViT (paper section 3.1).

A small convolutional stem (3x3 conv + BatchNorm + ReLU, 32 -> 256 channels, stride 4: Xiao et al.
2021's "early convolutions") turns the 32x32 image into an 8x8 feature map; each cell is a token
(1x1 patches, as the paper's R50 hybrids) for 3 transformer blocks of width 192. The convolutions
give locality, so the transformer learns in a few epochs what a plain ViT needs hundreds for.
The app's bundled default model.
"""

recipe = dict(
    model_args=dict(
        img_size=32,
        patch_size=1,
        stem_channels=(32, 64, 128, 256),
        stem_strides=(1, 2, 1, 2),
        embed_dim=192,
        depth=3,
        num_heads=3,
        mlp_ratio=2.0,
        global_pool="avg",
        class_token=False,
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        crop_pct=1.0,
        interpolation="bicubic",
    ),
    data="cifar10",
    augment=dict(crop="pad", padding=4, hflip=True),
    label_smoothing=0.1,
    epochs=18,
    batch_size=128,
    opt="adamw",
    lr=2e-3,
    weight_decay=0.05,
    warmup_epochs=1,
    min_lr=1e-5,
    grad_clip=1.0,
)
