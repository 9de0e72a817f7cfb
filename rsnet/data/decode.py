"""Decoding one image file to the array a model input starts from: uint8 RGB, with 16-bit and float pixels stretched
to 8 bit as ``dataset.high_bit_depth`` says (docs/data.md, High-bit-depth imagery), or the
:class:`~rsnet.data.raster.Bands` of a multispectral dataset in their own sample type."""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Iterable

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from .errors import CorruptImageError
from .raster import Bands, open_raster

__all__ = ["DEFAULT_HIGH_BIT_DEPTH", "HIGH_BIT_DEPTH_MODES", "DecodeReport", "Decoding", "check_decoding",
           "check_high_bit_depth", "decode_image", "decode_window", "describe_rescaled", "picture_bands",
           "pixel_layout"]

cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)  # rsnet names every file OpenCV cannot read
HIGH_BIT_DEPTH_MODES = ("percentile", "minmax", "refuse")
DEFAULT_HIGH_BIT_DEPTH = "percentile"
PERCENTILES = (2.0, 98.0)  # the stretch of high_bit_depth="percentile"
_HIGH_BIT_PIL_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")  # gray 16-bit, int32, float32
RESAMPLE = Image.Resampling.BILINEAR
Decoding = str | Bands  # how files become pixels: a high_bit_depth mode (RGB pictures) or a dataset's bands


def check_high_bit_depth(value: str) -> str:
    """Return ``value``; ValueError naming ``dataset.high_bit_depth`` unless it is a known mode."""
    if value not in HIGH_BIT_DEPTH_MODES:
        raise ValueError(f"dataset.high_bit_depth must be one of {HIGH_BIT_DEPTH_MODES}, got {value!r}")
    return value


def check_decoding(decoding: Decoding) -> Decoding:
    """Return ``decoding``: :class:`Bands`, or a known ``dataset.high_bit_depth`` mode (ValueError otherwise)."""
    return decoding if isinstance(decoding, Bands) else check_high_bit_depth(decoding)


def pixel_layout(decoding: Decoding) -> tuple[int, np.dtype]:
    """(channels, sample type) of the arrays ``decoding`` gives: 3 × uint8 for RGB pictures."""
    if isinstance(decoding, Bands):
        return decoding.channels, np.dtype(decoding.dtype)
    return 3, np.dtype(np.uint8)


def describe_rescaled(sources: Iterable[str], total: int, high_bit_depth: str) -> str:
    """One line saying how many of ``total`` images were rescaled from which pixel formats, and how."""
    counts = Counter(sources)
    formats = ", ".join(f"{fmt}: {n}" for fmt, n in sorted(counts.items()))
    how = (f"a per-image stretch of percentiles {PERCENTILES[0]:g}..{PERCENTILES[1]:g} to 0..255"
           if high_bit_depth == "percentile" else "a per-image stretch of min..max to 0..255")
    return (f"{sum(counts.values())} of {total} images have 16-bit or float pixels ({formats}) and were rescaled "
            f"to 8 bit by {how} (dataset.high_bit_depth={high_bit_depth}; 'refuse' stops on such files instead)")


class DecodeReport:
    """What decoding changed, collected across threads: ``rescaled`` maps a file to its source pixel format
    (e.g. "I;16", "F", "RGB;16") when it was stretched from 16-bit or float pixels."""

    def __init__(self) -> None:
        self.rescaled: dict[str, str] = {}
        self._lock = threading.Lock()

    def add_rescaled(self, path: str, source: str) -> None:
        with self._lock:
            self.rescaled[path] = source


