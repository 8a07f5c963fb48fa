"""Gradio app: classify an image and see where the Vision Transformer looked.

    python app.py [--model PATH_OR_REPO] [--device auto|cpu|cuda] [--host 127.0.0.1] [--port 7860] [--share]

Runs locally (GPU when there is one), and unchanged as a Hugging Face Space (ZeroGPU included). All model,
image and explanation logic lives in ``vit_core`` and ``webapp``; this file is the UI around it.

Endpoints (``gradio_client``): ``/classify``, ``/explore`` (one patch's attention), ``/compare`` (every method
with its deletion/insertion AUC), ``/batch`` (many images or a zip -> gallery + CSV) and ``/inspect``.
"""

from __future__ import annotations

# ZeroGPU Spaces need `spaces` imported before anything touches CUDA; elsewhere it is absent.
try:
    import spaces
except ImportError:
    spaces = None

import argparse
import functools
import time
from pathlib import Path

import gradio as gr
import torch
from fastapi.middleware import Middleware
from gradio import image_utils
from gradio.data_classes import FileData
from PIL import Image

from vit_core.data import ImageDataError, load_image
from webapp import admission, explorer, model_info, render
from webapp import batch as batch_mode
from webapp.analysis import (
    GRADIENT,
    METHODS,
    PREDICTED,
    RISE,
    Analysis,
    Settings,
    analyse,
    check_top_k,
    default_method,
    explained_class,
    parse_settings,
    relevance,
)
from webapp.analysis import compare as compare_methods
from webapp.errors import user_error
from webapp.memory import limit_arenas
from webapp.models import BUNDLED_LABEL, ROOT, Models, add_arguments, configure
from webapp.models import Settings as ModelSettings

EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.jpg"))
MAX_TOP_K = 10
QUEUE_SIZE = 64  # requests waiting at once, all clients together
DELETE_CACHE = (300, 900)  # every 5 minutes, delete uploads and outputs older than 15 minutes
CSS = """
.verdict p { font-size: 1.6rem; font-weight: 600; margin: 0; }
#summary table { word-break: normal; overflow-wrap: normal; hyphens: none; }
#summary td:first-child { white-space: nowrap; }
#summary .prose { overflow-x: auto; }
@media (max-width: 640px) {
  .phone-2-columns .grid-container { --grid-cols: 2 !important; }
  /* the scores table: Gradio fixes each column to its unwrapped width; on phones let whole words wrap instead */
  #compare-table table { width: 100% !important; }
  #compare-table :is(th, td) { width: auto !important; min-width: 0 !important; max-width: none !important;
                               white-space: normal !important; word-break: normal; overflow-wrap: normal; }
}
"""


def gpu(fn):
    """Run ``fn`` on a ZeroGPU worker when on such a Space; unchanged elsewhere."""
    return spaces.GPU(fn) if spaces is not None else fn


def compute(fn, cost):
    """A compute listener: admitted by the server's memory budget (``GATE``, ``cost`` its estimate from its
    arguments), then run on a ZeroGPU worker where there is one. Registered with
    ``concurrency_id=admission.COMPUTE``: ``--concurrency`` bounds every listener together."""
    return GATE.admit(gpu(fn), cost)


