"""Gradio app: classify an image and see where the Vision Transformer looked.

    python app.py [--model PATH_OR_REPO] [--device auto|cpu|cuda] [--host 127.0.0.1] [--port 7860] [--share]

Runs locally (GPU when there is one), and unchanged as a Hugging Face Space (ZeroGPU included). All model,
image and explanation logic lives in ``vit_core``; this file is the UI around it.
"""

from __future__ import annotations

# ZeroGPU Spaces need `spaces` imported before anything touches CUDA; elsewhere it is absent.
try:
    import spaces
except ImportError:
    spaces = None

import argparse
import json
import threading
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

import gradio as gr
import torch
from gradio import image_utils
from gradio.data_classes import FileData
from PIL import Image

import vit_core
from vit_core import explain, figures
from vit_core.data import ImageDataError, build_transform, load_image

ROOT = Path(__file__).resolve().parent
BUNDLED = ROOT / "models" / "cifar10_vit"
BUNDLED_LABEL = "bundled: CIFAR-10 ViT"
EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.jpg"))
METHODS = ("Attention rollout", "Gradient rollout", "Raw attention")
PREDICTED = "(predicted class)"
MAX_SIDE = 2048  # overlays of larger images are drawn on a copy downscaled to this long side
MAX_PIXELS = 50_000_000  # larger uploads are refused before decoding (decompression bombs)


def gpu(fn):
    """Run ``fn`` on a ZeroGPU worker when on such a Space; unchanged elsewhere."""
    return spaces.GPU(fn) if spaces is not None else fn


class Models:
    """Loaded models by name, each with its preprocessing; loads are serialised, lookups are not."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._cache: dict[str, tuple[vit_core.VisionTransformer, object]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def path_of(choice: str) -> str:
        return str(BUNDLED) if choice == BUNDLED_LABEL else choice.strip()

    def get(self, choice: str) -> tuple[vit_core.VisionTransformer, object]:
        key = self.path_of(choice)
        if key in self._cache:
            return self._cache[key]
        with self._lock:
            if key not in self._cache:
                if not key:
                    raise gr.Error("Choose a model: the bundled one, a run folder, or a Hub repo id.")
                try:
                    model = vit_core.from_pretrained(key).to(self.device).eval()
                except Exception as e:  # every loader error is a message for the user here
                    raise gr.Error(f"Could not load {key!r}: {e}") from None
                self._cache[key] = (model, build_transform(model.pretrained_cfg))
        return self._cache[key]


def run_folders() -> list[str]:
    """Trained runs under runs/ (folders holding a checkpoint)."""
    runs = ROOT / "runs"
    found = runs.glob("*/config.json") if runs.is_dir() else []
    return sorted(str(p.parent.relative_to(ROOT)) for p in found if (p.parent / "model.safetensors").is_file())


class ImageUpload(gr.Image):
    """``gr.Image`` that hands the uploaded file to ``vit_core.data.load_image`` undecoded, so corrupt files,
    bombs and odd modes get our checks and messages instead of failing inside Gradio."""

    is_template = True

    def preprocess(self, payload: FileData | None) -> str | None:
        if payload is None:
            return None
        if payload.url and payload.url.startswith("data:"):  # pasted / webcam images arrive inline
            return image_utils.decode_base64_to_file(payload.url, self.GRADIO_CACHE, "png")
        return payload.path


def _autocast(device: torch.device):
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast("cuda", dtype=dtype)
    return nullcontext()


def classify(
    image: str | None,
    model_choice: str = BUNDLED_LABEL,
    method: str = METHODS[0],
    target: str = PREDICTED,
    layer: int = -1,
    head: str = "mean",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    opacity: float = 0.5,
    top_k: int = 5,
) -> tuple[dict[str, float], Image.Image, str]:
    """Top-k classes, the input image with a relevance heatmap, and the time the model took."""
    if image is None:
        raise gr.Error("Upload, paste or capture an image first.")
    try:
        img = load_image(image, max_pixels=MAX_PIXELS)
    except ImageDataError as e:
        raise gr.Error(str(e)) from None
    model, transform = MODELS.get(model_choice)
    names = model.label_names or [str(i) for i in range(model.config.num_classes)]
    t0 = time.perf_counter()
    x = transform(img).unsqueeze(0).to(MODELS.device)
    with _autocast(MODELS.device):
        if method == "Gradient rollout":
            if target not in (PREDICTED, "", None) and target not in names:
                raise gr.Error(f"{target!r} is not a class of this model; choose one of {', '.join(names)}")
            cls = None if target in (PREDICTED, "", None) else names.index(target)
            logits, heat = explain.gradient_rollout(model, x, target=cls, return_logits=True)
        elif method == "Raw attention":
            if head != "mean" and not (str(head).isdigit() and int(head) < model.config.num_heads):
                raise gr.Error(f"head must be 'mean' or 0..{model.config.num_heads - 1}, got {head!r}")
            if not -model.config.depth <= int(layer) < model.config.depth:
                raise gr.Error(f"layer must be in {-model.config.depth}..{model.config.depth - 1}, got {layer}")
            logits, heat = explain.attention_maps(
                model, x, layer=int(layer), head=None if head == "mean" else int(head), return_logits=True
            )
        else:
            logits, heat = explain.attention_rollout(
                model, x, head_fusion=head_fusion, discard_ratio=float(discard_ratio), return_logits=True
            )
    probs = logits.float().softmax(-1)[0].cpu()
    heat = heat[0].float().cpu()
    if MODELS.device.type == "cuda":
        torch.cuda.synchronize()
    compute_ms = (time.perf_counter() - t0) * 1000
    k = max(1, min(int(top_k), len(names)))
    top = probs.topk(k)
    labels = {names[i]: float(p) for p, i in zip(top.values, top.indices, strict=True)}
    # Draw the map over the region the model saw (the eval crop); the rest of the image stays as it was.
    shown = img.convert("RGB")
    if max(shown.size) > MAX_SIDE:
        shown.thumbnail((MAX_SIDE, MAX_SIDE))
    box = tuple(round(v) for v in transform.crop_box(*shown.size))
    out = shown.copy()
    out.paste(figures.overlay(shown.crop(box), heat, alpha=float(opacity), colormap="jet"), box[:2])
    # Gradio caches outputs under a hash of their bytes and rewrites that file on every request, so two
    # identical concurrent requests would overwrite the PNG while the other downloads it. A unique id in
    # the PNG's text metadata gives every response its own file.
    out.info["vit_core"] = f"{method}; request {uuid.uuid4().hex}"
    timing = f"Model + {method.lower()}: **{compute_ms:.0f} ms** on {MODELS.device.type.upper()}"
    return labels, out, timing


def inspect(model_choice: str) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The paper's figure 7 for the loaded model, and a summary of what it is."""
    model, transform = MODELS.get(model_choice)
    filters = figures.embedding_filters_figure(explain.embedding_filters(model))
    similarity = figures.position_similarity_figure(explain.position_embedding_similarity(model))
    batch = torch.stack([transform(load_image(p)) for p in EXAMPLES]).to(MODELS.device)
    with _autocast(MODELS.device):
        distances = explain.mean_attention_distance(model, batch)
    distance = figures.attention_distance_figure(distances)
    return filters, similarity, distance, _summary(model, model_choice)