def decode_image(path: str | os.PathLike, size: int, decoding: Decoding = DEFAULT_HIGH_BIT_DEPTH,
                 report: DecodeReport | None = None) -> np.ndarray:
    """Decode one image file to uint8 ``size × size × 3`` RGB (``decoding``: a high_bit_depth mode) or to ``size ×
    size × C`` samples (``decoding``: the dataset's :class:`Bands`); a stretched high-bit-depth file is recorded in
    ``report`` so the caller warns once. CorruptImageError names a file that cannot be read or converted."""
    if isinstance(decoding, Bands):
        return decoding.read(path, size)
    check_high_bit_depth(decoding)
    try:
        arr, source = _decode(path, size, decoding)
    except CorruptImageError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, ... for bad files
        raise CorruptImageError(str(path), exc) from exc
    if arr.shape != (size, size, 3):
        raise CorruptImageError(str(path), ValueError(f"unexpected decoded shape {arr.shape}"))
    if source is not None and report is not None:
        report.add_rescaled(str(path), source)
    return arr


def picture_bands(count: int) -> list[int]:
    """The bands (1-based) of a raster of ``count`` bands read as an RGB picture: 1-3 (alpha dropped), else gray."""
    return [1, 2, 3] if count >= 3 else [1]


def decode_window(samples: np.ndarray, size: int, decoding: Decoding, path: str | os.PathLike,
                  report: DecodeReport | None = None) -> np.ndarray:
    """A window of a larger raster, bands × H × W as rasterio reads them (the model's bands, or for RGB pictures
    :func:`picture_bands`), as :func:`decode_image` gives a file of those pixels (JPEG's reduced-scale decoding
    aside)."""
    if isinstance(decoding, Bands):
        return decoding.from_window(samples, path, size)
    check_high_bit_depth(decoding)
    pixels = np.moveaxis(samples, 0, -1)
    if pixels.dtype == np.uint8:
        rgb = pixels if pixels.shape[2] == 3 else np.repeat(pixels[..., :1], 3, axis=2)
        return _from_8bit(Image.fromarray(np.ascontiguousarray(rgb), "RGB"), size)
    source = f"{pixels.shape[2]}-band {pixels.dtype}"
    out = _from_high_bit(path, pixels[..., 0] if pixels.shape[2] == 1 else pixels, source, size, decoding)
    if report is not None:
        report.add_rescaled(str(path), source)
    return out


def _decode(path: str | os.PathLike, size: int, high_bit_depth: str) -> tuple[np.ndarray, str | None]:
    """(uint8 RGB image, source pixel format if it was rescaled from high bit depth else None)."""
    try:
        im = Image.open(path)
    except UnidentifiedImageError:  # e.g. float or many-band TIFFs, which OpenCV may still read
        _refuse_many_bands(path)
        pixels = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if pixels is None or pixels.dtype == np.uint8:
            raise
        source = f"{pixels.dtype}" if pixels.ndim == 2 else f"{pixels.shape[2]}-band {pixels.dtype}"
        return _from_high_bit(path, _bgr_to_rgb(pixels), source, size, high_bit_depth), source
    with im:
        source = _high_bit_source(im)
        if source is None:
            return _from_8bit(im, size), None
        if im.mode in _HIGH_BIT_PIL_MODES:
            pixels = np.asarray(im)
        else:  # 16-bit RGB/RGBA/LA, which PIL would cut to their high byte
            pixels = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
            if pixels is None:
                raise ValueError(f"OpenCV cannot read the {source} pixels")
            pixels = _bgr_to_rgb(pixels)
        return _from_high_bit(path, pixels, source, size, high_bit_depth), source


def _refuse_many_bands(path: str | os.PathLike) -> None:
    """CorruptImageError naming ``path`` when GDAL finds more bands in it than a picture has (gray, RGB, RGBA):
    it says how to read them, where OpenCV would fail on it with a message of its own."""
    try:
        with open_raster(path) as src:
            count = src.count
    except Exception:  # noqa: BLE001 - not a raster GDAL reads: OpenCV has its try
        return
    if count > 4:
        raise CorruptImageError(str(path), f"it has {count} bands, and a picture is gray, RGB or RGBA: set "
                                           "dataset.bands (all, or the bands to read) to read its bands, or predict "
                                           "with a model trained on them")


