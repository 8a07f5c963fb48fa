"""One image through one model, computed once and reused by every view, and the maps drawn from it.

Changing the opacity, the method, the layer or head, clicking a patch or comparing methods all start from the
same forward pass: the decoded image, the model input, the probabilities and every block's attention. An
``Analysis`` holds them; ``ANALYSES`` keeps the recent ones (keyed by model and the upload's SHA-256, bounded
in bytes), so a settings change costs a map and a picture, not a decode and a forward pass. An analysis refers to
its model weakly: the model registry's limits (``--max-loaded``, ``--max-loaded-mb``) decide which models stay in
memory, and a model it evicts or forgets is freed, its analyses no longer answered (32 cached analyses held 32
models alive before, 11 GB of fine-tuned ViT-B/16s past a 3 GB limit). Cached tensors live on the CPU: on a
ZeroGPU Space the GPU is attached only for the duration of one call.

Maps come from the methods of ``vit_core.methods``, so the app shows exactly what the library computes: those
made from attentions are drawn from the cached ones (``Method.from_attentions``); the others run the model and
are kept in the ``Analysis``, one per class.
"""

from __future__ import annotations

import hashlib
import io
import math
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import torch
from PIL import Image

from vit_core import VisionTransformer, explain
from vit_core.calibration import predict
from vit_core.data import ImageDataError, ImageFile, ImageHeader, ImageTransform, TooManyPixelsError, open_image
from vit_core.data.images import ImageSource
from vit_core.explain import answer as answers

from . import render
from .render import Box
from .settings import Settings, affordable, refusal

MAX_SIDE = 2048  # larger uploads are decoded reduced to this long side, and overlays drawn at it
MAX_PIXELS = 50_000_000  # larger uploads are refused before decoding (decompression bombs)
T = TypeVar("T")
# A named step of a request, given its work: runs it and returns what it returns (``untimed``), timing it or not
Step = Callable[[str, Callable[[], Any]], Any]


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 (fp16 on older GPUs) on CUDA, full precision on the CPU."""
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast("cuda", dtype=dtype)
    return nullcontext()


@dataclass
class Analysis:
    """An upload and the model's forward pass on it."""

    model_ref: Callable[[], VisionTransformer | None]  # a weak reference: the registry owns the model
    shown: Image.Image  # the upload, upright RGB, sized to show (``render.display_copy``): what overlays are drawn on
    size: tuple[int, int]  # the upload's own (width, height): API coordinates are in these pixels
    crop: tuple[float, float, float, float]  # region the model saw, in the upload's pixels
    x: torch.Tensor  # (1, C, H, W) model input, CPU
    probs: torch.Tensor  # (num_classes,) float32, CPU: over the model's views (``calibration.predict``)
    attentions: list[torch.Tensor]  # per block (1, heads, T, T) float32, CPU
    ood_score: float | None = None  # the model's "none of my classes" score; None: it has no detector
    is_ood: bool | None = None  # the score above the model's stored threshold; None: no detector
    maps: dict[tuple, torch.Tensor] = field(default_factory=dict)  # maps that run the model, kept (``map_key``)
    seconds: dict[tuple, float] = field(default_factory=dict)  # the seconds each of those maps took, by its key
    created: float = field(default_factory=time.perf_counter)  # when the forward pass ended (a cache hit is older)

    @property
    def model(self) -> VisionTransformer:
        """The model (alive while a request that asked for this analysis holds it)."""
        model = self.model_ref()
        if model is None:
            raise RuntimeError("the model of this analysis was unloaded")
        return model

    @property
    def box(self) -> Box:
        """The region the model saw, in ``shown``'s pixels."""
        s = self.shown.width / self.size[0]
        return tuple(round(v * s) for v in self.crop)  # type: ignore[return-value]

    @property
    def names(self) -> list[str]:
        return self.model.class_names

    @property
    def grid(self) -> tuple[int, int]:
        return explain.token_grid(self.model, self.x)

    def nbytes(self) -> int:
        tensors = [self.x, self.probs, *self.attentions, *self.maps.values()]
        return sum(t.numel() * t.element_size() for t in tensors) + 4 * self.shown.width * self.shown.height  # RGBX