def user_errors(fn):
    """Bad requests (an unreadable image, a layer the model lacks...) become messages for the user."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, ImageDataError) as e:  # gr.Error too: it is a ValueError
            raise user_error(e) from None

    return wrapper


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


def _analysis(image: str | None, model_choice: str) -> Analysis:
    """The (cached) forward pass of ``image`` through the chosen model."""
    if image is None:
        raise gr.Error("Upload, paste or capture an image first (Classify tab).")
    model, transform = MODELS.get(model_choice)
    return analyse(model, transform, MODELS.key_of(model_choice), image, MODELS.device)


def _explains(a: Analysis, s: Settings) -> str:
    names, predicted = a.names, int(a.probs.argmax())
    if s.method not in (RISE, GRADIENT):
        return f"Map explains: {names[predicted]}, the prediction (attention maps are the same for every class)"
    target = explained_class(a, s)
    why = "the predicted class" if target == predicted else f"chosen; the model predicts {names[predicted]}"
    return f"Map explains: {names[target]} ({why})"


@user_errors
def classify(
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
    a = _analysis(image, model_choice)
    method = method or default_method(a.model, MODELS.device)
    s = parse_settings(a.model, method, target, layer, head, head_fusion, discard_ratio, opacity)
    k = check_top_k(top_k, len(a.names))
    heat = relevance(a, s, MODELS.device, lambda f, desc: progress(f, desc=desc))
    compute_ms = (time.perf_counter() - t0) * 1000
    top = a.probs.topk(k)
    labels = {a.names[i]: float(p) for p, i in zip(top.values, top.indices, strict=True)}
    overlay = render.map_on_image(a.shown, a.box, heat, s.opacity, method.lower())
    verdict = model_info.verdict(a.probs, a.names)
    return labels, render.unique(overlay, method), round(compute_ms, 2), verdict, _explains(a, s)


def rerender(image: str | None, *settings):
    """Live controls: re-render with the new settings (reusing the cached forward pass); nothing to do
    before an image is there."""
    return classify(image, *settings) if image is not None else (gr.skip(),) * 5


@user_errors
def explorer_view(image: str | None, model_choice: str) -> Image.Image | None:
    """The upload to click on: the region the model saw bright, its token grid drawn."""
    return None if image is None else explorer.view(_analysis(image, model_choice))


@user_errors
def explore(
    image: str | None,
    model_choice: str = BUNDLED_LABEL,
    x: float = 0.0,
    y: float = 0.0,
    layer: int = -1,
    head: str = "mean",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    opacity: float = 0.5,
) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The patch under the point (x, y) of the image, in the image's own pixels: its attention over the
    patches at ``layer`` for ``head`` (or the mean), its attention-rollout row, every head of that layer,
    and a sentence. The patch is outlined on each map."""
    a = _analysis(image, model_choice)
    s = parse_settings(
        a.model, layer=layer, head=head, head_fusion=head_fusion, discard_ratio=discard_ratio, opacity=opacity
    )
    patch = explorer.patch_at(a, float(x), float(y))
    if patch is None:
        raise ValueError(f"({x:g}, {y:g}) is outside the region the model saw; pick a point inside it")
    return explorer.explore(a, patch, s)


@user_errors
def on_select(image, model_choice, layer, head, head_fusion, discard_ratio, opacity, evt: gr.SelectData):
    """A click on the explorer's picture: its pixels to the upload's, then ``explore``; the view is redrawn
    with the patch outlined."""
    if image is None or evt.index is None:
        return (gr.skip(),) * 7
    a = _analysis(image, model_choice)
    x, y = explorer.from_view(a, *evt.index)
    patch = explorer.patch_at(a, x, y)
    if patch is None:
        gr.Warning("That point is outside the region the model saw: click inside the bright region.")
        return (gr.skip(),) * 7
    shown = explore(image, model_choice, x, y, layer, head, head_fusion, discard_ratio, opacity)
    return explorer.view(a, patch), round(x, 1), round(y, 1), *shown


def re_explore(image, model_choice, x, y, *settings):
    """Live explorer controls: redraw the last clicked patch with the new layer or head."""
    if image is None or x is None or y is None:
        return (gr.skip(),) * 4
    return explore(image, model_choice, x, y, *settings)


@user_errors
def compare(
    image: str | None,
    model_choice: str = BUNDLED_LABEL,
    target: str = PREDICTED,
    layer: int = -1,
    head: str = "mean",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    opacity: float = 0.5,
    progress: gr.Progress = gr.Progress(),  # noqa: B008 (Gradio's idiom)
) -> tuple[list[tuple[Image.Image, str]], list[list], str]:
    """RISE (where it fits the server's budget), attention rollout, gradient rollout, raw attention and a
    centre-Gaussian baseline for the same image and class, each with its deletion AUC (lower is better) and
    insertion AUC (higher is better)."""
    a = _analysis(image, model_choice)
    s = parse_settings(a.model, METHODS[0], target, layer, head, head_fusion, discard_ratio, opacity)
    scored = compare_methods(a, s, MODELS.device, lambda f, desc: progress(f, desc=desc))
    gallery, table = [], []
    for name, heat, deletion, insertion in scored:
        scores = f"deletion {deletion:.3f}, insertion {insertion:.3f}"
        img = render.titled(
            render.map_on_crop(a.shown, a.box, heat, s.opacity, explorer.SIDE, "relevance"),
            [name.split(" (")[0], scores],
        )
        gallery.append((render.unique(img, name), f"{name}: {scores}"))
        table.append([name, round(deletion, 4), round(insertion, 4)])
    target_name = a.names[explained_class(a, s)]
    head = "mean of heads" if s.head is None else f"head {s.head}"
    return gallery, table, f"Maps and scores for class {target_name}; raw attention: layer {s.layer}, {head}."


