"""Opening images safely and converting them to the modes a model takes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError


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


def load_image(src: ImageSource, max_pixels: int = 50_000_000) -> Image.Image:
    """Open an image safely and return it decoded, upright, in mode "RGB" or "L".

    - Refuses images over ``max_pixels`` from the header, before decoding (decompression bombs):
      ``TooManyPixelsError``.
    - Non-images, truncated and corrupt files raise ``ImageDataError`` naming the source and the problem.
    - Applies the EXIF orientation (phone photos); animations give their first frame.
    - Grayscale stays "L" (also 1-bit and 16/32-bit, which are scaled to 8 bits: ``I;16`` by 1/257, ``I`` by
      1/257 when its values exceed 255, ``F`` by 255 when its values lie in [0, 1]); colour becomes "RGB"
      (palette, CMYK, YCbCr...). Transparent pixels are composited on **white**, as viewers show them.
    """
    name = _describe(src)
    try:
        if isinstance(src, Image.Image):
            return _decode(src, name, max_pixels)
        if isinstance(src, bytes | bytearray):
            src = io.BytesIO(src)
        with Image.open(src) as img:
            return _decode(img, name, max_pixels)
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


def _decode(img: Image.Image, name: str, max_pixels: int) -> Image.Image:
    w, h = img.size
    if w * h > max_pixels:
        raise TooManyPixelsError(name, (w, h), max_pixels)
    if getattr(img, "n_frames", 1) > 1:
        img.seek(0)
    img.load()
    try:
        img = ImageOps.exif_transpose(img)  # a new image, detached from the file
    except Exception:  # malformed EXIF: the pixels are fine, keep them as stored
        img = img.copy()
    try:
        return _to_rgb_or_l(img)
    except ImageDataError as e:
        raise ImageDataError(f"{name}: {e}") from None


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
