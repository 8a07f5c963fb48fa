"""``cifar10_speedrun`` as fast as a CPU with bf16 units runs it, for issue #27: bf16 autocast and passes of 256
images (epochs of 121-146 s on 2 vCPUs of an AMD EPYC with AVX-512 BF16, the fp32 recipe's 297-311 s in its
log), so 36 epochs in 77.6 minutes there. The sixth attempt (seed 0): level with the fifth, then the bundle, on
CIFAR-10 (93.91% with flips on the test set, 93.92% on the held-out images, against 93.68 / 94.24%), 3 more of the
43 photos right, but its AttnLRP maps (γ = 0.25 then) no longer led the centre Gaussian on mean-fill deletion and
its OOD AUROC on photos fell to 0.830, so not shipped (train/recipes/README.md). Its second seed (the seventh
attempt): 93.81% with flips in 119.7 minutes on a slower CPU, 94.04% with airbench's flip-translate views; the
bundled model since AttnLRP's γ-rule was chosen again (γ = 0.1), which gave its maps back their lead over the
centre Gaussian, hence ``seed=1`` here. On a CPU without bf16 units it trains in fp32, and says so.
"""

from train import load_recipe

base = load_recipe("cifar10_speedrun")

EPOCHS = 36  # 77.6 minutes at this speed; the 150-minute budget holds about 60

recipe = base | dict(
    cpu_precision="bf16",  # twice the convolutions' speed on a CPU with bf16 units (AVX-512 BF16 or AMX)
    micro_batch=256,  # passes of 256 images stay in cache: 1.4 times as fast per image as 1,024 in bf16
    bn_momentum=0.12,  # per pass of 256: airbench's 0.4 per batch of 1,024 (1 - 0.6 ** (1 / 4))
    epochs=EPOCHS,
    warmup_epochs=round(0.23 * EPOCHS, 2),
    seed=1,  # the bundled model's seed (the seventh attempt); seed 0 was the sixth
)
