"""Pictures of explanations and results, as PIL images: heatmap overlays, the paper's figure 7 panels,
training curves, confusion matrices, reliability diagrams and the accuracy-against-compute plot (figure 5).

Computation lives in ``vit_core.explain``; this module only draws. Plots use matplotlib's object API
(``matplotlib.figure.Figure`` on an Agg canvas), so no GUI backend or global pyplot state is involved
and the functions are safe in servers and threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from PIL import Image

OVERLAY_PIXELS = 1 << 18  # pixels ``overlay`` colours and blends at a time (whole rows)


def _render(fig: Figure) -> Image.Image:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB")


def _numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float32)


def to_image(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> Image.Image:
    """A model-ready (C, H, W) tensor back to the PIL image the model sees (after resize and crop),
    undoing the normalisation: the picture to draw a relevance map on, as it lines up with the tokens."""
    if x.ndim != 3 or x.shape[0] not in (1, 3) or len(mean) != x.shape[0] or len(std) != x.shape[0]:
        raise ValueError(f"expected a (C, H, W) tensor with C = len(mean) = len(std) in (1, 3), got {tuple(x.shape)}")
    m = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    pixels = (x.detach().float().cpu() * s + m).clamp(0, 1).mul(255).round().to(torch.uint8)
    a = pixels.permute(1, 2, 0).numpy()
    return Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a)


def overlay(
    image: Image.Image, heatmap: torch.Tensor | np.ndarray, alpha: float = 0.5, colormap: str = "jet"
) -> Image.Image:
    """Blend a 2D relevance map onto ``image``: an RGB PIL image the size of ``image``.

    ``image`` should be what the model saw (``to_image(x[i], mean, std)``): a map covers the resized and
    center-cropped input, not the uncropped original.

    The map (any resolution, e.g. the token grid) is min-max scaled to [0, 1] (a constant map becomes
    0), upsampled bicubically to the image size (smooth, not one block per patch), coloured with the
    matplotlib ``colormap`` and mixed as ``(1 - alpha) * image + alpha * colour``.
    """
    if not isinstance(image, Image.Image):
        raise TypeError(f"image must be a PIL image, got {type(image).__name__}")
    m = _numpy(heatmap)
    if m.ndim != 2:
        raise ValueError(f"heatmap must be 2D (h, w), got shape {m.shape}; pick one image of a batch with maps[i]")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if colormap not in colormaps:
        raise ValueError(f"unknown colormap {colormap!r}; any matplotlib name works, e.g. 'jet', 'inferno'")
    lo, hi = float(m.min()), float(m.max())
    m = (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)
    m = np.asarray(Image.fromarray(m.astype(np.float32)).resize(image.size, Image.BICUBIC))
    table, (w, h) = _colour_table(colormap), image.size
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    # A band of rows at a time: the temporaries (about 30 bytes a pixel) stay the size of one band, so a large
    # picture costs its own pixels and little more.
    rows = max(1, OVERLAY_PIXELS // w)
    if rows >= h:
        return Image.blend(rgb, _colour_pixels(m, table), alpha)
    out = Image.new("RGB", (w, h))
    for top in range(0, h, rows):
        band = (0, top, w, min(top + rows, h))
        out.paste(Image.blend(rgb.crop(band), _colour_pixels(m[top : band[3]], table), alpha), band[:2])
    return out


def _colour_pixels(m: np.ndarray, table: np.ndarray) -> Image.Image:
    """Values in [0, 1] coloured from a ``_colour_table``, as matplotlib indexes its table: floor(x * N), the top
    end in the last entry (min(x * N, N - 1), floored)."""
    index = np.clip(m, 0.0, 1.0)
    index *= len(table)
    colour = table[np.minimum(index, len(table) - 1, out=index).astype(np.intp)]
    return Image.frombytes("RGB", (m.shape[1], m.shape[0]), colour, "raw", "RGBX")


@lru_cache(maxsize=16)
def _colour_table(colormap: str) -> np.ndarray:
    """The colours of matplotlib's ``colormap`` (its N entries, as ``cmap(i)`` gives them) in 8 bits, rounded, each
    packed as one RGBX uint32; read-only: ``overlay`` looks them up and Pillow blends them, both in 8 bits, within
    1 of the colormap blended in floats, at a fraction of the time."""
    cmap = colormaps[colormap]
    rgbx = np.zeros((cmap.N, 4), dtype=np.uint8)
    rgbx[:, :3] = np.round(cmap(np.arange(cmap.N))[:, :3] * 255)
    table = rgbx.view(np.uint32)[:, 0]
    table.flags.writeable = False
    return table


def embedding_filters_figure(
    filters: torch.Tensor | np.ndarray, columns: int = 7, title: str | None = None
) -> Image.Image:
    """Paper fig. 7 left: the principal components of the patch embedding (``inspection.embedding_filters``),
    each scaled to [0, 1] on its own and shown as an RGB (or grey) patch. Any (n, C, k, k) filters draw the
    same way (``title`` says what they are), e.g. a hybrid's first convolution."""
    f = _numpy(filters)
    if f.ndim != 4:
        raise ValueError(f"filters must be (n, C, P, P), got shape {f.shape}")
    n, c = f.shape[:2]
    rows = -(-n // columns)
    fig = Figure(figsize=(columns * 0.8, rows * 0.8 + 0.6), dpi=100, layout="constrained")
    fig.suptitle(title or f"RGB embedding filters\n(first {n} principal components)", fontsize=9)
    for i in range(n):
        ax = fig.add_subplot(rows, columns, i + 1)
        x = f[i].transpose(1, 2, 0)
        x = (x - x.min()) / max(float(x.max() - x.min()), 1e-12)
        ax.imshow(x[..., 0] if c == 1 else x, cmap="gray" if c == 1 else None, interpolation="nearest")
        ax.set_axis_off()
    return _render(fig)


def position_similarity_figure(similarity: torch.Tensor | np.ndarray) -> Image.Image:
    """Paper fig. 7 centre: tile (i, j) shows the cosine similarity of patch (i, j)'s position
    embedding to every patch's (``inspection.position_embedding_similarity``)."""
    s = _numpy(similarity)
    if s.ndim != 4:
        raise ValueError(f"similarity must be (h, w, h, w), got shape {s.shape}")
    h, w = s.shape[:2]
    # One mosaic image with a 1-pixel gap between tiles: a single imshow instead of h*w subplots.
    mosaic = np.full((h * (h + 1), w * (w + 1)), np.nan, dtype=np.float32)
    for i in range(h):
        for j in range(w):
            mosaic[i * (h + 1) : i * (h + 1) + h, j * (w + 1) : j * (w + 1) + w] = s[i, j]
    fig = Figure(figsize=(6.4, 5.6 * h / w + 0.6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    cmap = colormaps["viridis"].with_extremes(bad="white")
    im = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    ax.set_title("Position embedding similarity")
    ax.set_xticks(np.arange(w) * (w + 1) + (w - 1) / 2, [str(j + 1) for j in range(w)], fontsize=6)
    ax.set_yticks(np.arange(h) * (h + 1) + (h - 1) / 2, [str(i + 1) for i in range(h)], fontsize=6)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    fig.colorbar(im, ax=ax, shrink=0.8, label="Cosine similarity")
    return _render(fig)


def attention_distance_figure(distances: torch.Tensor | np.ndarray, title: str | None = None) -> Image.Image:
    """Paper fig. 7 right / fig. 11: mean attention distance (``inspection.mean_attention_distance``,
    (depth, heads) in pixels) against depth, one dot per head. Layers and heads are numbered from 0, as
    everywhere in ``vit_core`` and the app."""
    d = _numpy(distances)
    if d.ndim != 2:
        raise ValueError(f"distances must be (depth, heads), got shape {d.shape}")
    depth, heads = d.shape
    fig = Figure(figsize=(5, 4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for h in range(heads):
        ax.scatter(np.arange(depth), d[:, h], s=12, label=f"head {h}")
    ax.set_xlabel("Network depth (layer, from 0)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_xticks(np.arange(depth))
    ax.set_ylim(0, 1.1 * max(float(d.max()), 1e-6))
    if title:
        ax.set_title(title)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    return _render(fig)


def training_curves_figure(history: Sequence[dict]) -> Image.Image:
    """A run's loss, accuracy and learning rate per epoch (the rows of ``metrics.jsonl``), side by side."""
    epochs = [row["epoch"] for row in history]
    fig = Figure(figsize=(12, 3.6), dpi=100, layout="constrained")
    ax_loss, ax_acc, ax_lr = fig.subplots(1, 3)
    panels = (
        (ax_loss, "loss", ("train_loss", "test_loss")),
        (ax_acc, "accuracy (%)", ("train_top1", "test_top1", "ema_test_top1", "train_acc", "test_acc")),
        (ax_lr, "learning rate", ("lr",)),
    )
    for ax, title, keys in panels:
        for key in keys:
            ys = [row.get(key) for row in history]
            if any(y is not None for y in ys):
                ax.plot(epochs, [np.nan if y is None else y for y in ys], marker=".", label=key)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if ax is not ax_lr:
            ax.legend()
    return _render(fig)


SHOWN_ON_A_PHONE = 350  # px: the width a page 390 px wide shows a figure at
READABLE_PX = 12  # the least height of a figure's numbers as shown, on a phone too


def confusion_size(k: int) -> tuple[float, float]:
    """The confusion matrix's size in inches (at 100 dpi) for ``k`` classes."""
    size = min(3 + 0.45 * k, 24)
    return size * 1.15, size


def count_points(k: int) -> float:
    """The font size of the counts in a ``k``-class confusion matrix: ``READABLE_PX`` high once the picture is
    shown ``SHOWN_ON_A_PHONE`` px wide, as long as that fits in a cell (then the cell's size decides)."""
    width_px = 100 * confusion_size(k)[0]
    readable = READABLE_PX * width_px / SHOWN_ON_A_PHONE
    cell = 0.6 * width_px / k  # the matrix takes about 60% of the figure's width
    return min(readable, 0.4 * cell) * 72 / 100


def confusion_figure(confusion: torch.Tensor | np.ndarray, labels: Sequence[str], title: str = "") -> Image.Image:
    """A confusion matrix (rows: true class, columns: predicted): colours are each row's fractions, and the
    counts are written in the cells when there are at most 20 classes, readable on a phone (``count_points``)."""
    cm = _numpy(confusion).astype(np.float64)
    k = len(labels)
    frac = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    fig = Figure(figsize=confusion_size(k), dpi=100, layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(frac, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, label="fraction of the true class")
    points = count_points(k)
    if k <= 50:
        ax.set_xticks(range(k), labels, rotation=60, ha="right", fontsize=max(8, 0.75 * points))
        ax.set_yticks(range(k), labels, fontsize=max(8, 0.75 * points))
    if k <= 20:
        for i in range(k):
            for j in range(k):
                color = "white" if frac[i, j] > 0.5 else "black"
                ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=points, color=color)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    return _render(fig)


def reliability_figure(curves: dict[str, dict[str, list]], title: str = "") -> Image.Image:
    """A reliability diagram (Guo et al. 2017, figure 1): per confidence bin, the accuracy of the predictions
    in it against their mean confidence, one set of bars per entry of ``curves`` (name -> ``count``,
    ``confidence``, ``accuracy`` lists, as ``vit_core.training.evaluation`` records them; None for empty bins), with
    the diagonal of perfect calibration and each curve's ECE; below, the share of images per bin."""
    fig = Figure(figsize=(5.2, 6), dpi=100, layout="constrained")
    ax, ax_n = fig.subplots(2, 1, height_ratios=(3, 1), sharex=True)
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="perfect calibration")
    styles = [dict(fill=False, edgecolor="tab:red", linewidth=1.2), dict(color="tab:blue", alpha=0.6)]
    for i, (name, r) in enumerate(curves.items()):
        counts = np.asarray(r["count"], dtype=np.float64)
        bins = len(counts)
        width = 1 / bins
        left = np.arange(bins) * width
        acc = np.array([np.nan if a is None else a for a in r["accuracy"]])
        conf = np.array([np.nan if c is None else c for c in r["confidence"]])
        gaps = np.where(counts > 0, np.abs(np.nan_to_num(acc) - np.nan_to_num(conf)), 0.0)
        ece = float((counts * gaps).sum() / max(counts.sum(), 1))
        style = styles[min(i, len(styles) - 1)]
        ax.bar(left, np.nan_to_num(acc), width=width, align="edge", label=f"{name}: ECE {ece:.3f}", **style)
        ax_n.bar(left, counts / max(counts.sum(), 1), width=width, align="edge", **style)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=9)
    ax_n.set_xlabel("confidence (top probability)")
    ax_n.set_ylabel("share of images")
    return _render(fig)


def compute_figure(points: Sequence[dict]) -> Image.Image:
    """The paper's figure 5 at small scale: test accuracy against training minutes (log scale), one line per
    model family through its budgets (``points``: dicts with family, minutes, top1, epochs)."""
    fig = Figure(figsize=(7, 4.5), dpi=100, layout="constrained")
    ax = fig.subplots()
    for family in sorted({p["family"] for p in points}):
        pts = sorted((p for p in points if p["family"] == family), key=lambda p: p["minutes"])
        ax.plot([p["minutes"] for p in pts], [p["top1"] for p in pts], marker="o", label=family)
        for p in pts:
            ax.annotate(f"{p['epochs']} ep", (p["minutes"], p["top1"]), textcoords="offset points", xytext=(4, -10))
    ax.set_xscale("log")
    minutes = FuncFormatter(lambda v, _: f"{v:g}")  # 3, 4, 5, not 3x10^0
    ax.xaxis.set_major_formatter(minutes)
    ax.xaxis.set_minor_formatter(minutes)
    ax.set_xlabel("training minutes on a 2-core CPU (log scale)")
    ax.set_ylabel("CIFAR-10 test top-1 (%)")
    ax.set_title("Accuracy against training compute (Dosovitskiy et al., figure 5, at small scale)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _render(fig)
