"""The Classify tab: an image's top classes, the prediction in words, and a map of where the model looked.

It classifies as soon as an image is chosen (uploaded, pasted, captured or an example clicked) and again when
the model changes; every setting re-renders from the cached forward pass. The page's events show ``show``'s
answer to the newest request (``fresh``); ``/classify`` is the API, which raises its errors. ``estimate``: a
request's memory (the upload's decode, the analysis, the map, the overlay)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch
from PIL import Image

from vit_core import VisionTransformer, methods

from .. import estimates, model_info, render
from ..admission import COMPUTE
from ..analysis import Analysis, Upload, declared, explained_class, map_key, relevance
from ..catalog import BUNDLED_LABEL
from ..errors import user_errors
from ..settings import (
    PREDICTED,
    Settings,
    check_top_k,
    head_name,
    layer_name,
    legend,
    lrp_based,
    lrp_notice,
    parse_settings,
)
from ..ui import fresh
from ..ui.context import EXAMPLES, Context
from ..ui.inputs import CheckedDropdown, CheckedRadio, ImageUpload
from ..ui.picker import Page

TITLE = "Classify"

MAX_TOP_K = 10
DRAW_BYTES = 36  # the overlay at the reduced image's size and its encoding, a pixel of it (measured 23)
GROUP = "classify"
LAYER = "Layer (raw attention)"
# On a phone the results sit a screen below the image: bring them into view when an image is chosen.
SCROLL_TO_RESULTS_JS = """(image) => {
  if (image && window.matchMedia('(max-width: 640px)').matches)
    document.getElementById('verdict')?.scrollIntoView({behavior: 'smooth', block: 'start'});
  return [];
}"""


def explains(a: Analysis, s: Settings) -> str:
    """The class the map explains, in words."""
    names, predicted = a.names, int(a.probs.argmax())
    if not s.method.per_class:
        where = (
            f"; {layer_name(s.layer, a.model.config.depth)}, {head_name(s.head)}" if "layer" in s.method.options else ""
        )
        return f"Map explains: {names[predicted]}, the prediction (attention maps are the same for every class{where})"
    target = explained_class(a, s)
    why = "the predicted class" if target == predicted else f"chosen; the model predicts {names[predicted]}"
    return f"Map explains: {names[target]} ({why})"


def estimate(ctx: Context, arguments: dict) -> int:
    """A request's memory: the upload decoded, then the analysis and the map asked for (on a CPU) beside the
    overlay (``webapp.estimates``)."""
    model, transform = estimates.model_of(ctx.models.loaded, arguments.get("model_choice"))
    work = 0
    if model is not None and ctx.device.type == "cpu":
        method = estimates.method_of(arguments.get("method")) or ctx.default_method
        work = estimates.analysis_bytes(model.config) + estimates.map_bytes(model.config, method)
    return estimates.image_request(declared(arguments.get("image")), transform, DRAW_BYTES, work)


@user_errors
def classify(
    ctx: Context,
    image: Upload | str | None,
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
) -> tuple[dict[str, float], Image.Image, float, str, str, dict]:
    """Top-k classes; the image with a relevance map over the region the model saw (with a colour bar);
    the compute time in ms (decode, model and map; a cached forward pass is reused when only the settings
    change); the prediction in words with, when it is not a plain answer, why on a second line ("Not sure -
    torn between ..." or "Not sure - maybe ..." below 50%; "Not one of my N classes - most like: ..." when the
    model's detector says so); the class the map explains; and that "none of my classes" check in numbers with
    the same decision and reason.
    A method of None is the server's default map (AttnLRP unless the server chose another).
    Layer and head (raw attention) are numbered from 0; a negative layer counts from the end (-1: the last)."""
    settings = (method, target, layer, head, head_fusion, discard_ratio, opacity, top_k)
    return answer(ctx, image, model_choice, settings, progress)[:6]


NEW, MAP_ONLY, CACHED = "new", "map only", "cached"  # what a compute time covered (``answer``)


def answer(
    ctx: Context, image: Upload | str | None, model_choice: str, settings: tuple, progress: Callable[..., object]
) -> tuple[dict[str, float], Image.Image, float, str, str, dict, str]:
    """``classify``'s answer for its ``settings`` (method to top_k, in its order), and what the compute time
    covered: ``NEW`` (the image decoded and run through the model, then the map), ``MAP_ONLY`` (the image's
    forward pass was cached, the map was drawn) or ``CACHED`` (the forward pass and the map were both computed
    by an earlier request)."""
    method, target, layer, head, head_fusion, discard_ratio, opacity, top_k = settings
    t0 = time.perf_counter()
    a = ctx.analysis(image, model_choice)
    method = method or ctx.default_method.title
    s = parse_settings(a.model, method, target, layer, head, head_fusion, discard_ratio, opacity)
    k = check_top_k(top_k, len(a.names))
    map_cached = s.method.from_attentions is None and map_key(a, s) in a.maps
    heat = relevance(a, s, ctx.device, lambda f, desc: progress(f, desc=desc))
    compute_ms = (time.perf_counter() - t0) * 1000
    covered = NEW if a.created >= t0 else CACHED if map_cached else MAP_ONLY
    top = a.probs.topk(k)
    labels = {a.names[i]: float(p) for p, i in zip(top.values, top.indices, strict=True)}
    overlay = render.map_on_image(a.shown, a.box, heat, s.opacity, method.lower())
    verdict = model_info.analysis_decision(a).markdown()
    return labels, render.unique(overlay, method), round(compute_ms, 2), verdict, explains(a, s), ood_check(a), covered


def compute_note(ms: float, covered: str) -> str:
    """The compute time in words, saying what it covered (``answer``)."""
    took = model_info.format_ms(ms)
    if covered == NEW:
        return f"Computed in {took} (decode, model and map)."
    if covered == MAP_ONLY:
        return f"Computed in {took} (the map; this image's forward pass was cached)."
    return f"Answered in {took} from the cache (this image and this map were computed before)."


def ood_check(a: Analysis) -> dict:
    """The "none of my classes" check of an analysis, as the batch CSV gives it: the decision, the score and the
    stored threshold it was compared with (all None for a model without a detector: its calibration is
    unknown, and only the "Not sure" rule applies); and the app's decision (``model_info.decide``: "answer",
    "none of my classes", "torn" or "not sure") with its reason in words."""
    detector = a.model.calibration.ood if a.model.calibration is not None else None
    decision = model_info.analysis_decision(a)
    return {
        "decision": decision.kind,
        "reason": decision.reason,
        "none_of_my_classes": a.is_ood,
        "ood_score": a.ood_score,
        "threshold": None if detector is None else detector.threshold,
        "score": None if detector is None else detector.score,
    }


BLANK = (None, None, "", "", "")  # labels, overlay, compute time, verdict (shown large), class explained


def show(
    ctx: Context,
    image: Upload | None,
    model_choice: str,
    method: str,
    target: str,
    layer: int,
    head: str,
    head_fusion: str,
    discard_ratio: float,
    opacity: float,
    top_k: int,
    ticket: float | None,
    request: gr.Request,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's idiom)
) -> tuple:
    """The tab's results for what is on screen (``classify``), the compute time in words; an error in place
    of the verdict. Nothing before an image is there."""

    def compute() -> tuple:
        if image is None:
            return BLANK
        settings = (method, target, layer, head, head_fusion, discard_ratio, opacity, top_k)
        labels, overlay, ms, verdict, explained, _, covered = user_errors(answer)(
            ctx, image, model_choice, settings, progress
        )
        return labels, overlay, compute_note(ms, covered), headline(verdict), explained

    def failed(message: str) -> tuple:
        return *BLANK[:3], headline(fresh.problem(message), large=False), ""

    subject = fresh.subject_of(image, model_choice)
    held = ctx.held(estimate, image=image, model_choice=model_choice, method=method)
    return fresh.answer(request, GROUP, ticket, subject, len(BLANK), compute, failed, held)


def headline(text: str, large: bool = True) -> dict:
    """The verdict's place: the prediction in large type; a problem, or "Classifying…", in normal type."""
    return gr.update(value=text, elem_classes=["verdict"] if large else ["verdict", "quiet"])