def _summary(model: vit_core.VisionTransformer, choice: str) -> str:
    cfg = model.config
    h, w = cfg.img_hw
    rows = [
        ("Variant", cfg.name or "custom"),
        ("Parameters", f"{model.num_params():,}"),
        ("Resolution", f"{h}x{w}, {cfg.grid_size[0]}x{cfg.grid_size[1]} tokens of {cfg.feature_stride}px"),
        ("Width / depth / heads", f"{cfg.embed_dim} / {cfg.depth} / {cfg.num_heads}"),
        ("Pooling", "class token" if cfg.global_pool == "token" else "average of patch tokens"),
        ("Classes", f"{cfg.num_classes}: {', '.join(model.label_names or [])[:300]}"),
    ]
    folder = Path(Models.path_of(choice))
    metrics = folder / "metrics.jsonl"
    if metrics.is_file() and metrics.read_text().strip():
        last = json.loads(metrics.read_text().strip().splitlines()[-1])
        rows.append(
            (
                "Training (last epoch)",
                ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in last.items()),
            )
        )
    text = "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    card = folder / "README.md"
    if card.is_file():
        body = card.read_text().split("---", 2)[-1].strip()
        text += "\n\n<details><summary>Model card</summary>\n\n" + body + "\n\n</details>"
    return text


def on_model_change(model_choice: str, progress: gr.Progress = gr.Progress()):  # noqa: B008 (Gradio's idiom)
    """Load the chosen model (with a progress indicator) and fit the class / layer / head controls to it."""
    progress(0.1, desc=f"Loading {Models.path_of(model_choice)}")
    model, _ = MODELS.get(model_choice)
    names = model.label_names or [str(i) for i in range(model.config.num_classes)]
    cfg = model.config
    size = f"{model.num_params() / 1e6:.1f}M parameters, {cfg.num_classes} classes"
    status = f"Loaded **{model_choice}** ({cfg.name + ', ' if cfg.name else ''}{size})."
    return (
        status,
        gr.Dropdown(choices=[PREDICTED, *names], value=PREDICTED),
        gr.Slider(minimum=-cfg.depth, maximum=cfg.depth - 1, value=-1, step=1),
        gr.Dropdown(choices=["mean", *[str(i) for i in range(cfg.num_heads)]], value="mean"),
    )