def _from_8bit(im: Image.Image, size: int) -> np.ndarray:
    if im.format == "JPEG":
        im.draft("RGB", (size, size))  # let libjpeg decode at a reduced scale (never below size)
    try:
        im = im.convert("RGB")
    except ValueError as exc:
        raise ValueError(f"pixel mode {im.mode!r} cannot be converted to RGB ({exc})") from exc
    if im.size != (size, size):
        im = im.resize((size, size), RESAMPLE)
    return np.asarray(im, dtype=np.uint8)


def _high_bit_source(im: Image.Image) -> str | None:
    """The pixel format when ``im`` holds 16-bit or float samples, else None."""
    if im.mode in _HIGH_BIT_PIL_MODES:
        return im.mode
    tile = im.tile[0][3] if im.tile else None  # decoder args: the raw mode, alone or first
    rawmode = tile if isinstance(tile, str) else (tile[0] if tile else "")
    return f"{im.mode};16" if isinstance(rawmode, str) and ";16" in rawmode else None


def _bgr_to_rgb(pixels: np.ndarray) -> np.ndarray:
    """OpenCV's channel order (BGR, BGRA) to RGB(A); gray and two-band images are unchanged."""
    if pixels.ndim == 3 and pixels.shape[2] in (3, 4):
        return pixels[..., [2, 1, 0, *range(3, pixels.shape[2])]]
    return pixels


def _from_high_bit(path: str | os.PathLike, pixels: np.ndarray, source: str, size: int,
                   high_bit_depth: str) -> np.ndarray:
    """Stretch 16-bit/float gray, gray+alpha, RGB or RGBA pixels to a uint8 ``size × size`` RGB image."""
    if high_bit_depth == "refuse":
        raise CorruptImageError(str(path), f"{source} pixels are 16-bit or float and dataset.high_bit_depth=refuse "
                                           "(set it to percentile or minmax, or convert the file to 8-bit RGB)")
    bands = 1 if pixels.ndim == 2 else pixels.shape[2]
    if bands not in (1, 2, 3, 4):
        raise ValueError(f"{source} image with {bands} bands: as a picture only gray, gray+alpha, RGB or RGBA "
                         "can be read; set dataset.bands (all, or the bands to read) to train on its bands")
    colour = pixels if pixels.ndim == 2 else pixels[..., :3] if bands >= 3 else pixels[..., 0]  # drop alpha
    u8 = _stretch(colour, high_bit_depth)
    rgb = np.repeat(u8[..., None], 3, axis=2) if u8.ndim == 2 else u8
    im = Image.fromarray(np.ascontiguousarray(rgb), "RGB")
    if im.size != (size, size):
        im = im.resize((size, size), RESAMPLE)
    return np.asarray(im, dtype=np.uint8)


def _stretch(pixels: np.ndarray, high_bit_depth: str) -> np.ndarray:
    """Map ``[lo, hi]`` (2nd/98th percentiles, else min/max, of the finite values) linearly to 0..255, clipped,
    over all bands at once; NaN/inf become ``lo``/``hi``, a constant image 0."""
    x = pixels.astype(np.float64)
    finite = x[np.isfinite(x)]
    if finite.size == 0:
        return np.zeros(x.shape, np.uint8)
    lo, hi = float(finite.min()), float(finite.max())
    if high_bit_depth == "percentile":
        p_lo, p_hi = np.percentile(finite, PERCENTILES)
        if p_hi > p_lo:
            lo, hi = float(p_lo), float(p_hi)
    if hi <= lo:
        return np.zeros(x.shape, np.uint8)
    x = np.nan_to_num(x, nan=lo, posinf=hi, neginf=lo)
    return np.clip((x - lo) * (255.0 / (hi - lo)) + 0.5, 0, 255).astype(np.uint8)
