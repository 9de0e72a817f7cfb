"""N-band rasters (GeoTIFF and anything GDAL reads) through rasterio: :class:`Bands` says which bands a model reads and
how they are stored; their digital numbers are kept as they are (no per-image stretch) and normalised per band with
statistics of the training split (docs/data.md, Multispectral data)."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import cv2
import numpy as np
from PIL import Image
from rasterio.warp import transform as transform_points

from .errors import CorruptImageError

__all__ = ["SAMPLE_TYPES", "Bands", "band_statistics", "bands_from_metadata", "ground_pixel_size", "max_pixel_value",
           "open_raster", "pictures", "resize_bands", "resolve_bands", "rgb_composite", "training_footprint"]

SAMPLE_TYPES = ("uint8", "uint16", "int16", "float32")  # sample types a model can read (OpenCV resizes them)


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
    composite that pictures show."""

    indices: tuple[int, ...]
    names: tuple[str, ...]
    dtype: str
    rgb: tuple[int, ...]

    @property
    def channels(self) -> int:
        return len(self.indices)

    def to_metadata(self) -> dict[str, Any]:
        """The JSON form stored in checkpoints and exports (:func:`bands_from_metadata` reads it)."""
        return {"indices": list(self.indices), "names": list(self.names), "dtype": self.dtype, "rgb": list(self.rgb)}

    def from_window(self, samples: np.ndarray, path: str | os.PathLike, size: int) -> np.ndarray:
        """Bands × H × W samples as rasterio reads them (already these bands) -> ``size`` × ``size`` × C in
        ``dtype``; CorruptImageError naming ``path`` for a sample type that does not fit."""
        found = np.dtype(samples.dtype)
        if found != np.dtype(self.dtype) and not np.can_cast(found, self.dtype, "safe"):
            raise CorruptImageError(str(path), f"its samples are {found}, the model's bands are {self.dtype}: "
                                               f"convert the file to {self.dtype}")
        pixels = np.moveaxis(samples, 0, -1).astype(self.dtype, copy=False)
        if pixels.dtype.kind == "f":
            pixels = np.nan_to_num(pixels, nan=0.0, posinf=0.0, neginf=0.0)  # nodata as NaN: zero
        return resize_bands(np.ascontiguousarray(pixels), size, size)

    def read(self, path: str | os.PathLike, size: int) -> np.ndarray:
        """The bands of one file as ``size`` × ``size`` × C samples of ``dtype``; CorruptImageError names a file
        that cannot be read or lacks a band."""
        try:
            with open_raster(path) as src:
                if src.count < max(self.indices):
                    raise CorruptImageError(str(path), f"it has {src.count} band(s), and the model reads bands "
                                                       f"{list(self.indices)} (dataset.bands)")
                samples = src.read(list(self.indices))
        except CorruptImageError:
            raise
        except Exception as error:  # rasterio raises RasterioIOError, CPLE_* errors, ... for bad files
            raise CorruptImageError(str(path), error) from error
        return self.from_window(samples, path, size)


def _band_index(value: Any, names: Sequence[str], count: int, first_file: str) -> int:
    """One ``dataset.bands`` entry (1-based index or band name) as a 1-based index; ValueError naming it."""
    if isinstance(value, str) and not value.isdigit():
        if value not in names:
            known = f"its bands are named {list(names)}" if names else "its bands have no names: use 1-based indices"
            raise ValueError(f"dataset.bands: no band named {value!r}; {known}")
        return names.index(value) + 1
    index = int(value)
    if not 1 <= index <= count:
        raise ValueError(f"dataset.bands: band {index} does not exist: '{first_file}' has {count} band(s), "
                         f"numbered 1..{count}")
    return index


