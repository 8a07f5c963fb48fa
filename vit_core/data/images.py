"""Opening images safely and converting them to the modes a model takes."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError


class ImageDataError(ValueError):
    """Bad image data or data location; the message says what is wrong and what to do."""


class TooManyPixelsError(ImageDataError):
    """An image over ``load_image``'s ``max_pixels``, refused from its header before decoding; callers that
    set the limit for someone else (a web server) can say it in their own words."""

    def __init__(self, name: str, size: tuple[int, int], limit: int) -> None:
        w, h = size
        self.name, self.size, self.limit = name, size, limit
        super().__init__(
            f"{name}: refused, {w}x{h} = {w * h:,} pixels is more than the limit of {limit:,} "
            "(a guard against decompression bombs); downscale the image or raise max_pixels"
        )


ImageSource = str | Path | bytes | BinaryIO | Image.Image

# EXIF orientation -> the transpose that makes the stored pixels upright (as ImageOps.exif_transpose).
_ORIENTATION = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
# Bytes per decoded pixel that decoding holds at its peak, by mode (default 4: Pillow stores RGB, CMYK, YCbCr, I and F
# in 4 bytes a pixel): a reduced decode of RGBA / LA also makes a premultiplied copy; palette and 1-bit images
# are converted to RGB(A) / L, 16-bit ones to 32-bit, before they are reduced (Pillow's reduce takes neither).
_DECODE_BYTES = {"1": 2, "L": 1, "P": 9, "PA": 9, "LA": 8, "La": 4, "RGBA": 8, "I;16": 8, "I;16B": 8, "I;16L": 8}
_FORMAT_BYTES = {"WEBP": 16}  # libwebp decodes to a buffer of its own, which Pillow copies, then converts
_HIGH_DEPTH = ("I", "F", "I;16", "I;16B", "I;16L")  # scaled to 8 bits through float64 (``_high_depth_to_l``)
_JPEG_SCALES = (8, 4, 2, 1)  # the DCT scalings libjpeg decodes at (Pillow's draft mode)


@dataclass(frozen=True)
class ImageHeader:
    """What an image file declares before any pixel is decoded: enough to know what decoding it costs."""

    size: tuple[int, int]  # (width, height) upright, EXIF orientation applied (a PNG's, when before its pixels)
    format: str  # Pillow's name: "JPEG", "PNG", ...
    mode: str  # as stored: "RGB", "P", "I;16", ...

    @property
    def pixels(self) -> int:
        return self.size[0] * self.size[1]

    def decoded_size(self, max_side: int | None = None, min_side: int = 0) -> tuple[int, int]:
        """The size ``load_image`` decodes at with these arguments, before its final resize: the full size,
        or for JPEG the largest reduction by 2, 4 or 8 that is still at least the target (draft mode)."""
        w, h = self.size
        tw, th = target_size(self.size, max_side, min_side)
        if self.format not in ("JPEG", "MPO") or (tw, th) == (w, h):
            return w, h
        s = next(s for s in _JPEG_SCALES if min(w // tw, h // th) >= s)
        return -(-w // s), -(-h // s)

    def decode_bytes(self, max_side: int | None = None, min_side: int = 0) -> int:
        """Peak bytes ``load_image(..., max_side, min_side)`` allocates for this image, as measured for each
        mode and format: the decoded pixels (4 bytes each for colour; ``_DECODE_BYTES``, ``_FORMAT_BYTES``)
        and the result's: the reduced image the resize starts from (up to 4 times the result's pixels, at 4
        bytes each) and the result's copies (resize, transpose, conversion), 28 bytes a pixel of the result
        in all; 56 for 16- and 32-bit images, scaled to 8 bits in float64."""
        w, h = self.decoded_size(max_side, min_side)
        tw, th = target_size(self.size, max_side, min_side)
        per_pixel = _FORMAT_BYTES.get(self.format) or _DECODE_BYTES.get(self.mode, 4)
        return per_pixel * w * h + (56 if self.mode in _HIGH_DEPTH else 28) * tw * th


def target_size(size: tuple[int, int], max_side: int | None = None, min_side: int = 0) -> tuple[int, int]:
    """``size`` shrunk (never enlarged) so that its long side is at most ``max_side``, unless that would take
    its short side below ``min_side``: what a model resizing the short side to ``min_side`` and an overlay
    of ``max_side`` pixels need."""
    w, h = size
    if max_side is None or max(w, h) <= max_side:
        return w, h
    scale = min(1.0, max(max_side / max(w, h), min_side / min(w, h)))
    return max(1, round(w * scale)), max(1, round(h * scale))


def read_header(src: ImageSource, max_pixels: int = 50_000_000) -> ImageHeader:
    """The size (upright), format and mode an image declares, read without decoding its pixels; an
    ``ImageDataError`` for non-images and for images over ``max_pixels`` (decompression bombs)."""
    with open_image(src, max_pixels) as opened:
        return opened.header


def load_image(
    src: ImageSource, max_pixels: int = 50_000_000, max_side: int | None = None, min_side: int = 0
) -> Image.Image:
    """Open an image safely and return it decoded, upright, in mode "RGB" or "L".

    - Refuses images over ``max_pixels`` from the header, before decoding (decompression bombs):
      ``TooManyPixelsError``.
    - Non-images, truncated and corrupt files raise ``ImageDataError`` naming the source and the problem.
    - Applies the EXIF orientation (phone photos); animations give their first frame.
    - Grayscale stays "L" (also 1-bit and 16/32-bit, which are scaled to 8 bits: ``I;16`` by 1/257, ``I`` by
      1/257 when its values exceed 255, ``F`` by 255 when its values lie in [0, 1]); colour becomes "RGB"
      (palette, CMYK, YCbCr...). Transparent pixels are composited on **white**, as viewers show them.
    - ``max_side``: a larger image comes back reduced to ``target_size(size, max_side, min_side)`` (long side
      ``max_side``, short side at least ``min_side``), and is never held at full size where the format allows:
      JPEG decodes at 1/2, 1/4 or 1/8 scale (libjpeg's DCT scaling, Pillow's draft mode), other formats are
      decoded, then reduced at once (a box reduction, then a bicubic resize, premultiplied for transparency)
      and their full-size pixels freed.
      ``ImageHeader.decode_bytes`` says what that costs.
    """
    return open_image(src, max_pixels).decode(max_side, min_side)


class ImageFile:
    """An image opened once and not decoded yet (``open_image``): what it declares (``header``), then its pixels
    (``decode``, as ``load_image`` gives them), from that one opening: a server that estimates what decoding
    costs before it decodes parses the file's header once. Decoded once: decoding closes it."""

    def __init__(self, img: Image.Image, name: str, owned: bool) -> None:
        self._img, self.name, self._owned = img, name, owned
        with _errors(name):
            w, h = img.size
            # a PNG may keep its EXIF after the pixels, where reading it means decoding them: stored size then
            known = img.format != "PNG" or "exif" in img.info
            upright = (h, w) if known and _orientation(img) in (5, 6, 7, 8) else (w, h)
            self.header = ImageHeader(upright, img.format or "", img.mode)

    def decode(self, max_side: int | None = None, min_side: int = 0) -> Image.Image:
        """The pixels, as ``load_image`` decodes them with these arguments; the file is closed after."""
        try:
            with _errors(self.name):
                return _decode(self._img, self.name, max_side, min_side, self._owned)
        finally:
            self.close()

    def close(self) -> None:
        """Let the file go (an image handed in as a PIL image is its caller's, and stays open)."""
        if self._owned:
            self._img.close()

    def __enter__(self) -> ImageFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_image(src: ImageSource, max_pixels: int = 50_000_000) -> ImageFile:
    """``src`` opened lazily (its header read, no pixel decoded), refused over ``max_pixels``
    (``TooManyPixelsError``) and with every failure an ``ImageDataError`` naming the source."""
    name = _describe(src)
    if isinstance(src, Image.Image):
        img = src
    else:
        with _errors(name):
            img = Image.open(io.BytesIO(src) if isinstance(src, bytes | bytearray) else src)
    try:
        _check_pixels(img, name, max_pixels)
        return ImageFile(img, name, owned=img is not src)
    except BaseException:
        if img is not src:
            img.close()
        raise


