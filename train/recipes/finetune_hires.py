"""Fine-tune the mnist_tiny checkpoint at a higher resolution than it was trained at: 28 -> 40 pixels.

Paper section 3.2: keep the patch size, so the sequence grows (7x7 -> 10x10 patches), and interpolate the
pre-trained position embeddings in 2D. As the paper fine-tunes: SGD with momentum, no weight decay,
gradient clipping at norm 1, a short cosine schedule, a new zero-initialised head. Run mnist_tiny first.
"""

recipe = dict(
    init="runs/mnist_tiny",
    model_args=dict(img_size=40),
    data="mnist",
    augment=dict(crop="pad", padding=3, hflip=False),
    epochs=2,
    batch_size=64,
    opt="sgd",
    momentum=0.9,
    lr=0.01,
    weight_decay=0.0,
    grad_clip=1.0,
    warmup_epochs=0.2,
    min_lr=1e-5,
)