def resolve_bands(setting: Any, first_file: str | os.PathLike, band_names: Sequence[str] = (),
                  rgb_bands: Sequence[int] = ()) -> Bands | None:
    """``dataset.bands`` (null: an RGB picture, read as before; ``all``; a list of 1-based indices or names) as the
    :class:`Bands` of a dataset whose files look like ``first_file``."""
    if setting is None:
        return None
    try:
        with open_raster(first_file) as src:
            count, dtype = src.count, np.dtype(src.dtypes[0]).name
    except Exception as error:  # noqa: BLE001 - any unreadable file
        raise CorruptImageError(str(first_file), error) from error
    if dtype not in SAMPLE_TYPES:
        raise ValueError(f"dataset.bands: '{first_file}' holds {dtype} samples; rsnet reads {', '.join(SAMPLE_TYPES)} "
                         "(convert the files, e.g. gdal_translate -ot Float32)")
    names = list(band_names) if len(band_names) == count else [f"band {i}" for i in range(1, count + 1)]
    if setting == "all":
        indices = list(range(1, count + 1))
    elif isinstance(setting, (list, tuple)) and setting:
        indices = [_band_index(value, band_names, count, str(first_file)) for value in setting]
    else:
        raise ValueError(f"dataset.bands must be null (RGB pictures), all, or a list of 1-based band indices or band "
                         f"names, got {setting!r}")
    if len(set(indices)) != len(indices):
        raise ValueError(f"dataset.bands lists a band twice: {list(setting)}")
    rgb = [indices.index(b) for b in rgb_bands if b in indices]
    if len(rgb) != 3:
        rgb = [0, 1, 2] if len(indices) >= 3 else [0] * 3
    return Bands(tuple(indices), tuple(names[i - 1] for i in indices), dtype, tuple(rgb))


def max_pixel_value(decoding: Any) -> float:
    """What normalisation divides the stored pixels by before ``(x - mean) / std``: 255 for uint8 RGB pictures, 1 for
    a dataset's :class:`Bands` (``decoding``), whose mean/std are in the bands' own units."""
    return 1.0 if isinstance(decoding, Bands) else 255.0


def bands_from_metadata(value: Mapping[str, Any] | None) -> Bands | None:
    """The :class:`Bands` a checkpoint or export records (None: an RGB model)."""
    if not value:
        return None
    return Bands(tuple(int(i) for i in value["indices"]), tuple(value["names"]), str(value["dtype"]),
                 tuple(int(i) for i in value["rgb"]))


def band_statistics(images: Any, rows: Sequence[int], chunk: int = 256) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-band mean and standard deviation of ``images[rows]`` (an indexable of H×W×C arrays), in float64,
    a ``chunk`` of images at a time; a constant band gets std 1."""
    rows = list(rows)
    total = sq = None
    count = 0
    for start in range(0, len(rows), chunk):
        block = np.stack([np.asarray(images[r]) for r in rows[start:start + chunk]]).astype(np.float64)
        flat = block.reshape(-1, block.shape[-1])
        total = flat.sum(0) if total is None else total + flat.sum(0)
        sq = (flat * flat).sum(0) if sq is None else sq + (flat * flat).sum(0)
        count += len(flat)
    mean = total / count
    std = np.sqrt(np.maximum(sq / count - mean * mean, 0.0))
    std[std <= 0] = 1.0
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def ground_pixel_size(src: Any) -> float | None:
    """Metres on the ground of a pixel's side at the centre of the open raster ``src`` (the square root of a pixel's
    ground area there, so rotated or sheared transforms, geographic coordinates and projections whose units are not
    ground metres, such as Web Mercator's, all count right), else None (no coordinate system, or PROJ cannot place
    it on the Earth)."""
    if src.crs is None:
        return None
    col, row = src.width / 2, src.height / 2
    xs, ys = zip(*(src.transform @ corner for corner in ((col, row), (col + 1, row), (col, row + 1))))
    try:
        (lon,), (lat,) = transform_points(src.crs, "EPSG:4326", xs[:1], ys[:1])
        local = f"+proj=aeqd +lat_0={lat} +lon_0={lon} +datum=WGS84 +units=m"  # true distances from the centre
        east, north = transform_points(src.crs, local, xs, ys)
    except Exception:  # noqa: BLE001 - rasterio raises CRSError, CPLE_* errors, ... for a CRS PROJ cannot convert
        return None
    across = (east[1] - east[0], north[1] - north[0])
    down = (east[2] - east[0], north[2] - north[0])
    area = abs(across[0] * down[1] - across[1] * down[0])
    return math.sqrt(area) if math.isfinite(area) and area > 0 else None


def training_footprint(paths: Sequence[str], ground_resolution_m: float | None = None,
                       sample: int = 32) -> dict[str, float | None]:
    """The ground footprint of a training image, for maps of whole scenes: the median width in pixels of up to
    ``sample`` of ``paths`` and, where known, in metres (from their georeference in a projected coordinate system,
    else ``ground_resolution_m`` × pixels)."""
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
        ground = float(np.median(metres))
    else:
        ground = pixels * ground_resolution_m if pixels and ground_resolution_m else None
    return {"pixels": pixels, "metres": ground}


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