def build_ui(default_model: str) -> gr.Blocks:
    choices = [BUNDLED_LABEL, *run_folders()]
    if default_model not in choices:
        choices.insert(0, default_model)
    model, _ = MODELS.get(default_model)
    classes = model.label_names or [str(i) for i in range(model.config.num_classes)]
    depth, heads = model.config.depth, model.config.num_heads
    with gr.Blocks(title="Vision Transformer: where did it look?") as demo:
        gr.Markdown(
            "# Where did the Vision Transformer look?\n"
            "Classify an image and see which patches the ViT's prediction drew on "
            "(attention rollout, gradient-weighted rollout, or one layer's raw attention)."
        )
        with gr.Row():
            model_choice = gr.Dropdown(
                choices, value=default_model, allow_custom_value=True, scale=3,
                label="Model: the bundled one, a run folder, or a Hub repo id (ours, timm or transformers)",
            )  # fmt: skip
            status = gr.Markdown()
        with gr.Tab("Classify"):
            with gr.Row():
                with gr.Column():
                    image = ImageUpload(
                        sources=["upload", "clipboard", "webcam"], type="filepath", label="Image", height=320
                    )
                    method = gr.Radio(list(METHODS), value=METHODS[0], label="Explanation")
                    with gr.Accordion("Explanation settings", open=False):
                        # choices follow the loaded model; other values are checked in classify()
                        target = gr.Dropdown([PREDICTED, *classes], value=PREDICTED, allow_custom_value=True,
                                             label="Class (gradient rollout)")  # fmt: skip
                        layer = gr.Slider(-depth, depth - 1, value=-1, step=1, label="Layer (raw attention; -1 = last)")
                        head = gr.Dropdown(["mean", *map(str, range(heads))], value="mean", allow_custom_value=True,
                                           label="Head (raw attention)")  # fmt: skip
                        head_fusion = gr.Radio(["mean", "max", "min"], value="mean", label="Head fusion (rollout)")
                        discard = gr.Slider(0.0, 0.99, value=0.0, step=0.01, label="Discard ratio (rollout)")
                    opacity = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Overlay opacity")
                    top_k = gr.Slider(1, 10, value=5, step=1, label="Top-k")
                    button = gr.Button("Classify", variant="primary")
                with gr.Column():
                    labels = gr.Label(label="Prediction")
                    overlay = gr.Image(type="pil", label="Where the model looked", format="png")
                    timing = gr.Markdown()
            gr.Examples(EXAMPLES, inputs=image, label="Examples (licences in examples/LICENSES.md)")
            inputs = [image, model_choice, method, target, layer, head, head_fusion, discard, opacity, top_k]
            button.click(gpu(classify), inputs, [labels, overlay, timing], api_name="classify")
        with gr.Tab("Inspect"):
            gr.Markdown("The paper's figure 7 for this model, and what it is.")
            analyse = gr.Button("Analyse model")
            with gr.Row():
                fig_filters = gr.Image(label="RGB embedding filters (first principal components)")
                fig_similarity = gr.Image(label="Position embedding similarity")
                fig_distance = gr.Image(label="Mean attention distance")
            summary = gr.Markdown()
            analyse.click(gpu(inspect), model_choice, [fig_filters, fig_similarity, fig_distance, summary],
                          api_name="inspect")  # fmt: skip
        model_choice.change(on_model_change, model_choice, [status, target, layer, head], api_name=False)
        demo.load(on_model_change, model_choice, [status, target, layer, head], api_name=False)
    return demo


def setup(model: str, device: str = "auto", threads: int | None = None) -> None:
    """Pick the device, load the default model (failing fast, before serving) and size torch's CPU threads."""
    global MODELS
    if device == "cuda" and not torch.cuda.is_available() and spaces is None:
        raise SystemExit("--device cuda: no CUDA device is available")
    if spaces is not None or (device == "auto" and torch.cuda.is_available()):
        device = "cuda"  # on ZeroGPU, CUDA is attached per call by spaces.GPU
    MODELS = Models(torch.device("cpu" if device == "auto" else device))
    loaded, _ = MODELS.get(model)
    if MODELS.device.type == "cpu":
        # Small models run fastest on one thread: hand-offs between threads cost more than they save.
        torch.set_num_threads(threads or (1 if loaded.num_params() < 10_000_000 else torch.get_num_threads()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=BUNDLED_LABEL, help="run folder, checkpoint folder or Hub repo id")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--host", default=None, help="address to serve on (default 127.0.0.1; 0.0.0.0 on a Space)")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--share", action="store_true", help="create a public gradio.live link")
    p.add_argument("--concurrency", type=int, default=1, help="requests computed at once (one GPU: 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: 1 for models under 10M parameters, else all cores)")  # fmt: skip
    args = p.parse_args()
    setup(args.model, args.device, args.threads)
    demo = build_ui(args.model)
    demo.queue(default_concurrency_limit=args.concurrency, max_size=64)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share)


MODELS: Models = Models(torch.device("cpu"))

if __name__ == "__main__":
    main()