class AnalysisCache:
    """Recent analyses, least recently used dropped first, bounded in count and bytes; thread-safe. An entry
    whose model was freed is dropped; one whose key names a model loaded anew (another object) is recomputed."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 128 << 20) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._items: OrderedDict[tuple[str, str], Analysis] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str], model: VisionTransformer) -> Analysis | None:
        """The analysis under ``key`` made by ``model`` if it is cached (then the most recently used), else None."""
        with self._lock:
            hit = self._items.get(key)
            if hit is None or hit.model_ref() is not model:
                return None
            self._items.move_to_end(key)
            return hit

    def get_or_compute(
        self, key: tuple[str, str], model: VisionTransformer, compute: Callable[[], Analysis]
    ) -> Analysis:
        """The analysis under ``key`` made by ``model``, else ``compute()``'s, kept."""
        with self._lock:
            self._items = OrderedDict((k, v) for k, v in self._items.items() if v.model_ref() is not None)
            hit = self._items.get(key)
            if hit is not None and hit.model_ref() is model:
                self._items.move_to_end(key)
                return hit
        a = compute()  # outside the lock: other requests go on meanwhile (a duplicate is harmless)
        with self._lock:
            self._items[key] = a
            self._items.move_to_end(key)
            total = sum(v.nbytes() for v in self._items.values())  # once: each drop takes its own bytes off
            while len(self._items) > self.max_entries or (len(self._items) > 1 and total > self.max_bytes):
                total -= self._items.popitem(last=False)[1].nbytes()
        return a


ANALYSES = AnalysisCache()


def open_upload(src: ImageSource) -> ImageFile:
    """``open_image`` with this server's ``MAX_PIXELS``: an upload over it is refused in words for the person
    who sent it (the limit is the server's, not theirs to raise)."""
    try:
        return open_image(src, MAX_PIXELS)
    except TooManyPixelsError as e:
        w, h = e.size
        raise ImageDataError(
            f"{e.name}: {w}x{h} pixels is more than this server accepts ({MAX_PIXELS / 1e6:g} megapixels, a guard "
            "against decompression bombs); downscale the image and try again"
        ) from None


class Upload:
    """An uploaded image file, read once and opened once: its SHA-256 (``ANALYSES``' key), its header (the memory
    gate's estimate, the server's pixel limit) and its pixels all come from that one read and that one opening
    (``open_upload``), made when one of them is first asked for. Made by the upload component
    (``webapp.ui.inputs.ImageUpload``) for each request, so the gate's estimate and the handler share it; equal
    for the same file (the page compares what its results are about, ``webapp.ui.events.subject_of``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Upload) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"Upload({self.path!r})"

    @cached_property
    def data(self) -> bytes:
        """The file's bytes (Gradio bounds an upload's size: ``--max-file-mb``)."""
        try:
            return Path(self.path).read_bytes()
        except OSError as e:
            raise ImageDataError(f"{self.path}: cannot read the file ({e.strerror})") from None

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def opened(self) -> ImageFile:
        """The bytes read, opened (``open_upload``), named like the upload for ``load_image``'s messages."""
        buf = io.BytesIO(self.data)
        buf.name = self.path
        return open_upload(buf)

    @cached_property
    def header(self) -> ImageHeader:
        return self.opened.header

    def decode(self, transform: ImageTransform) -> tuple[Image.Image, tuple[int, int]]:
        """Its pixels (``decode``) from the opening its header came from, which decoding closes (a second decode,
        after the analysis was evicted, opens the bytes again), and its upright size in its own pixels."""
        size, opened = self.header.size, self.opened
        del self.__dict__["opened"]
        img = decode(opened, transform)
        if (img.width < img.height) != (size[0] < size[1]):  # a PNG whose EXIF rotation came after its pixels
            size = size[::-1]
        return img, size


