"""N-band rasters (GeoTIFF and anything GDAL reads) through rasterio: :class:`Bands` says which bands a model reads and
how they are stored; their digital numbers are kept as they are (no per-image stretch) and normalised per band with
statistics of the training split (docs/data.md, Multispectral data)."""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import cv2
import numpy as np
from PIL import Image
from rasterio.enums import MaskFlags

from .errors import CorruptImageError
from .ground import ground_pixel_size

__all__ = ["DEFAULT_MAX_PIXELS", "SAMPLE_TYPES", "Bands", "band_statistics", "bands_from_metadata", "check_max_pixels",
           "max_pixel_value", "open_raster", "pictures", "resize_bands", "resolve_bands", "rgb_composite",
           "training_footprint"]

SAMPLE_TYPES = ("uint8", "uint16", "int16", "float32")  # sample types a model can read (OpenCV resizes them)
DEFAULT_MAX_PIXELS = 2 * Image.MAX_IMAGE_PIXELS  # pixels of one band file: PIL's decompression-bomb limit for pictures

if logging.getLogger("rasterio").level == logging.NOTSET:  # unless the user set it: rasterio logs GDAL's errors (INFO)
    logging.getLogger("rasterio").setLevel(logging.ERROR)  # and warnings as it handles them; rsnet names the file


def open_raster(path: str | os.PathLike) -> Any:
    """``rasterio.open(path)``, quiet about files without a georeference (a plain JPEG/PNG is a raster too)."""
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        return rasterio.open(path)


def resize_bands(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """H×W×C samples of any band count resized to ``height`` × ``width`` (OpenCV: area when shrinking, bilinear
    when enlarging; 4 bands at a time, as OpenCV's area resize takes at most 4), in their own sample type."""
    if pixels.shape[:2] == (height, width):
        return pixels
    shrink = height * width < pixels.shape[0] * pixels.shape[1]
    how = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    parts = [cv2.resize(np.ascontiguousarray(pixels[..., k:k + 4]), (width, height), interpolation=how)
             .reshape(height, width, -1) for k in range(0, pixels.shape[2], 4)]  # OpenCV drops a single band's axis
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=2)