def blank(image: Upload | None) -> tuple:
    """The results while a new image or model is being classified."""
    return (*BLANK[:3], headline("*Classifying…*", large=False), "") if image is not None else BLANK


def head_choices(model: VisionTransformer) -> list[str]:
    """The head controls' choices: the mean of the heads, or one of them, numbered from 0 (as layers)."""
    return ["mean", *map(str, range(model.config.num_heads))]


def layer_range(model: VisionTransformer, label: str) -> dict:
    """A layer slider's range for ``model``: its blocks from 0 (the first) to depth - 1 (the last, the default),
    as the explanations, the API and ``vit_core`` number them."""
    depth = model.config.depth
    return dict(minimum=0, maximum=depth - 1, value=depth - 1, label=f"{label}: 0 = first, {depth - 1} = last")


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
    api_layer: gr.Number  # the API's layer: any block, negative from the end as in ``vit_core`` (the slider: 0..)
    default_method: str  # the map a new model starts on

    @property
    def fitted(self) -> list[gr.components.Component]:
        return [self.target, self.layer, self.head, self.method]

    def fit(self, model: VisionTransformer, device: torch.device) -> list:
        return [
            gr.Dropdown(choices=[PREDICTED, *model.class_names], value=PREDICTED),
            gr.Slider(**layer_range(model, LAYER)),
            gr.Dropdown(choices=head_choices(model), value="mean"),
            gr.Radio(value=self.default_method),
        ]


