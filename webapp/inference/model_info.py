"""What the app says about a model: its classes and input, how sure a prediction is, the Inspect tab's
figures and summary. Works for any model the core loads: plain or hybrid, 1 or 3 channels, any width."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch import nn

from vit_core import VisionTransformer, figures
from vit_core.calibration import calibrated_views, unlikeness
from vit_core.explain import inspection
from vit_core.finetune.finish import HELD_OUT_SPLIT
from vit_core.io.files import METRICS_NAME, RECIPE_NAME

from .analysis import Analysis, autocast

UNSURE_BELOW = 0.5  # a top-1 probability under this is shown as a guess, not an answer
FILTERS = 28  # embedding filters shown, as the paper's figure 7 (fewer when the model has fewer)
CARD_IMAGE_BYTES = 4 << 20  # larger images in a model card are left as links


def format_count(n: int) -> str:
    """7930 -> '7.9K', 208842 -> '209K', 1343914 -> '1.3M', 86567656 -> '87M', 999 -> '999'."""

    def short(v: float) -> str:
        return f"{v:.1f}" if v < 9.95 else f"{v:.0f}"

    if n < 1000:
        return str(n)
    for unit, scale in (("K", 1e3), ("M", 1e6)):
        if float(short(n / scale)) < 1000:  # 999,600 is "1.0M", not "1000K"
            return short(n / scale) + unit
    return short(n / 1e9) + "B"


def format_ms(ms: float) -> str:
    """A time in milliseconds, to the digits that mean something: 1234.5 -> '1,234 ms', 37.4 -> '37 ms',
    2.34 -> '2.3 ms', 0.384 -> '0.38 ms' (a cached forward pass and map)."""
    return f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.2f} ms"


def facts(model: VisionTransformer) -> str:
    """What the Classify tab says about the model: the classes it knows, the input it sees, whether it can answer
    "none of my classes" (its checkpoint stores a detector) and what its confidences mean (calibrated when its
    checkpoint stores a fitted temperature; Hub checkpoints usually do not)."""
    cfg = model.config
    names = model.class_names
    listed = ", ".join(names) if len(names) <= 12 else ", ".join(names[:10]) + f", … ({len(names)} in all)"
    h, w = cfg.img_hw
    colour = "grey" if cfg.in_chans == 1 else "colour"
    cal = model.calibration
    scope = (
        "says so when an image looks like none of them"
        if cal is not None and cal.ood is not None
        else "picks one of its classes whatever the image shows"
    )
    if cal is not None and cal.temperature_fitted:
        confidence = (
            f"Its confidences are calibrated (temperature {cal.temperature:.2f}, fitted on held-out training images)."
        )
    elif cal is not None and cal.temperature is not None:  # T = 1 kept, as its card says
        confidence = (
            "Its confidences are not calibrated: its held-out photos could not set the temperature (T = 1 kept), "
            "so one may not match how often it is right."
        )
    else:
        confidence = (
            "Its confidences are not calibrated (no fitted temperature stored): one may not match how often it "
            "is right."
        )
    return (
        f"This model knows **{len(names)} classes**: {listed}. It sees a **{h}×{w}-pixel {colour}** version of "
        f"the coloured region of your image and {scope}; a top class under {UNSURE_BELOW:.0%} is shown as "
        f"*not sure*. {confidence}"
    )


ANSWER, NONE_OF_MINE, TORN, UNSURE = "answer", "none of my classes", "torn", "not sure"  # Decision.kind
TORN_FROM = 0.8  # an unsure top two holding this much of the probability between them: "torn between" them


@dataclass(frozen=True)
class Decision:
    """What the app decides about one image, the same in Classify, Batch and the API: ``kind`` (``ANSWER``, a plain
    answer; ``NONE_OF_MINE``, the detector says the image is like none of the classes; ``TORN``, unsure between
    two classes; ``UNSURE``, no class stands out), a one-line ``headline`` and the ``reason`` in plain words
    (empty for a plain answer)."""

    kind: str
    headline: str
    reason: str

    @property
    def plain(self) -> bool:
        return self.kind == ANSWER

    def markdown(self) -> str:
        """The headline, and the reason as a second paragraph (the page shows it smaller)."""
        return self.headline + (f"\n\n{self.reason}" if self.reason else "")


def decide(
    probs: torch.Tensor,
    names: list[str],
    is_ood: bool | None = None,
    unlike: str | None = None,
) -> Decision:
    """The decision for calibrated ``probs`` over ``names``. ``is_ood`` True (the model's detector said so:
    ``vit_core.calibration.predict``; ``unlike`` says its score in words when given, relative to the model's own
    held-out photos, ``vit_core.calibration.unlikeness``: a raw score means nothing to a person): none of its
    classes, naming the one it is most like, and saying that the top probability is a share among the known
    classes, not a chance that the image is one. Otherwise a plain answer when the top probability reaches
    ``UNSURE_BELOW``; below it, "torn between" the top two when they hold ``TORN_FROM`` of the probability, else
    "not sure", so a low-confidence answer never reads as a confident one. ``is_ood`` None (a model without a
    detector) is the confidence rule alone."""
    p, i = probs.topk(min(2, len(names)))
    top, p0 = names[i[0]], float(p[0])
    if is_ood:
        score = f": {unlike}" if unlike else ""
        return Decision(
            NONE_OF_MINE,
            f"Not one of my {len(names)} classes — most like: {top}",
            f"This photo looks unlike the photos I was trained on{score}. If it had to be one of my classes it "
            f"would be {top}, but the {p0:.0%} beside it is a share among my {len(names)} classes, not the chance "
            "that this is one.",
        )
    if p0 >= UNSURE_BELOW or len(names) == 1:
        return Decision(ANSWER, f"{top} ({p0:.0%})", "")
    second, p1 = names[i[1]], float(p[1])
    if p0 + p1 >= TORN_FROM:
        return Decision(
            TORN,
            f"Not sure — torn between {top} ({p0:.0%}) and {second} ({p1:.0%})",
            f"It looks like the training photos of both {top} and {second}, and nothing in it settles which.",
        )
    return Decision(
        UNSURE,
        f"Not sure — maybe {top} ({p0:.0%}) or {second} ({p1:.0%})",
        f"No class stands out: the likeliest has {p0:.0%}, under the {UNSURE_BELOW:.0%} an answer needs.",
    )


def analysis_decision(a: Analysis) -> Decision:
    """``decide`` for an analysed upload (``webapp.inference.analysis.analyse``), its detector's score in words."""
    detector = a.model.calibration.ood if a.model.calibration is not None else None
    unlike = unlikeness(detector, a.ood_score) if detector is not None and a.ood_score is not None else None
    return decide(a.probs, a.names, a.is_ood, unlike)


