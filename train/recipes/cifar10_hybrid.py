"""CIFAR-10 from scratch on a 2-core CPU in under two hours: a hybrid ViT (paper section 3.1).

A small convolutional stem (3x3 conv + BatchNorm + ReLU, 32 -> 256 channels, stride 4: Xiao et al.
2021's "early convolutions") turns the 32x32 image into an 8x8 feature map; each cell is a token
(1x1 patches, as the paper's R50 hybrids) for 3 transformer blocks of width 192. The convolutions
give locality, so the transformer learns in a few epochs what a plain ViT needs hundreds for.
cifar10_vit_cpu's data and schedule, 18 epochs. A bundled model before cifar10_hybrid_pool.
"""

from train import load_recipe

cpu = load_recipe("cifar10_vit_cpu")

recipe = cpu | dict(
    model_args=cpu["model_args"]
    | dict(
        patch_size=1,
        stem_channels=(32, 64, 128, 256),
        stem_strides=(1, 2, 1, 2),
        embed_dim=192,
        depth=3,
        num_heads=3,
    ),
    epochs=18,
    grad_clip=1.0,
)