@dataclass(frozen=True)
class Bands:
    """The bands a model reads: ``indices`` (1-based, as rasterio numbers them) in the model's channel order,
    their ``names``, the stored sample type ``dtype``, and ``rgb``, the positions (0-based, in ``indices``) of the
    composite that pictures show. ``count``: the bands of every file of the dataset (None: a model saved before
    rsnet recorded it); ``nodata``: the files' (finite) nodata value, left out of the band statistics; ``described``:
    the names are the files' own band descriptions, which every file must then agree with; ``max_pixels``: the most
    pixels a file may have (a guard against decompression bombs; a setting, not part of the model)."""

    indices: tuple[int, ...]
    names: tuple[str, ...]
    dtype: str
    rgb: tuple[int, ...]
    count: int | None = None
    nodata: float | None = None
    described: bool = False
    max_pixels: int = field(default=DEFAULT_MAX_PIXELS, compare=False)

    @property
    def channels(self) -> int:
        return len(self.indices)

    def to_metadata(self) -> dict[str, Any]:
        """The JSON form stored in checkpoints and exports (:func:`bands_from_metadata` reads it)."""
        recorded = {"count": self.count, "nodata": self.nodata, "described": self.described or None}
        return {"indices": list(self.indices), "names": list(self.names), "dtype": self.dtype, "rgb": list(self.rgb),
                **{key: value for key, value in recorded.items() if value is not None}}

    def with_max_pixels(self, max_pixels: Any, setting: str) -> Bands:
        """These bands read with the cap ``max_pixels`` (the value of ``setting``; None: the default)."""
        return replace(self, max_pixels=check_max_pixels(max_pixels, setting))

    def from_window(self, samples: np.ndarray, path: str | os.PathLike, size: int) -> np.ndarray:
        """Bands × H × W samples as rasterio reads them (already these bands) -> ``size`` × ``size`` × C in
        ``dtype``; CorruptImageError naming ``path`` for another sample type (its values would be another scale)."""
        self.check_sample_type(samples.dtype, path)
        pixels = np.moveaxis(samples, 0, -1)
        if pixels.dtype.kind == "f":
            pixels = np.nan_to_num(pixels, nan=0.0, posinf=0.0, neginf=0.0)  # nodata as NaN: zero
        return resize_bands(np.ascontiguousarray(pixels), size, size)

    def check_sample_type(self, found: Any, path: str | os.PathLike) -> None:
        """CorruptImageError naming ``path`` unless its samples (``found``) are of the bands' sample type."""
        if np.dtype(found) != np.dtype(self.dtype):
            raise CorruptImageError(str(path), f"its samples are {np.dtype(found)}, and the dataset's bands are "
                                               f"{self.dtype}: another sample type is another radiometric scale; "
                                               f"convert the file to {self.dtype} in the dataset's units")

    def check_file(self, src: Any, path: str | os.PathLike) -> None:
        """CorruptImageError naming ``path`` unless the open raster ``src`` is a file of these bands: their count,
        sample type and names, and at most ``max_pixels`` pixels."""
        if self.count is not None and src.count != self.count or src.count < max(self.indices):
            reads = f"the model reads bands {list(self.indices)}"
            files = f"the dataset's files have {self.count} ({reads})" if self.count is not None else reads
            raise CorruptImageError(str(path), f"it has {src.count} band(s), and {files}; see dataset.bands")
        self.check_sample_type(src.dtypes[self.indices[0] - 1], path)
        if src.width * src.height > self.max_pixels:
            raise CorruptImageError(str(path), f"it has {src.width} × {src.height} = {src.width * src.height:,} "
                                               f"pixels, more than max_pixels={self.max_pixels} (a guard against "
                                               "decompression bombs): if the file is genuine, raise dataset.max_pixels "
                                               "(rsnet-predict: max_pixels)")
        own = tuple(src.descriptions[i - 1] for i in self.indices)
        if self.described and all(own) and own != self.names:
            raise CorruptImageError(str(path), f"its bands {list(self.indices)} are named {list(own)}, and the "
                                               f"dataset's {list(self.names)}: every file must name its bands alike")

    def read(self, path: str | os.PathLike, size: int) -> np.ndarray:
        """The bands of one file as ``size`` × ``size`` × C samples of ``dtype``; CorruptImageError names a file
        that cannot be read, is not a file of these bands (:meth:`check_file`) or holds no data."""
        try:
            with open_raster(path) as src:
                self.check_file(src, path)
                samples = src.read(list(self.indices))
                empty = not _holds_data(src, samples, self.indices)
        except CorruptImageError:
            raise
        except Exception as error:  # rasterio raises RasterioIOError, CPLE_* errors, ... for bad files
            raise CorruptImageError(str(path), error) from error
        if empty:
            raise CorruptImageError(str(path), "every pixel of its bands is nodata (its nodata value, NaN or its "
                                               "mask): it shows nothing to learn or classify")
        return self.from_window(samples, path, size)


def _holds_data(src: Any, samples: np.ndarray, indices: Sequence[int]) -> bool:
    """Whether some pixel of ``samples`` (bands ``indices`` of the open raster ``src``) is data by the file's nodata
    value, NaN or mask."""
    if samples.dtype.kind == "f" and not np.isfinite(samples).any():
        return False
    if src.nodata is None and all(MaskFlags.all_valid in src.mask_flag_enums[i - 1] for i in indices):
        return True
    return bool(src.read_masks(list(indices)).any())


def check_max_pixels(value: Any, setting: str) -> int:
    """``max_pixels`` (None: :data:`DEFAULT_MAX_PIXELS`) as a whole number >= 1; ValueError naming ``setting``."""
    if value is None:
        return DEFAULT_MAX_PIXELS
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{setting}={value!r}: must be a whole number of pixels >= 1 (null: {DEFAULT_MAX_PIXELS:,})")
    return int(value)


