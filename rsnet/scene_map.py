"""A land-use map of a whole scene: a large raster classified window by window, read from disk one window at a time
(memory is bounded by a batch of windows, whatever the raster's size), written as GeoTIFFs that lie on the scene and
a preview PNG (docs/usage.md, Mapping a scene)."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import rasterio
from rasterio.enums import MaskFlags
from rasterio.env import get_gdal_config, set_gdal_config
from rasterio.transform import Affine
from PIL import Image
from rasterio.windows import Window

from rsnet.data.decode import decode_window, picture_bands
from rsnet.data.errors import CorruptImageError
from rsnet.data.native_messages import held_messages
from rsnet.data.raster import ground_pixel_size, open_raster
from rsnet.files import DiskFullError, disk_full_named
from rsnet.progress import progress_bar

if TYPE_CHECKING:
    from rsnet.inference import Predictor


@dataclass(frozen=True)
class SceneMap:
    """What :func:`map_scene` wrote and how: the three files, the class of every output cell (``nodata`` where no
    window covers it), the window and stride in raster pixels, the rule that chose the window, the windows
    classified and the seconds the whole map took."""

    classes_path: Path
    probabilities_path: Path
    preview_path: Path
    classes: np.ndarray
    nodata: int
    window: int
    stride: int
    window_rule: str
    windows: int
    seconds: float

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, columns) of output cells, each ``stride`` × ``stride`` raster pixels."""
        return self.classes.shape


def map_scene(predictor: Predictor, raster: str | os.PathLike, out_dir: str | os.PathLike, window: int | None = None,
              stride: int | None = None, batch_size: int = 32, progress: bool = True) -> SceneMap:
    """Classify ``raster`` window by window into ``out_dir``: ``<stem>_classes.tif``, ``<stem>_probabilities.tif``
    and ``<stem>_preview.png``.

    ``window`` (raster pixels) defaults to the ground size of a training image (see :func:`scene_window`), ``stride``
    to ``window``. Windows start every ``stride`` pixels from the top-left corner; one that would run past the
    right or bottom edge is left out. The output grid has cells of ``stride`` × ``stride`` pixels (ceil(height /
    stride) rows, ceil(width / stride) columns); a cell's probabilities are the mean of those of every window that
    holds the cell's centre (with stride = window: the one window on it), its class their argmax; a cell no window
    covers is nodata. A window mostly over the scene's own nodata (a nodata value, an alpha band or a mask) is not
    classified. ValueError names the file for a raster the model cannot read or a window that does not fit."""
    raster, out_dir = Path(raster), Path(out_dir)
    batch_size = _whole("batch_size", batch_size)
    started = time.perf_counter()
    paths = output_paths(raster, out_dir)
    with _open(raster) as src:
        indexes = _bands_read(predictor, src, raster)
        size, rule = scene_window(predictor, src, window)
        step = size if stride is None else _whole("stride", stride)
        _check_fits(raster, src, size, step, "" if window is not None else f" ({rule})")
        with _block_cache(src, size):
            sums, counts, windows = _classify(predictor, src, raster, indexes, size, step, batch_size, progress, rule)
        crs, transform = src.crs, src.transform @ Affine.scale(step, step)
    covered = counts > 0
    probabilities = np.full(sums.shape, np.nan, np.float32)
    probabilities[covered] = sums[covered] / counts[covered][:, None]
    names = predictor.class_names
    dtype = np.uint8 if len(names) <= 255 else np.uint16
    nodata = int(np.iinfo(dtype).max)
    classes = np.full(counts.shape, nodata, dtype)
    classes[covered] = probabilities[covered].argmax(axis=1)
    profile = dict(driver="GTiff", height=classes.shape[0], width=classes.shape[1], crs=crs, transform=transform,
                   compress="deflate")
    with _staged(paths) as staged:
        _write_classes(staged[0], paths[0], classes, nodata, names, profile)
        _write_probabilities(staged[1], paths[1], probabilities, names, profile)
        _write_preview(staged[2], paths[2], classes, nodata, names, f"{raster.name}: window {size} px, stride {step} px")
    return SceneMap(*paths, classes=classes, nodata=nodata, window=size, stride=step, window_rule=rule,
                    windows=windows, seconds=time.perf_counter() - started)


