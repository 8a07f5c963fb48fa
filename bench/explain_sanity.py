"""Do the relevance maps point at what the model uses? Deletion/insertion AUC and ROAD on real test images.

    python -m bench.explain_sanity                       # the bundled model, 300 CIFAR-10 test images
    python -m bench.explain_sanity --model models/cifar10_vit --n 500 --out bench/results/explain_vit.md
    python -m bench.explain_sanity --model runs/mnist_tiny --data mnist --methods gradient "rollout(start_layer=1)"

For a trained checkpoint and ``n`` test images (a fixed random subset), scores each map on three baselines:

- ``mean`` and ``blur``: ``vit_core.explain.faithfulness.deletion_insertion_auc`` (Petsiuk et al., "RISE", BMVC 2018:
  pixels removed / revealed in order of relevance, probability of the predicted class tracked, area under the curve),
  removed pixels taking the dataset mean colour, or the image under a Gaussian blur of σ = a quarter of each
  side (``faithfulness.BLUR_SIGMA``);
- ``road``: ``vit_core.explain.road.road`` (Rong et al., ICML 2022): removed pixels filled by noisy linear imputation
  from their neighbours, which hides where pixels were removed; MoRF (most relevant removed first, lower is
  better) and LeRF (least relevant first, higher is better), each the predicted class's probability averaged
  over removing 10%, 20%, ..., 90% of the pixels.

Two maps that ignore the image anchor the scale:

- ``random``: uniform noise on the token grid, the chance level;
- ``centre``: ``explain.centre_gaussian_map``, a Gaussian on the middle of the grid. CIFAR-10's objects
  are centred, so this is the bar an explanation has to clear to show it finds the image's own evidence.

Per baseline and map the table gives the scores (mean ± standard error over the images), the paired
differences from the centre map on the same images (± their standard error), the fraction of images on
which the map does better than the centre map on each score, and whether it *beats the centre*: better on
both scores, each by more than two standard errors of the paired difference. Then the ranking of the maps
under each score, and, when ``rise`` is among the methods, every map's paired differences from RISE. A last
table gives the model's probability of its predicted class on the original images, the fully mean-filled
images and the fully blurred images, with the blur of σ = 5 px at 224 px (RISE's, 0.7 px at 32 px: the
baseline's σ before it became a quarter of the side) for comparison.

Methods are given as ``name`` or ``name(key=value,...)``, the keywords going to the function: the ``key`` of
any method of ``vit_core.methods`` (``rise``: ``explain.rise``, n_masks, cells, p_keep, seed; ``rollout``:
``explain.attention_rollout``, head_fusion, discard_ratio, start_layer; ``gradient``:
``explain.gradient_rollout``; ``attention``: ``explain.attention_maps``, layer, head, the last layer and the
mean of the heads by default; ``attnlrp``: ``lrp.attnlrp``, conv_gamma; ``chefer``: ``lrp.chefer``), ``centre``
(``explain.centre_gaussian_map``: sigma) and ``random``. ``--out FILE.md`` writes the tables to FILE.md and the
numbers to FILE.json (the per-image scores, which the paired differences from RISE use, stay out of it).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torchvision.transforms.functional as TF
from tqdm import tqdm

import vit_core
from vit_core import explain, methods
from vit_core.data import build_dataset, build_transform
from vit_core.explain import faithfulness, road
from webapp.registry.catalog import BUNDLED, ROOT

ANCHORS = {"random": "random map", "centre": "centre Gaussian"}  # maps that ignore the image
BASELINES = ("mean", "blur", "road")
# the two scores of each baseline: the first lower is better, the second higher
SCORES = {"mean": ("deletion", "insertion"), "blur": ("deletion", "insertion"), "road": ("morf", "lerf")}
LABELS = {"deletion": "deletion AUC", "insertion": "insertion AUC", "morf": "MoRF", "lerf": "LeRF"}
ROAD_BATCH = 64  # imputed images per conjugate-gradient solve and forward pass
RISE_SIGMA_PX_AT_224 = 5.0  # RISE's insertion blur, the blur baseline's σ before the fix


def names() -> dict[str, str]:
    """Every map by its name on the command line: the table's methods, then the two anchors."""
    return {m.key: m.title for m in methods.METHODS} | ANCHORS