@contextmanager
def _errors(name: str) -> Iterator[None]:
    """Every failure of opening or decoding ``name`` as an ``ImageDataError`` that names it and the problem."""
    try:
        yield
    except ImageDataError:
        raise
    except UnidentifiedImageError as e:
        raise ImageDataError(f"{name}: not an image, or a format Pillow cannot read") from e
    except Image.DecompressionBombError as e:
        raise ImageDataError(f"{name}: refused, too many pixels to decode safely ({e})") from e
    except OSError as e:
        if e.errno is not None:  # the file system (missing, a folder, no permission), not the decoder
            raise ImageDataError(f"{name}: cannot read the file ({e.strerror})") from e
        raise ImageDataError(f"{name}: the image data is truncated or corrupt ({e})") from e
    except Exception as e:  # decoders raise many types (SyntaxError, struct.error...) for malformed data
        raise ImageDataError(f"{name}: the image data is corrupt ({type(e).__name__}: {e})") from e


def _describe(src: object) -> str:
    if isinstance(src, str | Path):
        return str(src)
    name = getattr(src, "name", None)  # open files know their path
    return name if isinstance(name, str) else f"image ({type(src).__name__})"


def _check_pixels(img: Image.Image, name: str, max_pixels: int) -> None:
    w, h = img.size
    if w * h > max_pixels:
        raise TooManyPixelsError(name, (w, h), max_pixels)


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception:  # malformed EXIF: the pixels are fine, keep them as stored
        return 1


