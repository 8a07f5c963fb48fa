"""CIFAR-10 from scratch, the GPU recipe: ViT with 4x4 patches, width 192, 9 blocks, 12 heads (2.7M params).

The setting of Lee et al. 2021 ("Vision Transformer for Small-Size Datasets"), whose plain ViT reaches 93.6%
in 100 epochs; omihub777/ViT-CIFAR reaches 90.9% in 200. A ViT without the inductive biases of a CNN needs
strong regularisation on 50,000 images (the paper's section 4.2 point): RandAugment, Mixup/CutMix, label
smoothing, random erasing, stochastic depth, and a long schedule (300 epochs) with warmup and cosine decay.
Meant for one GPU (bf16 autocast); the same command runs data-parallel under torchrun. The input is
cifar10_vit_cpu's.
"""

from train import load_recipe

cpu = load_recipe("cifar10_vit_cpu")
# cifar10_vit_cpu's input and patches; a wider, deeper ViT that reads its class token
inputs = ("img_size", "patch_size", "mlp_ratio", "mean", "std", "crop_pct", "interpolation")

recipe = cpu | dict(
    model_args={k: cpu["model_args"][k] for k in inputs}
    | dict(embed_dim=192, depth=9, num_heads=12, drop_path_rate=0.1),
    augment=cpu["augment"] | dict(rand_augment="rand-m9-mstd0.5-inc1", re_prob=0.25),
    mixup=0.8,
    cutmix=1.0,
    epochs=300,
    lr=1e-3,
    warmup_epochs=10,
    workers=8,  # RandAugment is a per-image PIL op: DataLoader workers
    precision="bf16",
)
