"""Do the relevance maps point at what the model uses? Deletion/insertion AUC on real test images.

    python -m bench.explain_sanity --model runs/mnist --data mnist           # 200 test images
    python -m bench.explain_sanity --model runs/c10 --data cifar10 --n 500

For a trained checkpoint and ``n`` test images (a fixed random subset), prints the deletion and
insertion AUC (``vit_core.explain.deletion_insertion_auc``: pixels removed / revealed in order of
relevance, probability of the predicted class tracked, baseline = dataset mean) of attention rollout,
gradient rollout, the last layer's raw attention and a random map, and each AUC's ratio to the random
map's. A map that finds the evidence the model uses has deletion AUC well below the random map's
(ratio < 1) and insertion AUC above it (ratio > 1).
"""

from __future__ import annotations

import argparse

import torch

import vit_core
from vit_core import explain
from vit_core.data import build_dataset, build_transform


def random_map(seed: int) -> explain.MapFn:
    """A map of uniform noise on the token grid: the chance level for deletion/insertion."""
    g = torch.Generator().manual_seed(seed)

    def fn(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        stride = model.config.feature_stride
        h, w = -(-images.shape[-2] // stride), -(-images.shape[-1] // stride)
        return torch.rand(images.shape[0], h, w, generator=g).to(images.device)

    return fn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (model.safetensors + config.json)")
    p.add_argument("--data", required=True, help="mnist, fashion-mnist, cifar10, or an image folder")
    p.add_argument("--n", type=int, default=200, help="number of test images")
    p.add_argument("--steps", type=int, default=32, help="deletion/insertion steps")
    p.add_argument("--batch-size", type=int, default=256, help="perturbed images per forward pass")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    model = vit_core.from_pretrained(args.model).to(args.device).eval()
    dataset = build_dataset(args.data, "test", transform=build_transform(model.pretrained_cfg))
    if args.n > len(dataset):
        raise SystemExit(f"--n {args.n} exceeds the {len(dataset)} test images")
    idx = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(args.seed))[: args.n]
    pairs = [dataset[int(i)] for i in idx]
    images = torch.stack([x for x, _ in pairs]).to(args.device)
    labels = torch.tensor([y for _, y in pairs], device=args.device)
    with torch.no_grad():
        accuracy = (model(images).argmax(-1) == labels).float().mean().item()
    print(f"{args.model} on {args.n} {args.data} test images: accuracy {accuracy:.3f}; steps={args.steps}")

    methods = {
        "attention rollout": explain.attention_rollout,
        "gradient rollout": explain.gradient_rollout,
        "raw attention (last layer)": lambda m, x: explain.attention_maps(m, x, -1),
        "random": random_map(args.seed),
    }
    results = {}
    for name, fn in methods.items():
        r = explain.deletion_insertion_auc(model, images, fn, steps=args.steps, batch_size=args.batch_size)
        results[name] = (r["deletion"].mean().item(), r["insertion"].mean().item())
    rand_del, rand_ins = results["random"]
    print(
        "| map | deletion AUC (lower is better) | insertion AUC (higher is better) "
        "| deletion / random | insertion / random |"
    )
    print("|---|---|---|---|---|")
    for name, (d, i) in results.items():
        print(f"| {name} | {d:.4f} | {i:.4f} | {d / rand_del:.3f} | {i / rand_ins:.3f} |")


if __name__ == "__main__":
    main()