@user_errors
def batch(
    files: list[str] | None,
    model_choice: str = BUNDLED_LABEL,
    method: str = batch_mode.METHODS[0],
    top_k: int = 5,
    opacity: float = 0.5,
) -> tuple[list[tuple[Image.Image, str]], str, str]:
    """Many images (files, or zip archives of images) at once: a gallery of overlays, a CSV of each image's
    top-k predictions (downloadable), and a one-line summary. At most 64 images per batch."""
    model, transform = MODELS.get(model_choice)
    s = parse_settings(model, method, opacity=opacity)
    k = check_top_k(top_k, model.config.num_classes)
    items, gallery = batch_mode.classify_batch(model, transform, files or [], s, MODELS.device)
    path = batch_mode.write_csv(items, model.class_names, k)
    skipped = [i for i in items if i.probs is None]
    note = f"{len(gallery)} image(s) classified" + (f", {len(skipped)} skipped (see the CSV)" if skipped else "")
    if skipped and not gallery:
        note += f"; {skipped[0].name}: {skipped[0].error}"
    return gallery, str(path), note


@user_errors
def inspect(model_choice: str = BUNDLED_LABEL) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    """The paper's figure 7 for the loaded model (filters, position-embedding similarity, mean attention
    distance over the example images) and a summary of what it is."""
    model, transform = MODELS.get(model_choice)
    batch_ = torch.stack([transform(load_image(p)) for p in EXAMPLES])
    figs = model_info.inspect_figures(model, batch_, MODELS.device)
    return *figs, model_info.summary(model, MODELS.folder_of(model_choice))


def _model_updates(model_choice: str) -> tuple:
    """Status line, facts line and controls fitted to a loaded model, its default explanation selected."""
    model, _ = MODELS.load(model_choice)
    cfg = model.config
    size = f"{model_info.format_count(model.num_params())} parameters, {cfg.num_classes} classes"
    status = f"Loaded **{model_choice}** ({cfg.name + ', ' if cfg.name else ''}{size}).{MODELS.note(model_choice)}"
    heads = ["mean", *map(str, range(cfg.num_heads))]
    return (
        status,
        model_info.facts(model),
        gr.Dropdown(choices=[PREDICTED, *model.class_names], value=PREDICTED),
        gr.Slider(minimum=-cfg.depth, maximum=cfg.depth - 1, value=-1, step=1),
        gr.Dropdown(choices=heads, value="mean"),
        gr.Slider(minimum=-cfg.depth, maximum=cfg.depth - 1, value=-1, step=1),
        gr.Dropdown(choices=heads, value="mean"),
        gr.Radio(value=default_method(model, MODELS.device)),
        model_choice,
        gr.skip(),
    )


def on_model_change(model_choice: str, active: str, progress: gr.Progress = gr.Progress()):  # noqa: B008
    """Load the chosen model (with a progress indicator) and fit the controls to it. A model that fails to
    load leaves the previous one active: the status line says why, and the picker goes back to it."""
    if model_choice == active:
        return (gr.skip(),) * 10  # the picker was set back after a failed load, or nothing changed
    progress(0.1, desc=f"Loading {model_choice}")
    try:
        return _model_updates(model_choice)
    except gr.Error as e:
        status = f"⚠️ {e.message} Still using **{active}**."
        return (status, *(gr.skip(),) * 8, gr.Dropdown(value=active))


def _startup_updates(model_choice: str) -> tuple:
    """The page's first status line and controls (on load)."""
    return _model_updates(model_choice)[:-1]


def _example_label(path: str) -> str:
    """Examples are named ``<class>_<anything>.jpg``, or ``ood_<what>.jpg`` for an image of none of the
    classes."""
    kind, _, what = Path(path).stem.partition("_")
    return f"out-of-distribution: {what.replace('_', ' ')}" if kind == "ood" else kind.replace("-", " ")


