"""The Classify tab: an image's top classes, the prediction in words, and a map of where the model looked.

Every setting re-renders at once from the cached forward pass (``rerender``); ``/classify`` is the API."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch
from gradio import image_utils
from gradio.data_classes import FileData
from PIL import Image

from vit_core import VisionTransformer, methods

from .. import model_info, render
from ..admission import COMPUTE
from ..analysis import Analysis, explained_class, relevance
from ..catalog import BUNDLED_LABEL
from ..errors import user_errors
from ..settings import PREDICTED, Settings, check_top_k, default_method, parse_settings
from .context import EXAMPLES, Context
from .inputs import CheckedDropdown, CheckedRadio
from .picker import Picker

MAX_TOP_K = 10


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


def explains(a: Analysis, s: Settings) -> str:
    """The class the map explains, in words."""
    names, predicted = a.names, int(a.probs.argmax())
    if not s.method.per_class:
        return f"Map explains: {names[predicted]}, the prediction (attention maps are the same for every class)"
    target = explained_class(a, s)
    why = "the predicted class" if target == predicted else f"chosen; the model predicts {names[predicted]}"
    return f"Map explains: {names[target]} ({why})"


@user_errors
def classify(
    ctx: Context,
    image: str | None,
    model_choice: str = BUNDLED_LABEL,
    method: str | None = None,
    target: str = PREDICTED,
    layer: int = -1,
    head: str = "mean",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    opacity: float = 0.5,
    top_k: int = 5,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's idiom)
) -> tuple[dict[str, float], Image.Image, float, str, str]:
    """Top-k classes; the image with a relevance map over the region the model saw (with a colour bar);
    the compute time in ms (decode, model and map; a cached forward pass is reused when only the settings
    change); the prediction in words ("Not sure — maybe ..." below 50%); and the class the map explains.
    ``method`` None: the model's default (``default_method``: RISE where it fits the server's budget)."""
    t0 = time.perf_counter()
    a = ctx.analysis(image, model_choice)
    method = method or default_method(a.model, ctx.device).title
    s = parse_settings(a.model, method, target, layer, head, head_fusion, discard_ratio, opacity)
    k = check_top_k(top_k, len(a.names))
    heat = relevance(a, s, ctx.device, lambda f, desc: progress(f, desc=desc))
    compute_ms = (time.perf_counter() - t0) * 1000
    top = a.probs.topk(k)
    labels = {a.names[i]: float(p) for p, i in zip(top.values, top.indices, strict=True)}
    overlay = render.map_on_image(a.shown, a.box, heat, s.opacity, method.lower())
    verdict = model_info.verdict(a.probs, a.names, a.is_ood)
    return labels, render.unique(overlay, method), round(compute_ms, 2), verdict, explains(a, s)


def rerender(ctx: Context, image: str | None, *settings):
    """Live controls: re-render with the new settings (reusing the cached forward pass); nothing to do
    before an image is there."""
    return classify(ctx, image, *settings) if image is not None else (gr.skip(),) * 5


def head_choices(model: VisionTransformer) -> list[str]:
    """The head controls' choices: the mean of the heads, or one of them."""
    return ["mean", *map(str, range(model.config.num_heads))]


def _in_sentence(name: str) -> str:
    """A method's name inside a sentence: "Gradient rollout" -> "gradient rollout"; "RISE" stays."""
    return name if name.split()[0].isupper() else name[0].lower() + name[1:]


def _example_label(path: str) -> str:
    """Examples are named ``<class>_<anything>.jpg``, or ``ood_<what>.jpg`` for an image of none of the
    classes."""
    kind, _, what = Path(path).stem.partition("_")
    return f"out-of-distribution: {what.replace('_', ' ')}" if kind == "ood" else kind.replace("-", " ")