def _band_index(value: Any, names: Sequence[str], count: int, first_file: str) -> int:
    """One ``dataset.bands`` entry (a whole 1-based index or a band name) as a 1-based index; ValueError naming it."""
    if isinstance(value, str) and not value.isdigit():
        if value not in names:
            known = f"its bands are named {list(names)}" if names else "its bands have no names: use 1-based indices"
            raise ValueError(f"dataset.bands: no band named {value!r}; {known}")
        return names.index(value) + 1
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"dataset.bands: {value!r} is not a band: list whole 1-based band indices or band names")
    index = int(value)
    if not 1 <= index <= count:
        raise ValueError(f"dataset.bands: band {index} does not exist: '{first_file}' has {count} band(s), "
                         f"numbered 1..{count}")
    return index


def _band_names(first_file: str, count: int, spec_names: Sequence[str], descriptions: Sequence[str | None],
                dataset: str) -> tuple[list[str], bool]:
    """The names of a dataset's ``count`` bands and whether they are the files' own: the dataset's (which must
    name ``count`` bands), else the first file's band descriptions (all present and distinct), else ``band N``."""
    if spec_names:
        if len(spec_names) != count:
            raise ValueError(f"dataset.bands: '{first_file}' has {count} band(s), and {dataset}'s files have "
                             f"{len(spec_names)} ({', '.join(spec_names)}): its files are another product; use "
                             "dataset=image_folder with band indices for them")
        return list(spec_names), False
    if all(descriptions) and len(set(descriptions)) == count:
        return [str(name) for name in descriptions], True
    return [f"band {i}" for i in range(1, count + 1)], False


def resolve_bands(setting: Any, first_file: str | os.PathLike, band_names: Sequence[str] = (),
                  rgb_bands: Sequence[int] = (), dataset: str = "the dataset", max_pixels: Any = None) -> Bands | None:
    """``dataset.bands`` (null: an RGB picture, read as before; ``all``; a list of 1-based indices or names) as the
    :class:`Bands` of a dataset whose files look like ``first_file`` (the names: ``band_names``, the dataset's,
    else the file's band descriptions)."""
    if setting is None:
        return None
    try:
        with open_raster(first_file) as src:
            count, dtype, nodata, descriptions = src.count, np.dtype(src.dtypes[0]).name, src.nodata, src.descriptions
    except Exception as error:  # noqa: BLE001 - any unreadable file
        raise CorruptImageError(str(first_file), error) from error
    if dtype not in SAMPLE_TYPES:
        raise ValueError(f"dataset.bands: '{first_file}' holds {dtype} samples; rsnet reads {', '.join(SAMPLE_TYPES)} "
                         "(convert the files, e.g. gdal_translate -ot Float32)")
    names, described = _band_names(str(first_file), count, band_names, descriptions, dataset)
    if setting == "all":
        indices = list(range(1, count + 1))
    elif isinstance(setting, (list, tuple)) and setting:
        indices = [_band_index(value, names if band_names or described else (), count, str(first_file))
                   for value in setting]
    else:
        raise ValueError(f"dataset.bands must be null (RGB pictures), all, or a list of 1-based band indices or band "
                         f"names, got {setting!r}")
    if len(set(indices)) != len(indices):
        raise ValueError(f"dataset.bands lists a band twice: {list(setting)}")
    rgb = [indices.index(b) for b in rgb_bands if b in indices]
    if len(rgb) != 3:
        rgb = [0, 1, 2] if len(indices) >= 3 else [0] * 3
    value = nodata if nodata is not None and math.isfinite(nodata) else None  # NaN: left out as non-finite anyway
    return Bands(tuple(indices), tuple(names[i - 1] for i in indices), dtype, tuple(rgb), count, value,
                 described, check_max_pixels(max_pixels, "dataset.max_pixels"))


def max_pixel_value(decoding: Any) -> float:
    """What normalisation divides the stored pixels by before ``(x - mean) / std``: 255 for uint8 RGB pictures, 1 for
    a dataset's :class:`Bands` (``decoding``), whose mean/std are in the bands' own units."""
    return 1.0 if isinstance(decoding, Bands) else 255.0


