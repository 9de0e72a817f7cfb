"""What mapping a scene means before any window is classified: the bands the model reads, the window and its rule,
the stride and the grid; every scene of a run is checked this way first, so bad input is one line naming the file
and nothing is written."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rasterio.enums import MaskFlags

from rsnet.data.decode import picture_bands
from rsnet.data.ground import ground_pixel_size
from rsnet.data.raster import open_raster
from rsnet.mapping.grid import WindowGrid
from rsnet.mapping.imagery import Canvas

if TYPE_CHECKING:
    from rsnet.inference import Predictor

log = logging.getLogger(__name__)

OUTPUT_SUFFIXES = ("classes.tif", "classes.tif.aux.xml", "classes.qml", "probabilities.tif", "preview.png", "areas.csv",
                   "map.json")
RESTYLED_SUFFIXES = ("classes.tif.aux.xml", "classes.qml")  # GIS software rewrites these (QGIS: statistics it computes,
# a style saved as the layer's default): a complete map's record checks that they exist, not their digests


@dataclass(frozen=True)
class ScenePlan:
    """One scene of a map: its raster, the 1-based bands read, the window (raster pixels) and the rule that chose
    it, the grid, whether the scene marks nodata, and the files it is mapped to."""

    path: Path
    out_dir: Path
    indexes: tuple[int, ...]
    window_rule: str
    grid: WindowGrid
    masked: bool
    dtype: str  # the samples of the bands read

    @property
    def stem(self) -> str:
        return self.path.stem

    def canvas(self, rgb: Sequence[int] | None) -> Canvas:
        """The preview's canvas of the scene: the bands read at positions ``rgb`` (a multispectral model's red, green
        and blue), else the picture's own (gray or RGB)."""
        bands = tuple(rgb) if rgb is not None else tuple(range(min(3, len(self.indexes))))
        return Canvas(self.grid.height, self.grid.width, bands, self.dtype, self.masked)

    @property
    def outputs(self) -> dict[str, Path]:
        """The scene's files by suffix (classes.tif and its GDAL sidecar and QGIS style, probabilities.tif,
        preview.png, areas.csv, map.json: the record of a complete map, written last)."""
        return {suffix: self.out_dir / f"{self.stem}_{suffix}" for suffix in OUTPUT_SUFFIXES}


def plan_scene(predictor: Predictor, raster: str | os.PathLike, out_dir: str | os.PathLike, window: int | None = None,
               stride: int | None = None, batch_size: int = 32) -> ScenePlan:
    """Check ``raster`` against the model and the settings and lay out its windows; ValueError naming the file for a
    raster the model cannot read, a window that does not fit, or a folder in the way of an output."""
    raster, out_dir = Path(raster), Path(out_dir)
    batch_size = whole_number("batch_size", batch_size)
    with open_scene(raster) as src:
        indexes = bands_read(predictor, src, raster)
        size, rule = scene_window(predictor, src, window)
        step = size if stride is None else whole_number("stride", stride)
        _say_the_footprint(raster, src, size, step, rule, window is None and not predictor.footprint.get("metres"))
        _check_fits(raster, src, size, step, "" if window is not None else f" ({rule})")
        plan = ScenePlan(raster, out_dir, tuple(indexes), rule, WindowGrid(src.height, src.width, size, step,
                                                                            batch_size), has_nodata(src),
                         src.dtypes[indexes[0] - 1])
    for path in plan.outputs.values():
        if path.is_dir():
            raise ValueError(f"{path} is a folder, and the map of {raster} writes a file there: move the folder, or "
                             "pass another map=")
    return plan


def scene_window(predictor: Predictor, src: Any, window: int | None = None) -> tuple[int, str]:
    """The window side in pixels of the open raster ``src`` and the rule that chose it: ``window`` when given, else
    a training image's ground size in metres over this raster's pixel size on the ground at its centre (a model that
    records it, a raster with a coordinate system), else a training image's width in pixels, else the model's image
    size (an older model)."""
    if window is not None:
        return whole_number("window", window), f"window={window}"
    metres, pixels = predictor.footprint.get("metres"), predictor.footprint.get("pixels")
    pixel_m = ground_pixel_size(src)
    if metres and pixel_m is not None:
        source = predictor.footprint.get("source")
        measured = f"{metres:g} m ({source})" if source else f"{metres:g} m"
        return round(metres / pixel_m), (f"a training image's ground size, {measured}, at {pixel_m:.3g} m per pixel "
                                          "on the ground at the scene's centre")
    if pixels:
        unknown = "; the raster has no coordinate system" if metres else "; its ground size is unknown"
        return round(pixels), f"a training image's width in pixels{unknown}"
    return predictor.image_size, "the model's image size; it records no training image size"