@dataclass
class ClassifyTab:
    """The tab's controls that other tabs read (the image and the map settings), and those that follow the model."""

    image: ImageUpload
    method: gr.Radio
    target: gr.Dropdown
    layer: gr.Slider
    head: gr.Dropdown
    head_fusion: gr.Radio
    discard: gr.Slider
    opacity: gr.Slider
    top_k: gr.Slider

    @property
    def fitted(self) -> list[gr.components.Component]:
        return [self.target, self.layer, self.head, self.method]

    def fit(self, model: VisionTransformer, device: torch.device) -> list:
        depth = model.config.depth
        return [
            gr.Dropdown(choices=[PREDICTED, *model.class_names], value=PREDICTED),
            gr.Slider(minimum=-depth, maximum=depth - 1, value=-1, step=1),
            gr.Dropdown(choices=head_choices(model), value="mean"),
            gr.Radio(value=default_method(model, device).title),
        ]


def build(ctx: Context, picker: Picker) -> ClassifyTab:
    """The tab's two columns (inside the page's row): the image and the settings; the results."""
    model = picker.model
    depth = model.config.depth
    per_class = ", ".join(_in_sentence(m.name) for m in methods.METHODS if m.per_class)
    with gr.Column():
        image = ImageUpload(
            sources=["upload", "clipboard", "webcam"], type="filepath", label="Image", height=300, elem_id="image"
        )
        button = gr.Button("Classify", variant="primary", elem_id="classify")
        method = CheckedRadio(
            [m.title for m in methods.METHODS], value=default_method(model, ctx.device).title, label="Explanation"
        )
        with gr.Accordion("Explanation settings", open=False):
            # choices follow the loaded model; other values are checked server-side
            target = CheckedDropdown(
                [PREDICTED, *model.class_names],
                value=PREDICTED,
                allow_custom_value=True,
                label=f"Class to explain ({per_class})",
            )
            layer = gr.Slider(-depth, depth - 1, value=-1, step=1, label="Layer (raw attention; -1 = last)")
            head = CheckedDropdown(
                head_choices(model), value="mean", allow_custom_value=True, label="Head (raw attention)"
            )
            head_fusion = CheckedRadio(["mean", "max", "min"], value="mean", label="Head fusion (rollout)")
            discard = gr.Slider(0.0, 0.99, value=0.0, step=0.01, label="Discard ratio (rollout)")
        with gr.Row():
            opacity = gr.Slider(
                0.0, 1.0, value=0.5, step=0.05, label="Overlay opacity", elem_id="opacity", min_width=220
            )
            top_k = gr.Slider(1, MAX_TOP_K, value=5, step=1, label="Top-k", min_width=220)
        gr.Examples(
            EXAMPLES,
            inputs=image,
            example_labels=[_example_label(p) for p in EXAMPLES],
            label="Examples (licences in examples/LICENSES.md)",
        )
    with gr.Column():
        verdict = gr.Markdown(label="Prediction in words", elem_classes="verdict", elem_id="verdict")
        explained = gr.Markdown(label="Class the map explains", elem_id="explains")
        overlay = gr.Image(type="pil", label="Where the model looked", elem_id="overlay", height=360)
        gr.Markdown(
            "The coloured region is what the model saw, resized to its input size (a centre crop, "
            "or the whole image when the model squashes); the rest was not used. The colour bar gives "
            "the map's range."
        )
        labels = gr.Label(label="Top-k classes", show_heading=False, elem_id="labels")
        compute_ms = gr.Number(label="Compute time (ms): decode, model, map", precision=2)

    settings = [method, target, layer, head, head_fusion, discard, opacity, top_k]
    results = [labels, overlay, compute_ms, verdict, explained]
    button.click(
        ctx.handler(classify, "classify"),
        [image, picker.choice, *settings],
        results,
        api_name="classify",
        concurrency_id=COMPUTE,
    )
    gr.on(
        [
            method.input,
            target.input,
            layer.release,
            head.input,
            head_fusion.input,
            discard.release,
            opacity.release,
            top_k.release,
        ],
        ctx.handler(rerender, "classify"),
        [image, picker.choice, *settings],
        results,
        api_visibility="private",
        trigger_mode="always_last",
        show_progress="hidden",
        concurrency_id=COMPUTE,
    )
    return ClassifyTab(image, method, target, layer, head, head_fusion, discard, opacity, top_k)