def random_map(seed: int) -> explain.MapFn:
    """A map of uniform noise on the token grid: the chance level for deletion/insertion."""
    g = torch.Generator().manual_seed(seed)

    def fn(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        stride = model.config.feature_stride
        h, w = -(-images.shape[-2] // stride), -(-images.shape[-1] // stride)
        return torch.rand(images.shape[0], h, w, generator=g).to(images.device)

    return fn


def _value(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_method(spec: str, seed: int) -> explain.MapFn:
    """``name`` or ``name(key=value,...)`` -> a map function (see the module docstring)."""
    functions: dict[str, Callable[..., torch.Tensor]] = {m.key: m.fn for m in methods.METHODS}
    functions["centre"] = explain.centre_gaussian_map
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", spec.replace(" ", ""))
    if m is None or m[1] not in (*functions, "random"):
        raise SystemExit(f"unknown method {spec!r}: use {', '.join((*functions, 'random'))}, optionally name(k=v,...)")
    kwargs = {}
    for item in filter(None, (m[2] or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"method {spec!r}: arguments are key=value, got {item!r}")
        kwargs[key] = _value(value)
    if m[1] == "random":
        if kwargs:
            raise SystemExit("the random map takes no arguments")
        return random_map(seed)
    if m[1] == "attention":
        kwargs.setdefault("layer", -1)
    return partial(functions[m[1]], **kwargs)


def _mean_se(x: torch.Tensor) -> dict[str, float]:
    x = x.double()
    se = x.std() / math.sqrt(x.numel()) if x.numel() > 1 else torch.tensor(float("nan"))
    return {"mean": x.mean().item(), "se": se.item()}


def end_points(model: torch.nn.Module, images: torch.Tensor, target: torch.Tensor, batch_size: int) -> dict:
    """The ends of the curves, whatever the map: the probability of ``target`` (mean, SE) and the fraction
    of images still predicted as ``target`` on the originals and on the fully replaced images: ``mean``
    (zeros in normalised space), ``blur`` (``faithfulness.BLUR_SIGMA``, what ``deletion_insertion_auc`` uses)
    and the blur of RISE's σ = 5 px at 224 px scaled to the image (the blur baseline before the fix)."""
    rise = RISE_SIGMA_PX_AT_224 * max(images.shape[-2:]) / 224
    variants = {
        "original": images,
        "fully mean": torch.zeros_like(images),
        f"fully blur (σ = {faithfulness.BLUR_SIGMA:g} × side)": faithfulness.gaussian_blur(
            images, faithfulness.BLUR_SIGMA
        ),
        f"fully blur (σ = {rise:.2g} px, RISE's 5 px at 224: before the fix)": TF.gaussian_blur(
            images, kernel_size=2 * math.ceil(3 * rise) + 1, sigma=rise
        ),
    }
    out = {}
    with torch.no_grad():
        for name, x in variants.items():
            p = torch.cat([model(c).float().softmax(-1) for c in x.split(batch_size)])
            kept = (p.argmax(-1) == target).double().mean().item()
            out[name] = {**_mean_se(p.gather(1, target[:, None]).squeeze(1)), "prediction_kept": kept}
    return out


def _scores(
    model, images, map_fn, target, baseline: str, *, steps: int = 16, batch_size: int = 256, seed: int = 0
) -> dict:
    """Per-image scores of one map on one baseline: deletion/insertion AUCs, or ROAD's MoRF/LeRF."""
    if baseline == "road":
        # one imputation (a conjugate-gradient solve) per removal level: small batches, as the slowest
        # system of a batch sets its number of iterations
        return road.road(model, images, map_fn, target, batch_size=min(batch_size, ROAD_BATCH), seed=seed)
    return faithfulness.deletion_insertion_auc(
        model, images, map_fn, target, steps=steps, baseline=baseline, batch_size=batch_size
    )


def score(
    model: torch.nn.Module,
    images: torch.Tensor,
    methods: list[str],
    baselines: tuple[str, ...] = BASELINES,
    steps: int = 16,
    batch_size: int = 256,
    seed: int = 0,
    chunk: int = 25,
    progress: bool = False,
) -> dict:
    """Scores of every method on every baseline, with paired comparisons to ``centre``.

    Each method's maps are computed once, ``chunk`` images at a time, then scored ``chunk`` images at a time
    (a progress bar step each; ROAD's noise seeded by the chunk's first image). Returns ``{"probability":
    end_points(...), "results": [row, ...], "per_image": {baseline: {method: {score: [...]}}}}`` with one row
    per (baseline, method): each score's mean and standard error (deletion/insertion AUC, or ROAD's MoRF/LeRF),
    the paired differences from the centre map (mean, standard error), the fractions of images on which the
    method does better than the centre map (lower first score, higher second), and whether it beats the centre
    map (both beyond 2 SE).
    """
    if "centre" not in methods:
        methods = [*methods, "centre"]
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(c) for c in images.split(batch_size)])
    target = logits.argmax(-1)
    bar = tqdm(total=len(methods) * len(images), unit="img", desc="maps", disable=not progress)
    maps = {}
    for spec in methods:
        fn = parse_method(spec, seed)
        parts = []
        for i in range(0, len(images), chunk):
            parts.append(fn(model, images[i : i + chunk]).detach())
            bar.update(len(parts[-1]))
        maps[spec] = torch.cat(parts)
    bar.close()

    per_image: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    bar = tqdm(total=len(baselines) * len(methods) * len(images), unit="img", desc="scores", disable=not progress)
    for baseline in baselines:
        for spec in methods:
            parts = []
            for i in range(0, len(images), chunk):
                part = slice(i, i + chunk)

                def fn(_m, _x, part=part, spec=spec):
                    return maps[spec][part]

                parts.append(
                    _scores(model, images[part], fn, target[part], baseline, steps=steps, batch_size=batch_size, seed=i)
                )
                bar.update(len(images[part]))
            per_image[baseline, spec] = {k: torch.cat([p[k] for p in parts]) for k in SCORES[baseline]}
    bar.close()

    probability = end_points(model, images, target, batch_size)
    rows = []
    for baseline in baselines:
        centre = per_image[baseline, "centre"]
        lower, higher = SCORES[baseline]
        for spec in methods:
            r = per_image[baseline, spec]
            row: dict = {"method": spec, "baseline": baseline}
            for k in (lower, higher):
                row[k] = _mean_se(r[k])
                row[f"{k}_minus_centre"] = _mean_se(r[k] - centre[k])
            row[f"{lower}_below_centre"] = (r[lower] < centre[lower]).double().mean().item()
            row[f"{higher}_above_centre"] = (r[higher] > centre[higher]).double().mean().item()
            d, i = row[f"{lower}_minus_centre"], row[f"{higher}_minus_centre"]
            row["beats_centre"] = d["mean"] + 2 * d["se"] < 0 and i["mean"] - 2 * i["se"] > 0
            rows.append(row)
    scores = {b: {m: {k: v.tolist() for k, v in per_image[b, m].items()} for m in methods} for b in baselines}
    return {"probability": probability, "results": rows, "per_image": scores}


def _paired(report: dict, baseline: str, method: str, versus: str, key: str) -> dict[str, float]:
    a, b = (torch.tensor(report["per_image"][baseline][m][key]) for m in (method, versus))
    return _mean_se(a - b)


def markdown(report: dict) -> str:
    """The report as markdown: a header line, the score table per baseline, the rankings, the paired
    differences from RISE (when it was scored), the end-point probabilities."""
    lines = [
        f"`{report['model']}` on {report['n']} {report['data']} test images (seed {report['seed']}): "
        f"accuracy {report['accuracy']:.3f}; {report['steps']} steps; "
        f"{report['cpu_s']:.0f} s CPU, {report['wall_s']:.0f} s wall",
    ]
    baselines = list(dict.fromkeys(r["baseline"] for r in report["results"]))
    for baseline in baselines:
        lower, higher = SCORES[baseline]
        what = (
            "ROAD (noisy linear imputation, removal fractions 0.1 ... 0.9): mean probability of the predicted class"
            if baseline == "road"
            else f"Baseline `{baseline}`: AUC"
        )
        lines += [
            "",
            f"{what} mean ± standard error; Δ = map − centre Gaussian on the same images (± SE); "
            "fractions of images on which the map does better than the centre Gaussian",
            "",
            f"| map | {LABELS[lower]} ↓ | {LABELS[higher]} ↑ | Δ {LABELS[lower]} | Δ {LABELS[higher]} "
            f"| {LABELS[lower]} < centre | {LABELS[higher]} > centre | beats centre |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in report["results"] if r["baseline"] == baseline):
            d, i = r[lower], r[higher]
            dd, di = r[f"{lower}_minus_centre"], r[f"{higher}_minus_centre"]
            name = names().get(r["method"], f"`{r['method']}`")
            centre = r["method"] == "centre"
            lines.append(
                f"| {name} | {d['mean']:.4f} ± {d['se']:.4f} | {i['mean']:.4f} ± {i['se']:.4f} "
                + (
                    "| — | — | — | — | — |"
                    if centre
                    else f"| {dd['mean']:+.4f} ± {dd['se']:.4f} | {di['mean']:+.4f} ± {di['se']:.4f} "
                    f"| {r[f'{lower}_below_centre']:.0%} | {r[f'{higher}_above_centre']:.0%} "
                    f"| {'**yes**' if r['beats_centre'] else 'no'} |"
                )
            )
    lines += [
        "",
        "Ranking under each score, best first (mean over the images):",
        "",
        "| score | ranking |",
        "|---|---|",
    ]
    for baseline in baselines:
        rows = [r for r in report["results"] if r["baseline"] == baseline]
        for k, sign in zip(SCORES[baseline], (1, -1), strict=True):
            ranked = sorted(rows, key=lambda r, k=k, sign=sign: sign * r[k]["mean"])
            ranking = ", ".join(f"{names().get(r['method'], r['method'])} {r[k]['mean']:.3f}" for r in ranked)
            lines.append(f"| {LABELS[k]} ({baseline}) {'↓' if sign > 0 else '↑'} | {ranking} |")
    methods = list(report["per_image"][baselines[0]])
    if "rise" in methods:
        lines += [
            "",
            "Paired differences from RISE on the same images (map − RISE, mean ± SE; "
            "negative is better for the first score of each baseline, positive for the second):",
            "",
            "| map | " + " | ".join(f"Δ {LABELS[k]} ({b})" for b in baselines for k in SCORES[b]) + " |",
            "|---" * (1 + 2 * len(baselines)) + "|",
        ]
        for m in methods:
            if m == "rise":
                continue
            cells = [_paired(report, b, m, "rise", k) for b in baselines for k in SCORES[b]]
            lines.append(
                f"| {names().get(m, m)} | " + " | ".join(f"{c['mean']:+.4f} ± {c['se']:.4f}" for c in cells) + " |"
            )
    lines += [
        "",
        f"Probability of the predicted class (mean ± SE; chance {1 / report['num_classes']:.2f}):",
        "",
        "| image | probability | prediction unchanged |",
        "|---|---|---|",
        *(
            f"| {k} | {v['mean']:.3f} ± {v['se']:.3f} | {v['prediction_kept']:.0%} |"
            for k, v in report["probability"].items()
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default=str(BUNDLED.relative_to(ROOT)), help="checkpoint folder (model.safetensors + config.json)"
    )
    p.add_argument("--data", default="cifar10", help="mnist, fashion-mnist, cifar10, or an image folder")
    p.add_argument("--n", type=int, default=300, help="number of test images")
    p.add_argument("--steps", type=int, default=16, help="deletion/insertion steps")
    p.add_argument("--methods", nargs="+", default=list(names()), help="map specs (see above)")
    p.add_argument("--baselines", nargs="+", default=list(BASELINES), choices=BASELINES)
    p.add_argument("--batch-size", type=int, default=256, help="perturbed images per forward pass")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0, help="picks the images and the random map")
    p.add_argument("--out", type=Path, help="write the tables to OUT (.md) and the numbers to OUT with .json")
    args = p.parse_args()
    for spec in args.methods:
        parse_method(spec, args.seed)  # fail on a typo before any work

    wall, cpu = time.perf_counter(), time.process_time()
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
    results = score(
        model, images, args.methods, tuple(args.baselines), args.steps, args.batch_size, args.seed, progress=True
    )
    report = {
        "model": args.model,
        "data": args.data,
        "n": args.n,
        "seed": args.seed,
        "steps": args.steps,
        "accuracy": accuracy,
        "num_classes": model.config.num_classes,
        **results,
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
    }
    text = markdown(report)
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        numbers = {k: v for k, v in report.items() if k != "per_image"}
        args.out.with_suffix(".json").write_text(json.dumps(numbers, indent=2) + "\n")


if __name__ == "__main__":
    main()