def verdict(probs: torch.Tensor, names: list[str], is_ood: bool | None = None) -> str:
    """The decision's headline (``decide``): one line, for a caption or a CSV cell."""
    return decide(probs, names, is_ood).headline


# ------------------------------------------------------------------------------------------- Inspect


def _first_conv(model: VisionTransformer) -> nn.Conv2d:
    return next(m for m in model.patch_embed.backbone.modules() if isinstance(m, nn.Conv2d))


def filters_figure(model: VisionTransformer) -> Image.Image:
    """Paper fig. 7 left for plain ViTs: the principal components of the patch projection's filters (as
    many as the model has, up to 28). A hybrid's patch projection acts on CNN features, not pixels, so its
    filters are not pictures: show the CNN's first convolution's filters instead, which are."""
    kind = "RGB" if model.config.in_chans == 3 else "Grey"
    if model.config.is_hybrid:
        w = _first_conv(model).weight.detach()[:FILTERS]
        return figures.embedding_filters_figure(
            w, title=f"{kind} filters of the CNN's first convolution\n(hybrid: tokens come from CNN features)"
        )
    D, C, P, _ = model.patch_embed.proj.weight.shape
    n = min(FILTERS, D, C * P * P)
    return figures.embedding_filters_figure(
        inspection.embedding_filters(model, n=n), title=f"{kind} embedding filters\n(first {n} principal components)"
    )


def inspect_figures(
    model: VisionTransformer, images: torch.Tensor, device: torch.device
) -> tuple[Image.Image, Image.Image, Image.Image]:
    """The paper's figure 7 for ``model``: filters, position-embedding similarity, and mean attention
    distance over ``images`` (a model-ready batch)."""
    similarity = figures.position_similarity_figure(inspection.position_embedding_similarity(model))
    with torch.no_grad(), autocast(device):
        distances = inspection.mean_attention_distance(model, images.to(device))
    distance = figures.attention_distance_figure(distances, title="Mean attention distance")
    return filters_figure(model), similarity, distance


def summary(model: VisionTransformer, folder: Path | None) -> str:
    """A table of what the model is, the last epoch's metrics and the model card when ``folder`` has them."""
    cfg = model.config
    h, w = cfg.img_hw
    n = model.num_params()
    tokens = f"{cfg.grid_size[0]}x{cfg.grid_size[1]} tokens of {cfg.feature_stride} px"
    names = model.class_names
    rows = [
        ("Variant", cfg.name or "custom"),
        ("Parameters", f"{n:,} ({format_count(n)})"),
        ("Input", f"{h}x{w}, {cfg.in_chans} channel{'s' if cfg.in_chans > 1 else ''}, {tokens}"),
        ("Tokens from", "a CNN feature map (hybrid)" if cfg.is_hybrid else "image patches"),
        ("Width / depth / heads", f"{cfg.embed_dim} / {cfg.depth} / {cfg.num_heads}"),
        ("Pooling", "class token" if cfg.global_pool == "token" else "average of patch tokens"),
        ("Classes", f"{cfg.num_classes}: {', '.join(names)[:300]}"),
    ]
    if folder is not None:
        rows.append(("Accuracy (measured)", measured_accuracy(folder, calibrated_views(model), len(names))))
        # the last epoch's check of the held-out photos is what their evaluation measured: each accuracy said once
        held_out = any((folder / f"eval_{HELD_OUT_SPLIT}{tta}.json").is_file() for tta in ("", "_flip"))
        if (training := training_summary(folder, with_test=not held_out)) is not None:
            rows.append(("Training", training))
    text = "| Property | Value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    card = folder / "README.md" if folder else None
    if card and card.is_file():
        body = card.read_text().split("---", 2)[-1].strip()
        text += "\n\n<details><summary>Model card</summary>\n\n" + _inline_images(body, folder) + "\n\n</details>"
    return text


