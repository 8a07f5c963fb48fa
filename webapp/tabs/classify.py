"""The Classify tab: an image's top classes, the prediction in words, and a map of where the model looked.

It classifies as soon as an image is chosen (uploaded, pasted, captured or an example clicked) and again when
the model changes; every setting re-renders from the cached forward pass. The page's events show ``show``'s
answer to the newest request (``fresh``); ``/classify`` is the API, which raises its errors. ``estimate``: a
request's memory (the upload's decode, the analysis, the map, the overlay)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import torch
from PIL import Image

from vit_core import VisionTransformer

from ..inference import estimates, model_info, render
from ..inference.analysis import (
    Analysis,
    FirstLook,
    Step,
    Upload,
    declared,
    explained_class,
    map_key,
    relevance,
    untimed,
)
from ..inference.settings import MapSettings, Settings, check_top_k, head_name, layer_name
from ..registry.catalog import EXAMPLES
from ..ui.controls import Controls, figure
from ..ui.declarations import Api, Clear, Event, Page, Shown, Tab
from ..ui.endpoints import Context, Prepared, api, problem
from ..ui.inputs import JpegFigure

TITLE = "Classify"

DRAW_BYTES = 36  # the overlay at the reduced image's size and its encoding, a pixel of it (measured 23)
GROUP = "classify"
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


def estimate(ctx: Context, request: Prepared) -> int:
    """A request's memory: the upload decoded, then the analysis and the map asked for (on a CPU) beside the
    overlay (``webapp.inference.estimates``)."""
    model, transform = ctx.loaded(request)
    work = 0
    if model is not None and ctx.device.type == "cpu":
        method = request.method(ctx.default_method, strict=False)
        work = estimates.analysis_bytes(model.config) + estimates.map_bytes(model.config, method)
    return estimates.image_request(declared(request.values.get("image")), transform, DRAW_BYTES, work)


def _classify(ctx: Context, request: Prepared) -> tuple[dict[str, float], Image.Image, float, str, str, dict]:
    """Top-k classes; the image with a relevance map over the region the model saw (with a colour bar);
    the compute time in ms (decode, model and map; a cached forward pass is reused when only the settings
    change); the prediction in words with, when it is not a plain answer, why on a second line ("Not sure -
    torn between ..." or "Not sure - maybe ..." below 50%; "Not one of my N classes - most like: ..." when the
    model's detector says so); the class the map explains; and that "none of my classes" check in numbers with
    the same decision and reason.
    A method of None is the server's default map (AttnLRP unless the server chose another).
    Layer and head (raw attention) are numbered from 0; a negative layer counts from the end (-1: the last)."""
    return classified(ctx, request).api()


classify = api(_classify, ("image", "model_choice", *MapSettings.names()), progress=True)

NEW, MAP_ONLY, CACHED = "new", "map only", "cached"  # what a compute time covered (``classified``)


@dataclass(frozen=True)
class Classified:
    """``classified``.s result: what ``/classify`` returns (``api``), and what its compute time covered."""

    labels: dict[str, float]  # the top-k classes and their probabilities
    overlay: Image.Image  # the map over the image, with its colour bar
    compute_ms: float
    verdict: str  # the decision in words (``model_info.Decision.markdown``)
    explained: str  # the class the map explains, in words
    ood: dict  # the "none of my classes" check (``ood_check``)
    covered: str  # NEW, MAP_ONLY or CACHED

    def api(self) -> tuple[dict[str, float], Image.Image, float, str, str, dict]:
        """The API's six outputs, in its order."""
        return self.labels, self.overlay, self.compute_ms, self.verdict, self.explained, self.ood


def classified(
    ctx: Context, request: Prepared, step: Step = untimed, *, analysed: tuple[Analysis, float] | None = None
) -> Classified:
    """``classify``'s answer to ``request`` (its image, model and settings), and what the compute time
    covered: ``NEW`` (the image decoded and run through the model, then the map), ``MAP_ONLY`` (the image's
    forward pass was cached, the map was drawn) or ``CACHED`` (the forward pass and the map were both computed
    by an earlier request). Its steps (``analysis.analyse``'s, the map, the overlay) run through ``step``.
    ``analysed``: the analysis already made for this request (``show``'s two answers) and when the request
    started."""
    t0 = time.perf_counter() if analysed is None else analysed[1]
    a = ctx.analysis(request, step) if analysed is None else analysed[0]
    s, k = request.checked(a.model, ctx.default_method), request.settings.top(a.model)
    map_cached = s.method.from_attentions is None and map_key(a, s) in a.maps
    heat = step("map", lambda: relevance(a, s, ctx.device, request.report))
    compute_ms = (time.perf_counter() - t0) * 1000
    covered = NEW if a.created >= t0 else CACHED if map_cached else MAP_ONLY
    top = a.probs.topk(k)
    labels = {a.names[i]: float(p) for p, i in zip(top.values, top.indices, strict=True)}
    overlay = step("overlay", lambda: picture(a, heat, s))
    decision = model_info.analysis_decision(a)
    ood = ood_check(a, decision)
    return Classified(labels, overlay, round(compute_ms, 2), decision.markdown(), explains(a, s), ood, covered)


def picture(a: Analysis, heat: torch.Tensor, s: Settings) -> Image.Image:
    """The map over the image, with its colour bar, made a file of its own in Gradio's cache (``render.unique``)."""
    return render.unique(render.map_on_image(a.shown, a.box, heat, s.opacity, s.method.title.lower()), s.method.title)


def compute_note(ms: float, covered: str) -> str:
    """The compute time in words, saying what it covered (``classified``)."""
    took = model_info.format_ms(ms)
    if covered == NEW:
        return f"Computed in {took} (decode, model and map)."
    if covered == MAP_ONLY:
        return f"Computed in {took} (the map; this image's forward pass was cached)."
    return f"Answered in {took} from the cache (this image and this map were computed before)."


def ood_check(a: Analysis, decision: model_info.Decision) -> dict:
    """The "none of my classes" check of an analysis, as the batch CSV gives it: the decision, the score and the
    stored threshold it was compared with (all None for a model without a detector: its calibration is
    unknown, and only the "Not sure" rule applies); and the app's ``decision`` on it
    (``model_info.analysis_decision``: "answer", "none of my classes", "torn" or "not sure") with its reason in
    words."""
    detector = a.model.calibration.ood if a.model.calibration is not None else None
    return {
        "decision": decision.kind,
        "reason": decision.reason,
        "none_of_my_classes": a.is_ood,
        "ood_score": a.ood_score,
        "threshold": None if detector is None else detector.threshold,
        "score": None if detector is None else detector.score,
    }


TOP_K, IF_IT_WERE = "Top-k classes", "If it were one of my classes"  # the class bars' titles


def chart(labels: dict[str, float], decision: str) -> dict:
    """The class bars: when the model says the image is none of its classes (``model_info.NONE_OF_MINE``), greyed
    under the title "If it were one of my classes", so that a high bar never reads as the answer."""
    outside = decision == model_info.NONE_OF_MINE
    return gr.update(value=labels, label=IF_IT_WERE if outside else TOP_K, elem_classes=["greyed"] if outside else [])


BLANK = (None, None, "", "", "")  # labels, overlay, compute time, verdict (shown large), class explained


def show(ctx: Context, request: Prepared) -> Iterator[tuple]:
    """The tab's results for what is on screen, in two parts for an image not analysed yet: the first answer
    (``first_look``: one forward pass of the image alone, its classes and the attention rollout of that pass),
    then the full answer (``classified``: the calibrated views, the "none of my classes" check and the map asked for),
    which says so where its class is not the first answer's. A cached image gets the full answer at once.
    Nothing before an image is there."""
    if request["image"] is None:
        yield BLANK
        return
    t0, first = time.perf_counter(), None
    for part in ctx.analysis_steps(request):
        if isinstance(part, FirstLook):
            first = part
            yield first_look(ctx, request, part)
        else:
            a = part
    done = classified(ctx, request, analysed=(a, t0))
    verdict = done.verdict
    if first is not None and int(first.probs.argmax()) != int(a.probs.argmax()):
        said = a.names[int(first.probs.argmax())]
        now = a.names[int(a.probs.argmax())]
        verdict += f"\n\nWith all {first.views} views: {now}; the image alone said {said}."
    note = compute_note(done.compute_ms, done.covered)
    yield chart(done.labels, done.ood["decision"]), done.overlay, note, headline(verdict), done.explained


def first_look(ctx: Context, request: Prepared, first: FirstLook) -> tuple:
    """The first answer as the tab shows it: the image alone's classes (its views not averaged yet, no "none of
    my classes" check yet, said in quiet type), its attention rollout over the image, and what follows."""
    names = first.names
    k = check_top_k(request.settings.top_k, len(names))
    top = first.probs.topk(k)
    labels = {names[i]: float(p) for p, i in zip(top.values, top.indices, strict=True)}
    caption = "attention rollout (first answer)"
    overlay = render.unique(render.map_on_image(first.shown, first.box, first.rollout, 0.5, caption), caption)
    best = int(first.probs.argmax())
    note = f"First answer in {model_info.format_ms(1000 * first.seconds)}; the full answer follows…"
    verdict = f"{names[best]} ({float(first.probs[best]):.0%}): a first answer, from the image alone"
    verdict += f" (1 of {first.views} views)"
    explained = "Map: attention rollout of that one pass; the map you chose replaces it with the full answer"
    chart_update = gr.update(value=labels, label=TOP_K, elem_classes=[])
    return chart_update, overlay, note, headline(verdict, large=False), explained


def failed(message: str) -> tuple:
    """An error in place of the verdict."""
    return *BLANK[:3], headline(problem(message), large=False), ""


def headline(text: str, large: bool = True) -> dict:
    """The verdict's place: the prediction in large type; a problem, or "Classifying…", in normal type."""
    return gr.update(value=text, elem_classes=["verdict"] if large else ["verdict", "quiet"])


def blank(image: Upload | None) -> tuple:
    """The results while a new image or model is being classified."""
    return (*BLANK[:3], headline("*Classifying…*", large=False), "") if image is not None else BLANK


def _example_label(path: str) -> str:
    """Examples are named ``<class>_<anything>.jpg``, or ``ood_<what>.jpg`` for an image of none of the
    classes."""
    kind, _, what = Path(path).stem.partition("_")
    return f"out-of-distribution: {what.replace('_', ' ')}" if kind == "ood" else kind.replace("-", " ")


def examples_fit(model: VisionTransformer) -> bool:
    """Whether the example photos are offered for ``model``: when one of their classes is a word of its class
    names (a CIFAR-10 model's "cat", an ImageNet model's "tabby, tabby cat"), not for a model of other things (ants
    and bees, digits), which would only answer them wrongly."""
    kinds = {Path(p).stem.partition("_")[0].replace("-", " ") for p in EXAMPLES} - {"ood"}
    words = {w for name in model.class_names for w in re.findall(r"[a-z]+", name.lower())}
    return bool(kinds & words)


@dataclass
class _Fitted:
    """The page's controls, and the examples offered only for a model of their classes (``examples_fit``)."""

    controls: Controls
    examples: gr.Dataset

    @property
    def fitted(self) -> list[gr.components.Component]:
        return [*self.controls.fitted, self.examples]

    def fit(self, model: VisionTransformer, device: torch.device) -> list:
        return [*self.controls.fit(model, device), gr.Dataset(visible=examples_fit(model))]


def overlay_output() -> JpegFigure:
    """The map's picture, on the page and in the API's answer: each overlay is sent as a JPEG (``JpegFigure``),
    encoded into Gradio's cache (``bench.app_budget`` times that with this component)."""
    return figure("Where the model looked", "overlay", JpegFigure, height=360)


def build(ctx: Context, page: Page) -> Tab:
    """The tab's two columns: the page's image and settings (``Controls``), which it lays out; the results."""
    picker, c = page.picker, page.controls
    with gr.Row():
        with gr.Column():
            c.image.render()
            button = gr.Button("Classify", variant="primary", elem_id="classify")
            c.render_settings()
            examples = gr.Examples(
                EXAMPLES,
                inputs=c.image,
                example_labels=[_example_label(p) for p in EXAMPLES],
                label="Examples (licences in examples/LICENSES.md)",
            )
        with gr.Column(elem_id="results"):
            verdict = gr.Markdown(label="Prediction in words", elem_classes="verdict", elem_id="verdict")
            explained = gr.Markdown(label="Class the map explains", elem_id="explains")
            overlay = overlay_output()
            gr.Markdown(
                "The coloured region is what the model saw, resized to its input size (a centre crop, "
                "or the whole image when the model squashes); the rest was not used. The colour bar gives "
                "the map's range."
            )
            labels = gr.Label(label=TOP_K, show_heading=False, elem_id="labels")
            compute_time = gr.Markdown(elem_id="compute-time")
    # the API's own outputs where the page shows them differently
    compute_ms = gr.Number(label="Compute time (ms): decode, model, map", precision=2, visible=False)
    ood = gr.JSON(label="None of my classes: decision, score, threshold", visible=False)

    results = [labels, overlay, compute_time, verdict, explained]
    gr.on([c.image.change, button.click], None, [c.image], None, js=SCROLL_TO_RESULTS_JS)
    inputs = {"image": c.image, "model_choice": picker.active, **c.named()}
    shown = Shown(
        show,
        estimate,
        inputs,
        results,
        failed,
        GROUP,
        progress=True,
        stream=True,
        options={"show_progress_on": [overlay]},
    )
    changes = [c.image.change, picker.active.change]
    settings = [c.method.input, c.target.input, c.layer.release, c.head.input, c.head_fusion.input]
    settings += [c.discard_ratio.release, c.opacity.release, c.top_k.release]
    api_inputs = [c.image, picker.choice, *c.named(api=True).values()]
    return Tab(
        apis=[Api("classify", classify, api_inputs, [labels, overlay, compute_ms, verdict, explained, ood], estimate)],
        clears=[Clear("new input", changes, [GROUP], (c.image, picker.active), blank, results)],
        events=[
            Event("classify_new", shown, after="new input"),
            Event("classify_page", shown, triggers=[button.click, *settings]),
        ],
        fitted=_Fitted(c, examples.dataset),
    )