def build_ui(default_model: str) -> gr.Blocks:
    choices = MODELS.choices()
    model, _ = MODELS.get(default_model)
    classes = model.class_names
    depth, heads = model.config.depth, model.config.num_heads
    head_choices = ["mean", *map(str, range(heads))]
    with gr.Blocks(title="Vision Transformer: where did it look?", delete_cache=DELETE_CACHE) as demo:
        gr.Markdown(
            "## Where did the Vision Transformer look?\n"
            "Classify an image, see which patches the prediction drew on, click a patch to see where it "
            "attends, and score each explanation."
        )
        with gr.Row():
            model_choice = gr.Dropdown(
                choices,
                value=default_model,
                allow_custom_value=MODELS.allow_custom_value,
                scale=3,
                min_width=320,
                label="Model: the bundled one, a run folder, or a Hub repo id (ours, timm or transformers)",
            )
            status = gr.Markdown(elem_id="status", min_width=300)  # min widths: a row of its own on phones
        active = gr.State(default_model)
        facts = gr.Markdown(model_info.facts(model), elem_id="facts")
        with gr.Tab("Classify"), gr.Row():
            with gr.Column():
                image = ImageUpload(
                    sources=["upload", "clipboard", "webcam"],
                    type="filepath",
                    label="Image",
                    height=300,
                    elem_id="image",
                )
                button = gr.Button("Classify", variant="primary", elem_id="classify")
                method = gr.Radio(list(METHODS), value=default_method(model, MODELS.device), label="Explanation")
                with gr.Accordion("Explanation settings", open=False):
                    # choices follow the loaded model; other values are checked server-side
                    target = gr.Dropdown(
                        [PREDICTED, *classes],
                        value=PREDICTED,
                        allow_custom_value=True,
                        label="Class to explain (RISE, gradient rollout)",
                    )
                    layer = gr.Slider(-depth, depth - 1, value=-1, step=1, label="Layer (raw attention; -1 = last)")
                    head = gr.Dropdown(
                        head_choices, value="mean", allow_custom_value=True, label="Head (raw attention)"
                    )
                    head_fusion = gr.Radio(["mean", "max", "min"], value="mean", label="Head fusion (rollout)")
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
                explains = gr.Markdown(label="Class the map explains", elem_id="explains")
                overlay = gr.Image(type="pil", label="Where the model looked", elem_id="overlay", height=360)
                gr.Markdown(
                    "The coloured region is what the model saw, resized to its input size (a centre crop, "
                    "or the whole image when the model squashes); the rest was not used. The colour bar gives "
                    "the map's range."
                )
                labels = gr.Label(label="Top-k classes", show_heading=False, elem_id="labels")
                compute_ms = gr.Number(label="Compute time (ms): decode, model, map", precision=2)
        with gr.Tab("Explore patches"):
            gr.Markdown(
                "Click a patch inside the bright region (what the model saw) to see where that patch "
                "attends at one layer and head, its attention rollout, and every head of the layer."
            )
            with gr.Row():
                with gr.Column():
                    view = gr.Image(type="pil", label="Click a patch", interactive=False, elem_id="view")
                    with gr.Row():
                        ex_layer = gr.Slider(-depth, depth - 1, value=-1, step=1, label="Layer (-1 = last)")
                        ex_head = gr.Dropdown(head_choices, value="mean", allow_custom_value=True, label="Head")
                    with gr.Row():
                        point_x = gr.Number(label="x (image pixels)", precision=1)
                        point_y = gr.Number(label="y (image pixels)", precision=1)
                with gr.Column():
                    patch_text = gr.Textbox(label="Selected patch", lines=2, interactive=False, elem_id="patch-text")
                    with gr.Row():
                        patch_attention = gr.Image(
                            type="pil", label="Its attention (layer, head)", elem_id="patch-attention"
                        )
                        patch_rollout = gr.Image(type="pil", label="Its attention rollout", elem_id="patch-rollout")
                    heads_grid = gr.Image(type="pil", label="Every head of the layer", elem_id="heads-grid")
        with gr.Tab("Compare methods"):
            gr.Markdown(
                "Every map for the same image and class, each scored on this image: **deletion AUC** (pixels "
                "removed most relevant first; lower is better) and **insertion AUC** (revealed most relevant "
                "first; higher is better). The centre Gaussian ignores the image: a map that does no better "
                "says little about this image. Uses the class, layer and head of the Classify tab's settings."
            )
            compare_button = gr.Button("Compare methods", variant="primary")
            compare_text = gr.Textbox(label="What is compared", interactive=False, elem_id="compare-text")
            compare_table = gr.Dataframe(
                headers=["method", "deletion AUC (lower is better)", "insertion AUC (higher is better)"],
                label="Faithfulness on this image",
                interactive=False,
                wrap=True,
                elem_id="compare-table",
            )
            compare_gallery = gr.Gallery(
                label="Maps (coloured: the region the model saw)",
                columns=4,
                height="auto",
                object_fit="contain",
                elem_id="compare-gallery",
                elem_classes="phone-2-columns",
            )
        with gr.Tab("Batch"):
            gr.Markdown(f"Several images, or a zip archive of images (at most {batch_mode.MAX_IMAGES}).")
            files = gr.File(
                file_count="multiple", file_types=["image", ".zip"], type="filepath", label="Images", elem_id="files"
            )
            batch_method = gr.Radio(list(batch_mode.METHODS), value=batch_mode.METHODS[0], label="Explanation")
            batch_button = gr.Button("Classify all", variant="primary")
            batch_note = gr.Textbox(label="Summary", interactive=False, elem_id="batch-note")
            batch_gallery = gr.Gallery(
                label="Overlays",
                columns=4,
                height="auto",
                object_fit="contain",
                elem_id="batch-gallery",
                elem_classes="phone-2-columns",
            )
            batch_csv = gr.File(label="Top-k predictions (CSV)", elem_id="batch-csv")
        with gr.Tab("Inspect"):
            gr.Markdown("The paper's figure 7 for this model, and what it is.")
            analyse_button = gr.Button("Analyse model")
            with gr.Row():
                # labels name the API outputs; each figure has its own title
                fig_filters = gr.Image(label="Embedding filters", show_label=False, elem_id="fig-filters")
                fig_similarity = gr.Image(
                    label="Position embedding similarity", show_label=False, elem_id="fig-similarity"
                )
                fig_distance = gr.Image(label="Mean attention distance", show_label=False, elem_id="fig-distance")
            summary = gr.Markdown(label="Model summary", elem_id="summary")

        settings = [method, target, layer, head, head_fusion, discard, opacity, top_k]
        results = [labels, overlay, compute_ms, verdict, explains]
        cost = COSTS.image
        button.click(
            compute(classify, cost("classify")),
            [image, model_choice, *settings],
            results,
            api_name="classify",
            concurrency_id=admission.COMPUTE,
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
            compute(rerender, cost("classify")),
            [image, model_choice, *settings],
            results,
            api_visibility="private",
            trigger_mode="always_last",
            show_progress="hidden",
            concurrency_id=admission.COMPUTE,
        )

        ex_settings = [ex_layer, ex_head, head_fusion, discard, opacity]
        patch_outputs = [patch_attention, patch_rollout, heads_grid, patch_text]
        gr.on(
            [image.change, active.change],
            compute(explorer_view, cost("view")),
            [image, model_choice],
            view,
            api_visibility="private",
            concurrency_id=admission.COMPUTE,
        )
        view.select(
            compute(on_select, cost("explore")),
            [image, model_choice, *ex_settings],
            [view, point_x, point_y, *patch_outputs],
            api_visibility="private",
            trigger_mode="always_last",
            concurrency_id=admission.COMPUTE,
        )
        explore_inputs = [image, model_choice, point_x, point_y, *ex_settings]
        gr.on(
            [point_x.submit, point_y.submit],
            compute(explore, cost("explore")),
            explore_inputs,
            patch_outputs,
            api_name="explore",
            concurrency_id=admission.COMPUTE,
        )
        gr.on(
            [ex_layer.release, ex_head.input],
            compute(re_explore, cost("explore")),
            explore_inputs,
            patch_outputs,
            api_visibility="private",
            trigger_mode="always_last",
            show_progress="hidden",
            concurrency_id=admission.COMPUTE,
        )

        compare_button.click(
            compute(compare, cost("compare")),
            [image, model_choice, target, layer, head, head_fusion, discard, opacity],
            [compare_gallery, compare_table, compare_text],
            api_name="compare",
            concurrency_id=admission.COMPUTE,
        )
        batch_button.click(
            compute(batch, COSTS.batch),
            [files, model_choice, batch_method, top_k, opacity],
            [batch_gallery, batch_csv, batch_note],
            api_name="batch",
            concurrency_id=admission.COMPUTE,
        )
        analyse_button.click(
            compute(inspect, COSTS.inspect),
            model_choice,
            [fig_filters, fig_similarity, fig_distance, summary],
            api_name="inspect",
            concurrency_id=admission.COMPUTE,
        )

        # The model picker waits for a load on the loader's threads (bounded by --max-model-mb and
        # --max-loaded-mb): gated, but outside the compute group, so a slow download holds no compute slot.
        model_outputs = [status, facts, target, layer, head, ex_layer, ex_head, method, active, model_choice]
        model_choice.change(
            GATE.admit(on_model_change, COSTS.small), [model_choice, active], model_outputs, api_visibility="private"
        )
        demo.load(GATE.admit(_startup_updates, COSTS.small), model_choice, model_outputs[:-1], api_visibility="private")
    return demo


