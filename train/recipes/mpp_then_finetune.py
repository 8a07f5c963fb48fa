"""Fine-tune the mpp_pretrain checkpoint on 5,000 labelled CIFAR-10 images (compare: mpp_scratch_baseline).

Run mpp_pretrain first (into runs/mpp_pretrain). Same data, schedule and budget as the baseline; only the
starting weights differ. The head is new and zero-initialised (paper section 3.2).
"""

recipe = dict(
    init="runs/mpp_pretrain",
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