def declared(image: Upload | str | None) -> tuple[ImageHeader | None, int]:
    """What an upload declares, for a memory estimate before anything is decoded: its header (None when there
    is none, or it is unreadable: the request then fails before decoding) and its size in bytes."""
    if not image:
        return None, 0
    upload = upload_of(image)
    try:
        return upload.header, len(upload.data)
    except ImageDataError:
        return None, 0


def upload_of(image: Upload | str) -> Upload:
    """The ``Upload`` of an image handed to a handler: the component's, or a path (code calling a handler)."""
    return image if isinstance(image, Upload) else Upload(image)


def needed_side(transform: ImageTransform) -> int:
    """The short side a source image needs so that ``transform``'s eval resize does not enlarge it (the
    resize's target, ``input size / crop_pct``): what a large upload is decoded down to, at the least."""
    return math.ceil(max(transform.size) / transform.crop_pct)


def decode(opened: ImageFile, transform: ImageTransform) -> Image.Image:
    """An opened upload's pixels as every tab decodes them, so that the same file gets the same numbers on each:
    reduced to ``MAX_SIDE`` (and never below ``needed_side`` for the model), never held at full size where its
    format allows (``load_image``). An image within ``MAX_SIDE`` is decoded whole, as ``load_image(path)``."""
    return opened.decode(MAX_SIDE, needed_side(transform))


def untimed(name: str, work: Callable[[], T]) -> T:
    """A named step of a request (``Step``), run as it is: ``bench.app_budget`` passes a step that times it."""
    return work()


def analyse(
    model: VisionTransformer,
    transform: ImageTransform,
    model_key: str,
    image: Upload | str,
    device: torch.device,
    step: Step = untimed,
) -> Analysis:
    """The cached analysis of an uploaded image by ``model``, computing it on a miss: the upload read once
    (``Upload``), decoded by ``decode``; API coordinates stay in the upload's own pixels. Its steps (reading the
    upload, decoding, preprocessing, the model's views) each run through ``step``.

    Raises ``vit_core.data.ImageDataError`` for files that are not safe, readable images."""
    upload = upload_of(image)

    def prepare(img: Image.Image) -> tuple[torch.Tensor, Image.Image]:
        # the model's input, and the copy overlays are drawn on (an extreme aspect ratio was kept larger for
        # the model)
        return transform(img).unsqueeze(0), render.display_copy(img, MAX_SIDE)

    def views(x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], float | None, bool | None]:
        with autocast(device):  # the views the model was calibrated for, calibrated and checked where it can be
            p = predict(model, x.to(device), return_attention=True)
        score = None if p.ood_score is None else float(p.ood_score[0])
        is_ood = None if p.is_ood is None else bool(p.is_ood[0])
        return p.probs[0].float().cpu(), [a.float().cpu() for a in p.attentions], score, is_ood

    def compute() -> Analysis:
        step("read", lambda: upload.header)
        img, size = step("decode", lambda: upload.decode(transform))
        x, shown = step("preprocess", lambda: prepare(img))
        probs, attentions, ood_score, is_ood = step("model views", lambda: views(x))
        return Analysis(
            model_ref=weakref.ref(model),
            shown=shown,
            size=size,
            crop=tuple(transform.crop_box(*size)),
            x=x,
            probs=probs,
            attentions=attentions,
            ood_score=ood_score,
            is_ood=is_ood,
        )

    return ANALYSES.get_or_compute((model_key, step("read", lambda: upload.digest)), model, compute)


# ------------------------------------------------------------------------------------ the first answer


@dataclass(frozen=True)
class FirstLook:
    """An upload's first answer: one forward pass of the image alone (``vit_core.explain.answer.first_answer``),
    its classes and the attention rollout of that pass, to show while the full answer is computed."""

    probs: torch.Tensor  # (num_classes,) float32, CPU: the image alone, one of ``views`` views
    names: list[str]  # the model's classes
    rollout: torch.Tensor  # (grid_h, grid_w) in [0, 1]
    views: int  # the views the full answer averages
    shown: Image.Image
    box: Box
    seconds: float  # from the request's start to this answer