def _json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


NOT_MEASURED = "not measured on a whole test split"
TOP5_FROM = 6  # classes: with fewer, a top-5 says nothing (with 2, it is always 100%)


def measured_accuracy(folder: Path, views: str | None, classes: int = TOP5_FROM) -> str:
    """The accuracy ``python -m train eval`` measured on a whole split (its ``eval_*.json``): top-1 (top-5 for
    ``TOP5_FROM`` classes or more), on how many images of which split, then with each test-time augmentation
    measured; the one of ``views``, the views the model is calibrated for
    (``vit_core.calibration.calibrated_views``), is what this app computes."""
    results = [r for p in sorted(folder.glob("eval_*.json")) if (r := _json(p)) and isinstance(r.get("top1"), float)]
    if not results:
        return f"{NOT_MEASURED} (no `eval_*.json`: `python -m train eval` writes one)"
    parts = []
    for r in sorted(results, key=lambda r: (r.get("data") or "", r.get("split") or "", r.get("tta") or "")):
        tta, count = r.get("tta"), r.get("count")
        top5 = f" ({r['top5']:.2f}% top-5)" if isinstance(r.get("top5"), float) and classes >= TOP5_FROM else ""
        images = f"the {count:,} images of " if isinstance(count, int) else ""
        on = f" on {images}the {r.get('data')} {r.get('split')} split" if tta is None or len(results) == 1 else ""
        how = "" if tta is None else " with flip averaging" if tta == "flip" else f" with {tta} views"
        how += ", as this app predicts" if tta == views else ""
        parts.append(f"{r['top1']:.2f}% top-1{top5}{on}{how}")
    return "; ".join(parts)


def training_summary(folder: Path, with_test: bool = True) -> str | None:
    """The run in a sentence, from ``metrics.jsonl`` (its last epoch) and ``recipe.json``: epochs and time, the
    last epoch's training loss and accuracy, and (``with_test``) the accuracy checked each epoch (on a subset of
    the test split when the recipe says so: not the whole-split number of ``measured_accuracy``). None without
    metrics."""
    lines = (folder / METRICS_NAME).read_text().strip().splitlines() if (folder / METRICS_NAME).is_file() else []
    try:
        last = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if not isinstance(last, dict):
        return None
    recipe = _json(folder / RECIPE_NAME) or {}
    number = lambda key: last.get(key) if isinstance(last.get(key), int | float) else None  # noqa: E731
    epochs = last.get("epoch")
    text = f"{epochs} epoch{'s' * (epochs != 1)}" if isinstance(epochs, int) else "a run"
    if number("elapsed_s"):
        text += f" in {number('elapsed_s') / 60:.0f} min"
    last_epoch = []
    if number("train_loss") is not None:
        last_epoch.append(f"training loss {number('train_loss'):.3f}")
    if number("train_top1") is not None:
        last_epoch.append(f"training accuracy {number('train_top1'):.1f}% (augmented images)")
    key = "ema_test_top1" if number("ema_test_top1") is not None else "test_top1"
    if with_test and number(key) is not None:
        subset = recipe.get("eval_subset")
        on = f"the {subset:,} test images checked each epoch" if isinstance(subset, int) else "the test split"
        weights = " (the weight average, as exported)" if key.startswith("ema") else ""
        last_epoch.append(f"{number(key):.2f}% on {on}{weights}")
    return text + (f"; last epoch: {', '.join(last_epoch)}" if last_epoch else "") + "."


_IMAGE_LINK = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}


def _inline_images(markdown: str, folder: Path) -> str:
    """Relative image links of a model card (``![curves](curves.png)``) point into the model's folder, which
    the browser cannot reach: embed those images as data URIs. Only image files inside the folder and under
    ``CARD_IMAGE_BYTES`` are read, so a card cannot pull in other files."""
    root = folder.resolve()

    def embed(m: re.Match) -> str:
        alt, target = m.groups()
        path = (root / target).resolve()
        mime = _MIME.get(path.suffix.lower())
        if mime is None or "://" in target or not path.is_relative_to(root) or not path.is_file():
            return m.group(0)
        if path.stat().st_size > CARD_IMAGE_BYTES:
            return m.group(0)
        return f"![{alt}](data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()})"

    return _IMAGE_LINK.sub(embed, markdown)