def setup(model: str, device: str = "auto", threads: int | None = None, settings: ModelSettings | None = None) -> None:
    """Pick the device, load the default model (failing fast, before serving) and size torch's CPU threads."""
    global MODELS
    if device == "cuda" and not torch.cuda.is_available() and spaces is None:
        raise SystemExit("--device cuda: no CUDA device is available")
    if spaces is not None or (device == "auto" and torch.cuda.is_available()):
        device = "cuda"  # on ZeroGPU, CUDA is attached per call by spaces.GPU
    MODELS = Models(torch.device("cpu" if device == "auto" else device), settings)
    loaded, _ = MODELS.get(MODELS.set_default(model))
    if MODELS.device.type == "cpu":
        # Small models run fastest on one thread: hand-offs between threads cost more than they save.
        torch.set_num_threads(threads or (1 if loaded.num_params() < 10_000_000 else torch.get_num_threads()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--host", default=None, help="address to serve on (default 127.0.0.1; 0.0.0.0 on a Space)")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--share", action="store_true", help="create a public gradio.live link")
    p.add_argument("--concurrency", type=int, default=1, help="requests computed at once (one GPU: 1)")
    g = p.add_argument_group("limits for a public server")
    g.add_argument(
        "--max-memory",
        type=int,
        default=None,
        metavar="MB",
        help=f"memory the server may use, requests included (default: {admission.DEFAULT_SHARE * 100:.0f}%% of the "
        "container's limit, else of the machine's memory)",
    )
    g.add_argument(
        "--max-wait", type=float, default=10.0, help="seconds a request waits for memory before 'busy' (default 10)"
    )
    g.add_argument("--max-file-mb", type=int, default=64, help="largest upload, per file (default 64)")
    g.add_argument(
        "--per-client",
        type=int,
        default=4,
        help="requests one session may have waiting or computing (one address: 4 times as many; default 4)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads (default: 1 for models under 10M parameters, else all cores)",
    )
    add_arguments(p)
    args = p.parse_args()
    if min(args.concurrency, args.max_file_mb, args.per_client, args.max_memory or 1) < 1 or args.max_wait < 0:
        raise SystemExit("--concurrency, --max-memory, --max-file-mb and --per-client must be >= 1, --max-wait >= 0")
    limit_arenas()
    setup(args.model, args.device, args.threads, configure(args))
    global GATE
    GATE = admission.Gate(None if args.max_memory is None else args.max_memory * admission.MB, args.max_wait)
    demo = build_ui(MODELS.default)
    demo.queue(default_concurrency_limit=args.concurrency, max_size=QUEUE_SIZE)
    admission.ClientLimits(args.per_client, 4 * args.per_client).install(demo)
    print(f"memory budget {GATE.max_memory / admission.MB:,.0f} MB, uploads at most {args.max_file_mb} MB", flush=True)
    upload_limit = max(args.max_file_mb * admission.MB, batch_mode.MAX_TOTAL_BYTES)  # one upload, all its files
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        css=CSS,
        max_file_size=args.max_file_mb * admission.MB,
        app_kwargs={"middleware": [Middleware(admission.UploadLimits, max_bytes=upload_limit)]},
    )


MODELS: Models = Models(torch.device("cpu"))
GATE = admission.Gate()  # main() sets it from the options
COSTS = admission.Costs(lambda choice: MODELS.loaded(choice), lambda: MODELS.device, len(EXAMPLES))

if __name__ == "__main__":
    main()
