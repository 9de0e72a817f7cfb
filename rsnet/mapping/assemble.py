"""A scene's outputs from its windows' probabilities on disk, streamed by rows of cells (memory bounded by a few
rows of windows, whatever the scene's size and the stride): the probabilities and classes as Cloud-Optimised
GeoTIFFs, the area table, the preview over the scene's imagery, and last the record that marks the map complete.
Every file is written under a temporary name and put in place only once all of them are written and verified."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rasterio.transform import Affine

from rsnet.data.ground import GroundMeasure
from rsnet.data.raster import rgb_composite
from rsnet.integrity import file_digest
from rsnet.mapping.areas import AreaTally, write_area_table
from rsnet.mapping.categories import write_categories, write_style
from rsnet.mapping.cog import RasterLayout, write_cog
from rsnet.mapping.grid import WindowGrid
from rsnet.mapping.palette import colour_table
from rsnet.mapping.partial import PartialMap
from rsnet.mapping.plan import RESTYLED_SUFFIXES, ScenePlan, open_scene
from rsnet.mapping.preview import PreviewGeometry, write_preview

BLOCK_ROWS = 256  # rows of cells computed and written at a time
PREVIEW_CELLS = 900  # the preview's class grid: at most this many cells a side (every k-th), as the figure draws it


@dataclass(frozen=True)
class SceneSummary:
    """What the map of a scene holds: its grid of cells, the windows classified (a window mostly over the scene's
    nodata is not), the share of the mapped area per class."""

    grid: tuple[int, int]
    windows: int
    shares: tuple[float, ...]


def assemble_scene(plan: ScenePlan, partial: PartialMap, names: Sequence[str],
                   settings: Mapping[str, Any]) -> SceneSummary:
    """Write every output of ``plan`` from ``partial`` (complete)."""
    outputs = plan.outputs
    nodata = 255 if len(names) <= 255 else 65535
    every = max(1, -(-max(plan.grid.cells) // PREVIEW_CELLS))  # the preview draws every k-th cell
    with open_scene(plan.path) as src:
        crs, transform = src.crs, src.transform
        measure = GroundMeasure.of(crs, transform)
        geometry = _geometry(src, plan, every, measure)
    imagery = _imagery(*partial.read_canvas())
    cell_transform = transform @ Affine.scale(plan.grid.step, plan.grid.step)
    with _staged(list(outputs.values())) as staged, tempfile.TemporaryDirectory(dir=plan.out_dir,
                                                                                 prefix=".map-scratch-") as scratch:
        files = dict(zip(outputs, staged))
        class_rows = np.lib.format.open_memmap(Path(scratch) / "classes.npy", "w+", np.uint8 if nodata == 255
                                               else np.uint16, plan.grid.cells)
        tally = AreaTally(len(names), nodata)
        windows = _write_probabilities(files["probabilities.tif"], outputs["probabilities.tif"], plan, partial, names,
                                       crs, cell_transform, class_rows, tally, nodata, measure)
        colours = colour_table(names, nodata)
        write_cog(files["classes.tif"], (class_rows[None, i:i + BLOCK_ROWS] for i in range(0, len(class_rows),
                                                                                         BLOCK_ROWS)),
                  RasterLayout(*plan.grid.cells, 1, class_rows.dtype.name, nodata, crs, cell_transform, "mode",
                               ("class index (its name: tag class_names)",), {"class_names": json.dumps(list(names))},
                               colours), error_name=outputs["classes.tif"])
        write_categories(files["classes.tif.aux.xml"], names, colours, tally.cells, tally.hectares,
                         error_name=outputs["classes.tif.aux.xml"])
        write_style(files["classes.qml"], names, colours, error_name=outputs["classes.qml"])
        write_area_table(files["areas.csv"], names, tally, error_name=outputs["areas.csv"])
        shares = tally.pixels / max(tally.pixels.sum(), 1)
        write_preview(files["preview.png"], np.array(class_rows[::every, ::every]), nodata, names, shares,
                      f"{plan.path.name}: window {plan.grid.size} px, stride {plan.grid.step} px", geometry, imagery,
                      error_name=outputs["preview.png"])
        del class_rows
        record = {"settings": dict(settings), "grid": list(plan.grid.cells), "windows": windows,
                  "classified_on": partial.classified_on(),
                  "shares": [round(float(share), 6) for share in shares],
                  "files": {suffix: file_digest(files[suffix]) for suffix in outputs
                            if suffix not in ("map.json", *RESTYLED_SUFFIXES)}}
        with open(files["map.json"], "w") as handle:
            json.dump(record, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
    return SceneSummary(plan.grid.cells, windows, tuple(float(s) for s in shares))


def _write_probabilities(path: Path, final: Path, plan: ScenePlan, partial: PartialMap, names: Sequence[str],
                         crs: Any, transform: Affine, class_rows: np.ndarray, tally: AreaTally, nodata: int,
                         measure: GroundMeasure | None) -> int:
    """Write the probabilities COG at ``path``, filling ``class_rows`` and ``tally`` on the way; the windows
    classified."""
    counter = [0]
    blocks = _cell_blocks(plan.grid, partial, class_rows, tally, nodata, counter, measure)
    write_cog(path, blocks, RasterLayout(*plan.grid.cells, len(names), "float32", float("nan"), crs, transform,
                                         "average", tuple(names)), error_name=final)
    return counter[0]


def _cell_blocks(grid: WindowGrid, partial: PartialMap, class_rows: np.ndarray, tally: AreaTally, nodata: int,
                 classified: list[int], measure: GroundMeasure | None) -> Iterator[np.ndarray]:
    """The probabilities of the cells, (classes, rows, columns) blocks of :data:`BLOCK_ROWS` rows from the top; each
    cell the mean of the windows holding its centre (NaN where none was classified); ``tally`` counts each block
    with the ground area of a pixel at its cells' centres (by ``measure``)."""
    window_cols = len(grid.cols.offsets)
    first, stop = grid.cols.cover
    cells = np.arange(grid.cols.cells)
    lo, hi = np.searchsorted(stop, cells, side="right"), np.searchsorted(first, cells, side="right")
    span = int((hi - lo).max())
    cached: dict[int, np.ndarray] = {}
    n_rows = grid.rows.cells
    for top in range(0, n_rows, BLOCK_ROWS):
        block = np.empty((partial.classes, min(BLOCK_ROWS, n_rows - top), grid.cols.cells), np.float32)
        for i in range(block.shape[1]):
            a, b = grid.rows.windows_of_cell(top + i)
            for row in [r for r in cached if r < a]:
                del cached[row]
            for row in range(a, b):
                if row not in cached:
                    cached[row] = partial.read_windows(row * window_cols, (row + 1) * window_cols)
                    classified[0] += int(np.count_nonzero(~np.isnan(cached[row][:, 0])))
            block[:, i] = _cell_row([cached[row] for row in range(a, b)], lo, hi, span).T
        classes = np.where(np.isnan(block[0]), nodata, np.nan_to_num(block).argmax(axis=0)).astype(class_rows.dtype)
        class_rows[top:top + block.shape[1]] = classes
        rows = slice(top, top + block.shape[1])
        pixel_m2 = None if measure is None else measure.pixel_area_m2(grid.cols.centres[None, :],
                                                                       grid.rows.centres[rows, None])
        tally.add(classes, grid.rows.cell_pixels[rows], grid.cols.cell_pixels, pixel_m2)
        yield block