def analyse_first(
    model: VisionTransformer,
    transform: ImageTransform,
    model_key: str,
    image: Upload | str,
    device: torch.device,
    settings: Settings | None = None,
) -> Iterator[FirstLook | Analysis]:
    """``analyse`` in two answers for an upload not analysed yet: its ``FirstLook`` from one forward pass, then
    the ``Analysis`` (cached as ``analyse`` caches it; its probabilities and decision are ``predict``'s), the full
    answer's views reusing that pass (``explain.answer.full_answer``). With ``settings`` asking for AttnLRP, on a
    model whose AttnLRP pass is a plain one (``shares_forward``), that pass is AttnLRP's and its map is kept in the
    analysis (``a.maps``: ``relevance`` finds it). A cached upload yields its analysis alone."""
    t0 = time.perf_counter()
    upload = upload_of(image)
    key = (model_key, upload.digest)
    if (cached := ANALYSES.get(key, model)) is not None:
        yield cached
        return
    img, size = upload.decode(transform)
    x, shown = transform(img).unsqueeze(0), render.display_copy(img, MAX_SIDE)
    crop = tuple(transform.crop_box(*size))
    lrp = settings is not None and settings.method.key == "attnlrp" and answers.shares_forward(model)
    with autocast(device):
        first = answers.first_answer(model, x.to(device), relevance=lrp)
    scale = shown.width / size[0]
    box = tuple(round(v * scale) for v in crop)
    seconds = time.perf_counter() - t0
    probs, rollout = first.probs[0].float().cpu(), first.rollout[0].float().cpu()
    yield FirstLook(probs, model.class_names, rollout, first.views, shown, box, seconds)
    target = None if settings is None else settings.target
    with autocast(device):
        full = answers.full_answer(model, x.to(device), first, target=target, relevance=lrp)
    p = full.prediction
    a = Analysis(
        model_ref=weakref.ref(model),
        shown=shown,
        size=size,
        crop=crop,
        x=x,
        probs=p.probs[0].float().cpu(),
        attentions=[att.float().cpu() for att in p.attentions],
        ood_score=None if p.ood_score is None else float(p.ood_score[0]),
        is_ood=None if p.is_ood is None else bool(p.is_ood[0]),
    )
    if full.relevance is not None and settings is not None:
        a.maps[map_key(a, settings)] = full.relevance[0].float().cpu()
        a.seconds[map_key(a, settings)] = time.perf_counter() - t0
    yield ANALYSES.get_or_compute(key, model, lambda: a)


# -------------------------------------------------------------------------------------------- maps


def explained_class(a: Analysis, s: Settings) -> int:
    """The class a map is for: the chosen target, else the prediction."""
    return int(a.probs.argmax()) if s.target is None else s.target


def relevance(
    a: Analysis, s: Settings, device: torch.device, progress: Callable[[float, str], None] | None = None
) -> torch.Tensor:
    """The map of ``s.method`` for the image: (grid_h, grid_w), or (H, W) for RISE.

    Drawn from the cached attentions when the method can be; else computed with the model (refused when it is
    not ``affordable`` here: requests are untrusted) once per class and options, then kept in ``a.maps``, the
    seconds it took in ``a.seconds``."""
    m, options = s.method, s.options()
    if m.from_attentions is not None:
        return m.from_attentions(a.model, a.attentions, a.grid, **options)[0]
    if not affordable(m, a.model, device):
        raise ValueError(refusal(m, a.model, device))
    key = map_key(a, s)
    if key not in a.maps:
        t0 = time.perf_counter()
        if m.per_class:
            options["target"] = key[1]
        if m.progress is not None and progress is not None:
            options["progress"] = lambda done, total: progress(done / total, f"{m.name}: {m.progress}")
        with autocast(device):
            heat = m.fn(a.model, a.x.to(device), **options)
        a.maps[key] = heat[0].float().cpu()
        a.seconds[key] = time.perf_counter() - t0
    return a.maps[key]


def map_key(a: Analysis, s: Settings) -> tuple:
    """The key of ``s``'s map in ``a.maps`` and ``a.seconds``: (method key, class or None, options)."""
    target = explained_class(a, s) if s.method.per_class else None
    return (s.method.key, target, *s.options().values())
