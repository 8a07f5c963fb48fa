"""The page's image and map settings, which several tabs read: the image, the method, the class, layer and head,
head fusion, discard ratio, opacity and top-k. They belong to the page, not to a tab: ``Controls.create`` makes
them (unrendered) before the tabs are built, every tab reads them from ``Page.controls``, and one tab lays them
out (``render``: the Classify tab, beside its results). Their page values are named as the API's parameters,
so that a request reads them into one ``MapSettings`` (``named``)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import torch

from vit_core import VisionTransformer, methods

from ..inference.settings import PREDICTED, MapSettings, legend, lrp_based, lrp_notice
from .inputs import CheckedDropdown, CheckedRadio, ImageUpload

MAX_TOP_K = 10
LAYER = "Layer (raw attention)"


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


@dataclass
class Controls:
    """The shared controls (the module's docstring); ``api_layer`` is the API's layer: any block, negative from
    the end as in ``vit_core`` (the page's slider: 0 to the last)."""

    image: ImageUpload
    method: gr.Radio
    target: gr.Dropdown
    layer: gr.Slider
    head: gr.Dropdown
    head_fusion: gr.Radio
    discard_ratio: gr.Slider
    opacity: gr.Slider
    top_k: gr.Slider
    api_layer: gr.Number
    default_method: str  # the map a new model starts on

    @classmethod
    def create(cls, model: VisionTransformer, default_method: str) -> Controls:
        """The controls for the startup ``model``, unrendered (``render`` places them)."""
        per_class = ", ".join(_in_sentence(m.name) for m in methods.METHODS if m.per_class)
        hidden = dict(render=False)
        return cls(
            image=ImageUpload(
                sources=["upload", "clipboard", "webcam"],
                type="filepath",
                label="Image",
                height=300,
                elem_id="image",
                **hidden,
            ),
            method=CheckedRadio(
                [m.title for m in methods.METHODS], value=default_method, label="Explanation", **hidden
            ),
            # choices follow the loaded model; other values are checked server-side
            target=CheckedDropdown(
                [PREDICTED, *model.class_names],
                value=PREDICTED,
                allow_custom_value=True,
                **hidden,
                label=f"Class to explain ({per_class})",
            ),
            layer=gr.Slider(step=1, info=methods.OPTIONS["layer"], **layer_range(model, LAYER), **hidden),
            head=CheckedDropdown(
                head_choices(model),
                value="mean",
                allow_custom_value=True,
                label="Head (raw attention)",
                info=methods.OPTIONS["head"],
                **hidden,
            ),
            head_fusion=CheckedRadio(
                ["mean", "max", "min"],
                value="mean",
                label="Head fusion (rollout)",
                info=methods.OPTIONS["head_fusion"],
                **hidden,
            ),
            discard_ratio=gr.Slider(
                0.0,
                0.99,
                value=0.0,
                step=0.01,
                label="Discard ratio (rollout)",
                info=methods.OPTIONS["discard_ratio"],
                **hidden,
            ),
            opacity=gr.Slider(
                0.0, 1.0, value=0.5, step=0.05, label="Overlay opacity", elem_id="opacity", min_width=220, **hidden
            ),
            top_k=gr.Slider(1, MAX_TOP_K, value=5, step=1, label="Top-k", min_width=220, **hidden),
            api_layer=gr.Number(
                -1, precision=0, visible=False, label="Layer (raw attention): 0 = first, -1 = last", **hidden
            ),
            default_method=default_method,
        )

    def render_settings(self) -> None:
        """The method with its legend and the LRP notice, the explanation settings, opacity and top-k, in the
        column being built (the image is placed on its own: ``image.render()``)."""
        self.method.render()
        gr.Markdown(legend(methods.METHODS), elem_classes="legend", elem_id="method-legend")
        if lrp_based():
            gr.Markdown(lrp_notice(), elem_classes="notice", elem_id="lrp-notice")
        with gr.Accordion("Explanation settings", open=False):
            for control in (self.target, self.layer, self.head, self.head_fusion, self.discard_ratio):
                control.render()
        with gr.Row():
            self.opacity.render()
            self.top_k.render()
        self.api_layer.render()

    def named(self, *names: str, api: bool = False) -> dict[str, gr.components.Component]:
        """The controls of the settings ``names`` (all of ``MapSettings``' by default), by name; ``api``: the
        API's layer in place of the page's slider."""
        chosen = names or MapSettings.names()
        return {n: self.api_layer if api and n == "layer" else getattr(self, n) for n in chosen}

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


def tiles(label: str, elem_id: str) -> gr.Gallery:
    """A gallery of pictures shown whole, four a row (two on phones), each caption under its picture (the
    page's ``.tiles`` CSS)."""
    return gr.Gallery(
        label=label,
        columns=4,
        height="auto",
        object_fit="contain",
        elem_id=elem_id,
        elem_classes=["tiles", "phone-2-columns"],
    )


def figure(label: str, elem_id: str, kind: type[gr.Image] = gr.Image, **options: object) -> gr.Image:
    """A picture the server draws (a ``kind`` of ``gr.Image``), its buttons above it (the page's ``.figure``
    CSS); no label drawn over it: its title or the line above says what it shows (``label`` names the API
    output)."""
    return kind(type="pil", label=label, show_label=False, elem_id=elem_id, elem_classes="figure", **options)
