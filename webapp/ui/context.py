"""What every tab's handlers share: the app's models, and how a handler is attached to the page."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr
import torch

from ..analysis import Analysis, analyse
from ..catalog import ROOT
from ..models import Models

EXAMPLES = sorted(str(p) for p in (ROOT / "examples").glob("*.jpg"))  # shown on Classify, measured on Inspect


def _unchanged(fn: Callable) -> Callable:
    return fn


@dataclass
class Context:
    """The tabs' handlers take this first: the model registry (the picker's choices, the loaded models, the
    device) and ``gpu``, which runs a compute handler where a GPU is (``spaces.GPU`` on a ZeroGPU Space)."""

    models: Models
    gpu: Callable[[Callable], Callable] = _unchanged

    @property
    def device(self) -> torch.device:
        return self.models.device

    def analysis(self, image: str | None, model_choice: str) -> Analysis:
        """The (cached) forward pass of ``image`` through the chosen model."""
        if image is None:
            raise gr.Error("Upload, paste or capture an image first (Classify tab).")
        model, transform = self.models.get(model_choice)
        return analyse(model, transform, self.models.key_of(model_choice), image, self.device)

    def handler(self, fn: Callable, compute: bool = True) -> Callable:
        """``fn(ctx, ...)`` as an event handler: bound to this context, so that Gradio reads the rest of its
        signature (the API's parameter names and defaults, ``gr.Progress``, ``gr.SelectData``), and run under
        ``gpu`` when it computes."""
        bound = types.MethodType(fn, self)
        return self.gpu(bound) if compute else bound
