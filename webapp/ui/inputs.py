"""Components changed where Gradio's own do not fit: inputs, and Classify's overlay (``JpegFigure``).

- Uploads reach our checks undecoded, as an ``analysis.Upload`` that reads the file once for the memory gate's
  estimate and the handler (``ImageUpload``), and the API page shows the project's example photos as
  sample inputs instead of an image on the internet (``ImageUpload``, ``Uploads``).
- Gradio checks a Dropdown's or Radio's value against its choices before a handler runs and, when it is not
  one, answers with the whole value in the message and prints a traceback: a 50 MB value sent to ``/classify``
  came back in the response and went into the log. ``CheckedDropdown`` and ``CheckedRadio`` pass the value on
  unchecked, bounded in length, so that ``webapp.registry.access`` (models) and ``webapp.inference.settings``
  (everything else) answer with their own one-line messages, which quote at most ``errors.MAX_QUOTED`` characters of it.
- Gradio sends a drawn picture as WebP (15-20 ms for Classify's overlay) or, asked for JPEG, at Pillow's defaults;
  ``JpegFigure`` sends it as a JPEG of its own quality.
"""

from __future__ import annotations

import io
from pathlib import Path

import gradio as gr
import numpy as np
from gradio import image_utils, processing_utils
from gradio.data_classes import FileData, ImageData
from gradio.utils import NamedString
from gradio_client import utils as client_utils
from PIL import Image

from ..errors import log, quote
from ..inference.analysis import Upload
from ..registry.catalog import EXAMPLES, ROOT

MAX_VALUE_CHARS = 1000  # longer than any model id, path or class name the app offers
JPEG_QUALITY = 95  # ``JpegFigure``'s


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
    """``gr.Image`` that hands the uploaded file on undecoded, as an ``Upload`` (read once, when first asked
    for), so corrupt files, bombs and odd modes get our checks and messages instead of failing inside Gradio."""

    is_template = True

    def preprocess(self, payload: FileData | None) -> Upload | None:
        if payload is None:
            return None
        if payload.url and payload.url.startswith("data:"):  # pasted / webcam images arrive inline
            return Upload(image_utils.decode_base64_to_file(payload.url, self.GRADIO_CACHE, "png"))
        return Upload(payload.path)

    def example_payload(self) -> dict:
        return _file(EXAMPLES[0])

    def example_value(self) -> str:
        return api_example(EXAMPLES[0])


class JpegFigure(gr.Image):
    """``gr.Image`` that sends a drawn picture as a JPEG of quality ``JPEG_QUALITY`` with its colours at full
    resolution (4:4:4), its EXIF kept (``render.unique``). Gradio's WebP, its default, takes 15-20 ms for a 451x300
    map with its colour bar; its JPEG (Pillow's defaults: quality 75, colours at half resolution) takes 0.5 ms but,
    like the WebP, puts pixels at the map's sharp colour edges and the bar's labels up to 95 levels off (2.8 on
    average). This takes about 1.4 ms, within 13 levels (0.8 on average). A template of ``gr.Image``: the page
    draws it as one."""

    is_template = True

    def postprocess(self, value: Image.Image | np.ndarray | str | Path | None) -> ImageData | None:
        if not isinstance(value, Image.Image) or value.mode not in ("RGB", "L"):
            return super().postprocess(value)
        data = io.BytesIO()
        value.save(data, "jpeg", quality=JPEG_QUALITY, subsampling=0, exif=value.info.get("exif", b""))
        path = processing_utils.save_bytes_to_cache(data.getvalue(), "image.jpeg", self.GRADIO_CACHE)
        return ImageData(path=path, orig_name="image.jpeg")


_KINDS = {"image": "an image", ".zip": "a zip archive"}  # a file type as a refusal names it


def _path_of(component: gr.File, f: FileData) -> NamedString:
    """An uploaded file passed on as its path, its type checked: Gradio's own ``gr.File`` also leaves an empty
    ``tmp*`` file in its cache for each file of each request, never removed (200 files listed in one request
    left 200; the Train tab's zip one per job)."""
    if component.file_types and not client_utils.is_valid_file(f.path, component.file_types):
        kinds = " or ".join(_KINDS.get(kind, f"a {kind} file") for kind in component.file_types)
        raise gr.Error(f"{Path(f.path).name}: not {kinds}.", print_exception=False)
    return NamedString(f.path)


class PathFile(gr.File):
    """``gr.File`` that passes the uploaded file on as its path (``_path_of``). A template of ``gr.File`` itself:
    Gradio draws a template with its direct base's frontend, so each of these derives from ``gr.File``."""

    is_template = True

    def _process_single_file(self, f: FileData) -> NamedString:
        return _path_of(self, f)


class Uploads(gr.File):
    """``gr.File`` for many files passed on as their paths (``_path_of``), with two of the example photos as the
    API page's sample input."""

    is_template = True

    def _process_single_file(self, f: FileData) -> NamedString:
        return _path_of(self, f)

    def example_payload(self) -> list[dict]:
        return [_file(p) for p in EXAMPLES[:2]]

    def example_value(self) -> list[str]:
        return [api_example(p) for p in EXAMPLES[:2]]


def _bounded(component: gr.components.Component, payload: object) -> object:
    if isinstance(payload, str) and len(payload) > MAX_VALUE_CHARS:
        what = component.label or type(component).__name__
        log.warning("refused a %s value of %s characters: %s", what, f"{len(payload):,}", quote(payload))
        raise gr.Error(f"{what}: the value is too long ({len(payload):,} characters).", print_exception=False)
    return payload


class CheckedDropdown(gr.Dropdown):
    """A single-choice ``gr.Dropdown`` whose value the handler checks (the module's docstring)."""

    is_template = True

    def preprocess(self, payload: str | None) -> str | None:
        return _bounded(self, payload)


class CheckedRadio(gr.Radio):
    """A ``gr.Radio`` whose value the handler checks (the module's docstring)."""

    is_template = True

    def preprocess(self, payload: str | None) -> str | None:
        return _bounded(self, payload)