def scene_window(predictor: Predictor, src: Any, window: int | None = None) -> tuple[int, str]:
    """The window side in pixels of the open raster ``src`` and the rule that chose it: ``window`` when given, else
    a training image's ground size in metres over this raster's pixel size on the ground at its centre (a model that
    records it, a raster with a coordinate system), else a training image's width in pixels, else the model's image
    size (an older model)."""
    if window is not None:
        return _whole("window", window), f"window={window}"
    metres, pixels = predictor.footprint.get("metres"), predictor.footprint.get("pixels")
    pixel_m = ground_pixel_size(src)
    if metres and pixel_m is not None:
        return round(metres / pixel_m), (f"a training image's ground size, {metres:g} m, at {pixel_m:.3g} m per "
                                          "pixel on the ground at the scene's centre")
    if pixels:
        unknown = "; the raster has no coordinate system" if metres else ""
        return round(pixels), f"a training image's width in pixels{unknown}"
    return predictor.image_size, "the model's image size; it records no training image size"


def _whole(setting: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{setting}={value!r}: must be a whole number >= 1")
    return int(value)


def _open(path: Path) -> Any:
    try:
        return open_raster(path)
    except Exception as error:  # noqa: BLE001 - rasterio raises RasterioIOError, CPLE_* errors, ... for bad files
        raise ValueError(f"cannot read raster {path}: {' '.join(str(error).split())}; pass a GeoTIFF, JPEG, PNG or "
                         "another file GDAL reads") from error


def _bands_read(predictor: Predictor, src: Any, path: Path) -> list[int]:
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


def _check_fits(path: Path, src: Any, size: int, step: int, why: str) -> None:
    if size < 1:
        raise ValueError(f"{path}: window {size} px{why}: pass window=... (raster pixels)")
    if size > min(src.width, src.height):
        raise ValueError(f"{path}: window {size} px{why} > raster {src.width} × {src.height} px: pass window=... "
                         f"(at most {min(src.width, src.height)})")
    if step > size:
        raise ValueError(f"{path}: stride {step} px > window {size} px leaves pixels that no window sees: pass "
                         f"stride=... (1 to {size})")


def _classify(predictor: Predictor, src: Any, path: Path, indexes: list[int], size: int, step: int, batch_size: int,
              progress: bool, rule: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Per output cell, the sum of the probabilities of the windows covering it and their count; the windows
    classified (a window mostly over the scene's nodata is not: :func:`_mostly_data`)."""
    rows, cols = (src.height - size) // step + 1, (src.width - size) // step + 1
    grid = (-(-src.height // step), -(-src.width // step))
    span = (2 * size + step - 1) // (2 * step)  # cells per side whose centre lies inside a window
    sums = np.zeros((*grid, len(predictor.class_names)), np.float64)
    counts = np.zeros(grid, np.int32)
    total, classified = rows * cols, 0
    masked = _has_nodata(src)
    with progress_bar(total=total, unit="window", desc=f"mapping {path.name}", leave=False, dynamic_ncols=True,
                      disable=not progress) as bar:
        if progress:
            bar.write(f"mapping {path}: window {size} px ({rule}), stride {step} px, {total} windows", file=sys.stderr)
        for first in range(0, total, batch_size):
            batch = [divmod(index, cols) for index in range(first, min(first + batch_size, total))]
            bar.update(len(batch))
            corners = [(r, c) for r, c in batch if not masked or _mostly_data(src, r * step, c * step, size)]
            if not corners:
                continue
            images = np.stack([_window(predictor, src, path, indexes, r * step, c * step, size) for r, c in corners])
            for (r, c), p in zip(corners, predictor.probabilities(predictor.preprocess(images)).numpy()):
                sums[r:r + span, c:c + span] += p
                counts[r:r + span, c:c + span] += 1
            classified += len(corners)
    return sums, counts, classified


def _has_nodata(src: Any) -> bool:
    """Whether the scene marks pixels as nodata: a nodata value, an alpha band or a mask (GDAL's mask flags)."""
    return src.nodata is not None or any(MaskFlags.all_valid not in flags for flags in src.mask_flag_enums)


def _mostly_data(src: Any, row: int, col: int, size: int) -> bool:
    """Whether at least half of the window at (``row``, ``col``) is data by the scene's mask (an empty border of an
    orthophoto is not classified: its cells stay nodata unless a window with data covers them)."""
    return np.count_nonzero(src.dataset_mask(window=Window(col, row, size, size))) * 2 >= size * size


def _window(predictor: Predictor, src: Any, path: Path, indexes: list[int], row: int, col: int,
            size: int) -> np.ndarray:
    """The window at (``row``, ``col``) read from disk and decoded as a file of its pixels would be."""
    try:
        samples = src.read(indexes, window=Window(col, row, size, size))
    except Exception as error:  # noqa: BLE001 - a damaged block: rasterio's errors vary by driver
        raise ValueError(f"cannot read raster {path} at pixel ({col}, {row}): {' '.join(str(error).split())}; "
                         "check the file (e.g. gdalinfo -checksum)") from error
    try:
        return decode_window(samples, predictor.image_size, predictor.decoding, path)
    except CorruptImageError as error:
        raise ValueError(f"cannot map {path}: {error.reason}") from error


@contextmanager
def _block_cache(src: Any, size: int) -> Iterator[None]:
    """GDAL's block cache (process-wide; by default 5 % of the RAM) held to a strip of windows' rows while mapping:
    every block is decoded once, and the raster's blocks do not pile up in memory; restored afterwards."""
    previous = int(get_gdal_config("GDAL_CACHEMAX"))
    rows = size + 2 * src.block_shapes[0][0]
    strip = src.width * rows * src.count * max(np.dtype(dtype).itemsize for dtype in src.dtypes)
    set_gdal_config("GDAL_CACHEMAX", min(previous, strip + 16 * 2**20))
    try:
        yield
    finally:
        set_gdal_config("GDAL_CACHEMAX", previous)


def output_paths(raster: Path, out_dir: Path) -> list[Path]:
    """The three files a map of ``raster`` writes into ``out_dir``; ValueError naming one that a folder is in the way
    of (checked before any window is classified)."""
    paths = [out_dir / f"{raster.stem}_{suffix}" for suffix in ("classes.tif", "probabilities.tif", "preview.png")]
    for path in paths:
        if path.is_dir():
            raise ValueError(f"{path} is a folder, and the map of {raster} writes a file there: move the folder, or "
                             "pass another map=")
    return paths


@contextmanager
def _staged(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """Temporary paths beside ``paths``, for the block to write and verify; only when the block has written every
    one of them do they replace ``paths``, so a scene's files are put in place all complete or not at all (the
    previous versions stay as they were); the temporary files are removed in any case."""
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    staged = [path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp") for path in paths]
    try:
        yield staged
        for temporary, path in zip(staged, paths):
            os.replace(temporary, path)
    finally:
        for temporary in staged:
            temporary.unlink(missing_ok=True)


def _write_raster(temporary: Path, path: Path, expected: np.ndarray, profile: dict,
                  write: Callable[[Any], None]) -> None:
    """Have ``write`` fill a new GeoTIFF at ``temporary`` (``profile``), then read it back: its pixels must be
    ``expected`` (bands × rows × columns). GDAL does not raise on a failed write (a full disk), so a file that cannot
    be read back whole is DiskFullError, or ValueError, naming ``path``, with GDAL's first message."""
    with held_messages() as messages, disk_full_named(path):
        with rasterio.open(temporary, "w", **profile) as dst:
            write(dst)
    try:
        with held_messages() as reading, open_raster(temporary) as written:
            complete = np.array_equal(written.read(), expected, equal_nan=expected.dtype.kind == "f")
    except Exception as error:  # noqa: BLE001 - rasterio's errors for a damaged file vary
        messages += reading or [str(error)]
        complete = False
    if not complete:
        raise _write_failed(path, messages)


def _write_failed(path: Path, messages: Sequence[str]) -> OSError | ValueError:
    """The error for a map file that GDAL did not write whole: DiskFullError when its folder's file system is full."""
    said = next((" ".join(message.split()) for message in messages), "the file read back differs")
    if any("No space left on device" in message for message in messages) or _no_space(path.parent):
        return DiskFullError(path)
    return ValueError(f"cannot write {path}: GDAL did not write it whole ({said}); check that folder (free space, "
                      "quota, file system); its previous version, if any, is intact")


def _no_space(folder: Path) -> bool:
    """Whether the file system of ``folder`` has no block left for an ordinary user."""
    try:
        return os.statvfs(folder).f_bavail == 0
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False


def _write_classes(temporary: Path, path: Path, classes: np.ndarray, nodata: int, names: Sequence[str],
                   profile: dict) -> None:
    def write(dst: Any) -> None:
        if classes.dtype == np.uint8:  # before the pixels: it makes the file a palette image
            dst.write_colormap(1, {i: (*(255 * c).round().astype(int), 255) for i, c in enumerate(_palette(names))})
        dst.write(classes, 1)
        dst.set_band_description(1, "class index (its name: tag class_names)")
        dst.update_tags(class_names=json.dumps(list(names)))

    _write_raster(temporary, path, classes[None], dict(profile, count=1, dtype=classes.dtype.name, nodata=nodata),
                  write)


def _write_probabilities(temporary: Path, path: Path, probabilities: np.ndarray, names: Sequence[str],
                         profile: dict) -> None:
    bands = np.moveaxis(probabilities, -1, 0)

    def write(dst: Any) -> None:
        dst.write(bands)
        for band, name in enumerate(names, start=1):
            dst.set_band_description(band, name)

    _write_raster(temporary, path, bands, dict(profile, count=len(names), dtype="float32", nodata=np.nan), write)


def _palette(names: Sequence[str]) -> np.ndarray:
    """One qualitative RGB colour (0..1) per class: tab20's ten hues, then their light tones, then tab20b/c's."""
    from matplotlib import colormaps

    tab20 = colormaps["tab20"].colors
    colours = [*tab20[0::2], *tab20[1::2], *colormaps["tab20b"].colors, *colormaps["tab20c"].colors]
    if len(names) > len(colours):
        colours = [colormaps["hsv"](i / len(names)) for i in range(len(names))]
    return np.array([colour[:3] for colour in colours[:len(names)]])


def _write_preview(temporary: Path, path: Path, classes: np.ndarray, nodata: int, names: Sequence[str],
                   title: str) -> None:
    """The class map in the palette's colours (white: no window), a legend of the classes present, ``title``, as a
    PNG at ``temporary`` (a full disk: DiskFullError naming ``path``)."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    from rsnet.viz.figures import figure_array, new_figure

    colours = _palette(names)
    palette = ListedColormap(colours).with_extremes(bad="white")
    cells = np.ma.masked_equal(classes, nodata)  # an index image: drawn with less memory than an RGB one
    present = np.unique(cells.compressed())
    columns = max(1, -(-len(present) // 24))  # legend columns of at most 24 classes
    height = max(float(np.clip(6.0 * classes.shape[0] / classes.shape[1], 2.0, 10.0)),
                 0.22 * -(-len(present) // columns) + 0.8)  # the map, or the legend beside it if taller
    figure = new_figure(6.5 + 2.2 * columns, height)
    axes = figure.add_subplot()
    axes.imshow(cells, cmap=palette, vmin=-0.5, vmax=len(names) - 0.5, interpolation="nearest")
    axes.set_xticks([])
    axes.set_yticks([])
    axes.set_title(title, fontsize="medium")
    axes.legend(handles=[Patch(color=colours[i], label=names[i]) for i in present], ncols=columns,
                loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small", frameon=False)
    with disk_full_named(path), open(temporary, "wb") as handle:
        Image.fromarray(figure_array(figure)).save(handle, format="PNG")
        handle.flush()
        os.fsync(handle.fileno())