def _say_the_footprint(path: Path, src: Any, size: int, step: int, rule: str, ground_unknown: bool) -> None:
    """Log the window in pixels and ground metres and the rule that chose it; warn, with the setting to use, when the
    model does not know how much ground a training image covered (the window may be at the wrong scale)."""
    pixel_m = ground_pixel_size(src)
    on_ground = f" = {size * pixel_m:.0f} m on the ground" if pixel_m is not None else ""
    log.info("%s: window %d px%s, stride %d px (%s)", path, size, on_ground, step, rule)
    if ground_unknown and pixel_m is not None:
        log.warning("%s: the model does not record how much ground a training image covered (its dataset has no "
                    "ground resolution): its window of %d px may be at the wrong scale; pass window= in this scene's "
                    "pixels (%.3g m each) for the ground a training image covered", path, size, pixel_m)


def whole_number(setting: str, value: Any) -> int:
    """``value`` as a whole number >= 1; ValueError naming ``setting`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{setting}={value!r}: must be a whole number >= 1")
    return int(value)


def open_scene(path: Path) -> Any:
    """The raster at ``path`` opened with rasterio; ValueError naming it when GDAL cannot read it."""
    try:
        return open_raster(path)
    except Exception as error:  # noqa: BLE001 - rasterio raises RasterioIOError, CPLE_* errors, ... for bad files
        raise ValueError(f"cannot read raster {path}: {' '.join(str(error).split())}; pass a GeoTIFF, JPEG, PNG or "
                         "another file GDAL reads") from error


def bands_read(predictor: Predictor, src: Any, path: Path) -> list[int]:
    """The 1-based bands of ``src`` the model reads; ValueError naming ``path`` when it lacks them."""
    bands = predictor.bands
    if bands is None:
        if src.count > 4:
            raise ValueError(f"{path} has {src.count} bands and the model was trained on RGB pictures (gray, RGB or "
                             "RGBA): map an RGB rendering of the scene, or use a model trained on its bands")
        return picture_bands(src.count)
    if src.count < max(bands.indices):
        raise ValueError(f"{path} has {src.count} band(s) and the model reads bands {list(bands.indices)} "
                         f"({', '.join(bands.names)}): map a raster that holds them")
    if bands.count is not None and src.count != bands.count:
        raise ValueError(f"{path} has {src.count} band(s) and the model was trained on files of {bands.count}: its "
                         "band numbers would mean other bands; map a raster of the training files' bands, in their "
                         "order (e.g. gdal_translate -b ...)")
    found = {src.dtypes[i - 1] for i in bands.indices}
    if found != {bands.dtype}:
        raise ValueError(f"{path} holds {', '.join(sorted(found))} samples and the model's bands are {bands.dtype}: "
                         f"convert the scene to {bands.dtype} in the training files' units")
    return list(bands.indices)


def has_nodata(src: Any) -> bool:
    """Whether the scene marks pixels as nodata: a nodata value, an alpha band or a mask (GDAL's mask flags)."""
    return src.nodata is not None or any(MaskFlags.all_valid not in flags for flags in src.mask_flag_enums)


def _check_fits(path: Path, src: Any, size: int, step: int, why: str) -> None:
    if size < 1:
        raise ValueError(f"{path}: window {size} px{why}: pass window=... (raster pixels)")
    if size > min(src.width, src.height):
        raise ValueError(f"{path}: window {size} px{why} > raster {src.width} × {src.height} px: pass window=... "
                         f"(at most {min(src.width, src.height)})")
    if step > size:
        raise ValueError(f"{path}: stride {step} px > window {size} px leaves pixels that no window sees: pass "
                         f"stride=... (1 to {size})")