def _cell_row(window_rows: Sequence[np.ndarray], lo: np.ndarray, hi: np.ndarray, span: int) -> np.ndarray:
    """One row of cells, (columns, classes): per cell, the mean of the windows ``lo``..``hi`` - 1 of each of
    ``window_rows`` that were classified; NaN where none was."""
    sums = np.zeros((len(lo), window_rows[0].shape[1]), np.float64)
    counts = np.zeros(len(lo), np.int64)
    last = window_rows[0].shape[0] - 1
    for probabilities in window_rows:
        valid = ~np.isnan(probabilities[:, 0])
        for offset in range(span):
            window = np.minimum(lo + offset, last)
            take = (lo + offset < hi) & valid[window]
            sums[take] += probabilities[window[take]]
            counts[take] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return (sums / counts[:, None]).astype(np.float32)


def _geometry(src: Any, plan: ScenePlan, every: int, measure: GroundMeasure | None) -> PreviewGeometry:
    """Where the scene and the preview's class grid (every ``every``-th cell) lie: in the CRS where the raster has
    one and is not rotated, else in pixels; the scale bar in ground metres along x at the scene's centre."""
    rows, cols = (-(-cells // every) for cells in plan.grid.cells)
    step, transform = plan.grid.step * every, src.transform
    if src.crs is None or transform.b != 0 or transform.d != 0:
        return PreviewGeometry((0.0, float(src.height), float(src.width), 0.0),
                               (0.0, float(rows * step), float(cols * step), 0.0), None, "px", None)
    right, bottom = transform @ (cols * step, rows * step)
    map_bounds = (transform.c, bottom, right, transform.f) if transform.e < 0 else (transform.c, transform.f, right,
                                                                                     bottom)
    metres = None if measure is None else measure.metres_per_unit_east(src.width / 2, src.height / 2)
    if src.crs.is_geographic:
        return PreviewGeometry(tuple(src.bounds), map_bounds, src.crs.to_string(), "°", metres, geographic=True)
    unit, factor = src.crs.linear_units_factor
    return PreviewGeometry(tuple(src.bounds), map_bounds, src.crs.to_string(), "m" if factor == 1 else unit, metres)


def _imagery(samples: np.ndarray, data: np.ndarray | None) -> np.ndarray:
    """The preview's uint8 RGB picture of the canvas's samples (8-bit as they are, others stretched 2-98 %; gray as
    gray), white where the scene has no data."""
    pixels = np.repeat(samples, 3, axis=2) if samples.shape[2] == 1 else samples
    picture = pixels if pixels.dtype == np.uint8 else rgb_composite(pixels, range(3))
    if data is not None:
        picture = np.where(data[..., None], picture, 255).astype(np.uint8)
    return picture


@contextmanager
def _staged(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """Temporary paths beside ``paths``, for the block to write and verify; only when the block has written every
    one of them do they replace ``paths`` (in their order: the record last), so a scene's files are put in place all
    complete or not at all; the temporary files are removed in any case."""
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    staged = [path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp") for path in paths]
    try:
        yield staged
        for temporary, path in zip(staged, paths):
            os.replace(temporary, path)
    finally:
        for temporary in staged:
            temporary.unlink(missing_ok=True)