def _decode(img: Image.Image, name: str, max_side: int | None, min_side: int, owned: bool) -> Image.Image:
    """``img`` (opened, not decoded) decoded, reduced, upright and converted; ``owned``: ours to close, so the
    full decode's pixels can go as soon as the reduced copy exists."""
    if getattr(img, "n_frames", 1) > 1:
        img.seek(0)
    opened = img
    target = target_size(img.size, max_side, min_side)
    if target != img.size:
        img.draft(None, target)  # JPEG: decode at the smallest DCT scale still >= target; others: no-op
    img.load()
    orientation = _orientation(img)  # after the pixels: a PNG may keep its EXIF after them
    if target != img.size:
        if img.mode in ("1", "P", "PA"):  # averaged indices mean nothing: to L / RGB(A) first
            img = img.convert("L" if img.mode == "1" else "RGBA" if _transparent(img) else "RGB")
        elif img.mode.startswith("I;16"):  # Pillow reduces 32-bit integers, not 16-bit ones
            img = img.convert("I")
        # A box reduction by the largest whole factor that keeps at least the target's size, then one bicubic
        # resize (premultiplied where there is transparency): the reduced copy is under 4 times the result.
        img = img.resize(target, Image.Resampling.BICUBIC, reducing_gap=1.0)
        if owned:
            opened.close()  # the full decode's pixels go now
    transpose = _ORIENTATION.get(orientation)
    if transpose is not None:
        img = img.transpose(transpose)
    elif img is opened:
        img = img.copy()  # a new image, detached from the file
    try:
        return _to_rgb_or_l(img)
    except ImageDataError as e:
        raise ImageDataError(f"{name}: {e}") from None


def _transparent(img: Image.Image) -> bool:
    return img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in img.info


def _to_rgb_or_l(img: Image.Image) -> Image.Image:
    """Any PIL mode -> "L" (grayscale sources) or "RGB" (everything else), alpha composited on white."""
    mode = img.mode
    if mode in ("L", "RGB"):
        return img
    if mode == "1":
        return img.convert("L")
    if mode.startswith("I") or mode == "F":
        return _high_depth_to_l(img)
    if "transparency" in img.info and mode in ("L", "RGB", "P"):
        img = img.convert("LA" if mode == "L" else "RGBA")
    elif mode in ("PA", "RGBa", "La"):
        img = img.convert("LA" if mode == "La" else "RGBA")
    if img.mode in ("LA", "RGBA"):
        base = Image.new(img.mode[:-1], img.size, (255,) * (len(img.mode) - 1))  # white
        base.paste(img.convert(base.mode), mask=img.getchannel("A"))
        return base
    try:
        return img.convert("RGB")  # palette, CMYK (naive, no ICC), YCbCr, HSV
    except ValueError as e:
        raise ImageDataError(f"unsupported image mode {mode!r}: convert it to RGB first") from e


def _high_depth_to_l(img: Image.Image) -> Image.Image:
    a = np.nan_to_num(np.asarray(img).astype(np.float64))
    if img.mode.startswith("I;16") or (img.mode == "I" and a.max(initial=0) > 255):
        a = a / 257.0  # 65535 -> 255
    elif img.mode == "F" and a.min(initial=0) >= 0 and a.max(initial=0) <= 1:
        a = a * 255.0
    return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), "L")


def to_model_mode(img: Image.Image, in_chans: int) -> Image.Image:
    """The PIL image as the model takes it: "L" for 1 channel (ITU-R 601 luma), "RGB" for 3 (gray replicated)."""
    if in_chans not in (1, 3):
        raise ValueError(f"models take 1 or 3 input channels, got in_chans={in_chans}")
    img = _to_rgb_or_l(img)
    want = "L" if in_chans == 1 else "RGB"
    return img if img.mode == want else img.convert(want)


def match_channels(x: torch.Tensor, in_chans: int) -> torch.Tensor:
    """``to_model_mode`` for uint8 (..., C, H, W) tensors, with PIL's exact integer luma."""
    c = x.shape[-3]
    if c == in_chans:
        return x
    if c == 1 and in_chans == 3:
        return x.expand(*x.shape[:-3], 3, *x.shape[-2:])
    if c == 3 and in_chans == 1:
        r, g, b = x.int().unbind(-3)  # PIL: L = (R*19595 + G*38470 + B*7471 + 0x8000) >> 16
        return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).to(torch.uint8).unsqueeze(-3)
    raise ImageDataError(f"expected images with 1 or 3 channels, got {c} (shape {tuple(x.shape)})")