def build(ctx: Context, page: Page) -> ClassifyTab:
    """The tab's two columns: the image and the settings; the results."""
    with gr.Row():
        return _build(ctx, page)


def _build(ctx: Context, page: Page) -> ClassifyTab:
    picker = page.picker
    model, default = picker.model, ctx.default_method.title
    per_class = ", ".join(_in_sentence(m.name) for m in methods.METHODS if m.per_class)
    with gr.Column():
        image = ImageUpload(
            sources=["upload", "clipboard", "webcam"], type="filepath", label="Image", height=300, elem_id="image"
        )
        button = gr.Button("Classify", variant="primary", elem_id="classify")
        method = CheckedRadio([m.title for m in methods.METHODS], value=default, label="Explanation")
        gr.Markdown(legend(methods.METHODS), elem_classes="legend", elem_id="method-legend")
        if lrp_based():
            gr.Markdown(lrp_notice(), elem_classes="notice", elem_id="lrp-notice")
        with gr.Accordion("Explanation settings", open=False):
            # choices follow the loaded model; other values are checked server-side
            target = CheckedDropdown(
                [PREDICTED, *model.class_names],
                value=PREDICTED,
                allow_custom_value=True,
                label=f"Class to explain ({per_class})",
            )
            layer = gr.Slider(step=1, info=methods.OPTIONS["layer"], **layer_range(model, LAYER))
            head = CheckedDropdown(
                head_choices(model),
                value="mean",
                allow_custom_value=True,
                label="Head (raw attention)",
                info=methods.OPTIONS["head"],
            )
            head_fusion = CheckedRadio(
                ["mean", "max", "min"], value="mean", label="Head fusion (rollout)", info=methods.OPTIONS["head_fusion"]
            )
            discard = gr.Slider(
                0.0, 0.99, value=0.0, step=0.01, label="Discard ratio (rollout)", info=methods.OPTIONS["discard_ratio"]
            )
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
    with gr.Column(elem_id="results"):
        verdict = gr.Markdown(label="Prediction in words", elem_classes="verdict", elem_id="verdict")
        explained = gr.Markdown(label="Class the map explains", elem_id="explains")
        # no label drawn over the picture: the line above says what it shows (the label names the API output)
        overlay = gr.Image(
            type="pil",
            label="Where the model looked",
            show_label=False,
            elem_id="overlay",
            elem_classes="figure",
            height=360,
        )
        gr.Markdown(
            "The coloured region is what the model saw, resized to its input size (a centre crop, "
            "or the whole image when the model squashes); the rest was not used. The colour bar gives "
            "the map's range."
        )
        labels = gr.Label(label="Top-k classes", show_heading=False, elem_id="labels")
        compute_time = gr.Markdown(elem_id="compute-time")
    # the API's own inputs and outputs where the page shows them differently
    api_layer = gr.Number(-1, precision=0, visible=False, label="Layer (raw attention): 0 = first, -1 = last")
    compute_ms = gr.Number(label="Compute time (ms): decode, model, map", precision=2, visible=False)
    ood = gr.JSON(label="None of my classes: decision, score, threshold", visible=False)

    settings = [method, target, layer, head, head_fusion, discard, opacity, top_k]
    results = [labels, overlay, compute_time, verdict, explained]
    gr.on([image.change, button.click], None, [image], None, js=SCROLL_TO_RESULTS_JS)
    new_input = fresh.on_change([image.change, picker.active.change], [GROUP], [image, picker.active], blank, results)
    handler = ctx.handler(show, None)
    fresh.then(
        new_input,
        handler,
        [image, picker.active, *settings],
        results,
        show_progress_on=[overlay],
        concurrency_id=COMPUTE,
        api_name="classify_new",
    )
    fresh.listen(
        [
            button.click,
            method.input,
            target.input,
            layer.release,
            head.input,
            head_fusion.input,
            discard.release,
            opacity.release,
            top_k.release,
        ],
        handler,
        [image, picker.active, *settings],
        results,
        show_progress_on=[overlay],
        concurrency_id=COMPUTE,
        api_name="classify_page",
    )
    api_settings = [method, target, api_layer, head, head_fusion, discard, opacity, top_k]
    gr.on(
        [],
        ctx.handler(classify, estimate),
        [image, picker.choice, *api_settings],
        [labels, overlay, compute_ms, verdict, explained, ood],
        api_name="classify",
        concurrency_id=COMPUTE,
    )
    return ClassifyTab(image, method, target, layer, head, head_fusion, discard, opacity, top_k, api_layer, default)
