"""Gradio components the tabs share, changed where Gradio's own do not fit: uploads reach our checks undecoded,
and the API page shows the project's example photos as sample inputs instead of an image on the internet."""

from __future__ import annotations

from pathlib import Path

import gradio as gr
from gradio import image_utils
from gradio.data_classes import FileData

from ..catalog import ROOT
from .context import EXAMPLES


def api_example(path: str) -> str:
    """An example photo as the API page shows it: its path in this repository (``examples/cat_chelsea.jpg``),
    which a client run from a checkout can send as it is."""
    return Path(path).relative_to(ROOT).as_posix()


def _file(path: str) -> dict:
    """``gradio_client.handle_file(path)`` as the API page shows it (``handle_file('examples/...')``: the page
    writes that for a file with a ``url``), without checking that the path exists from the server's working
    directory."""
    rel = api_example(path)
    return {"path": rel, "url": rel, "orig_name": Path(path).name, "meta": {"_type": "gradio.FileData"}}


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

    def example_payload(self) -> dict:
        return _file(EXAMPLES[0])

    def example_value(self) -> str:
        return api_example(EXAMPLES[0])


class Uploads(gr.File):
    """``gr.File`` for many files, with two of the example photos as the API page's sample input."""

    is_template = True

    def example_payload(self) -> list[dict]:
        return [_file(p) for p in EXAMPLES[:2]]

    def example_value(self) -> list[str]:
        return [api_example(p) for p in EXAMPLES[:2]]