def bands_from_metadata(value: Mapping[str, Any] | None) -> Bands | None:
    """The :class:`Bands` a checkpoint or export records (None: an RGB model)."""
    if not value:
        return None
    return Bands(tuple(int(i) for i in value["indices"]), tuple(value["names"]), str(value["dtype"]),
                 tuple(int(i) for i in value["rgb"]), value.get("count"), value.get("nodata"),
                 bool(value.get("described", False)))


def band_statistics(images: Any, rows: Sequence[int], chunk: int = 256, nodata: float | None = None,
                    names: Sequence[str] = ()) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-band mean and standard deviation of ``images[rows]`` (an indexable of H×W×C arrays), in float64, a
    ``chunk`` of images at a time, leaving out ``nodata`` samples and non-finite ones; a constant band gets std 1.
    ValueError without rows, or for a band (``names``) without a data sample."""
    rows = list(rows)
    if not rows:
        raise ValueError("no training image to compute the band statistics from: the training split is empty")
    total = sq = count = 0.0
    for start in range(0, len(rows), chunk):
        block = np.stack([np.asarray(images[r]) for r in rows[start:start + chunk]]).astype(np.float64)
        flat = block.reshape(-1, block.shape[-1])
        valid = np.isfinite(flat) if nodata is None else np.isfinite(flat) & (flat != nodata)
        data = np.where(valid, flat, 0.0)
        total, sq, count = total + data.sum(0), sq + (data * data).sum(0), count + valid.sum(0)
    if not np.all(count):
        empty = [names[k] if k < len(names) else f"band {k + 1}" for k in np.flatnonzero(count == 0)]
        raise ValueError(f"{', '.join(empty)}: every training sample is nodata ({nodata}), so the band has no "
                         "statistics; leave the band out of dataset.bands or fix the files")
    mean = total / count
    std = np.sqrt(np.maximum(sq / count - mean * mean, 0.0))
    std[std <= 0] = 1.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def training_footprint(paths: Sequence[str], ground_resolution_m: float | None = None,
                       sample: int = 32) -> dict[str, float | str | None]:
    """The ground footprint of a training image, for maps of whole scenes: the median width in pixels of up to
    ``sample`` of ``paths`` and, where known, in metres (from their georeference, else ``ground_resolution_m`` ×
    pixels) with its ``source``."""
    widths, metres = [], []
    for path in list(paths)[:sample]:
        try:
            if Path(path).suffix.lower() not in (".tif", ".tiff"):  # a picture has no georeference: its header
                with Image.open(path) as picture:
                    widths.append(picture.width)
                continue
            with open_raster(path) as src:
                widths.append(src.width)
                pixel_m = ground_pixel_size(src)
                if pixel_m is not None:
                    metres.append(src.width * pixel_m)
        except Exception:  # noqa: BLE001 - an unreadable file is reported by decoding, not here
            continue
    pixels = float(np.median(widths)) if widths else None
    if metres:
        return {"pixels": pixels, "metres": float(np.median(metres)), "source": "the training images' georeference"}
    if pixels and ground_resolution_m:
        return {"pixels": pixels, "metres": pixels * ground_resolution_m,
                "source": f"the dataset's {ground_resolution_m:g} m pixels"}
    return {"pixels": pixels, "metres": None}


def rgb_composite(images: np.ndarray, rgb: Sequence[int]) -> np.ndarray:
    """(N, H, W, C) or (H, W, C) samples -> uint8 RGB of the bands ``rgb``, each stretched from its 2nd to its 98th
    percentile per image: for looking at, never for a model."""
    batch = images if images.ndim == 4 else images[None]
    out = np.empty((*batch.shape[:3], 3), np.uint8)
    for n, image in enumerate(batch):
        picked = image[..., list(rgb)].astype(np.float64)
        lo, hi = np.percentile(picked, (2, 98), axis=(0, 1))
        span = np.where(hi > lo, hi - lo, 1.0)
        out[n] = np.clip((picked - lo) / span * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return out if images.ndim == 4 else out[0]


def pictures(images: np.ndarray, decoding: Any) -> np.ndarray:
    """uint8 RGB pictures of decoded ``images``: themselves (RGB pictures), or the RGB composite of a dataset's
    :class:`Bands` (``decoding``)."""
    return rgb_composite(images, decoding.rgb) if isinstance(decoding, Bands) else images
