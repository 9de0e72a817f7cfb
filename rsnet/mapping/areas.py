"""The area of each class in a map: cells, scene pixels and ground area counted block by block as the class grid is
written, and the table of them (``<stem>_areas.csv``: cells, share of the mapped area, hectares on the ground: a
cell counts its pixels at the ground area of the pixel at its centre, :class:`rsnet.data.ground.GroundMeasure`)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rsnet.files import DiskFullError, atomic_write

__all__ = ["AreaTally", "write_area_table"]


class AreaTally:
    """Cells, scene pixels and ground m² per class of a class grid, added block by block (:meth:`add`); ``nodata``
    cells are not counted. ``square_metres`` is None once a block came without ground areas."""

    def __init__(self, class_count: int, nodata: int) -> None:
        self.nodata = nodata
        self.cells = np.zeros(class_count, np.int64)
        self.pixels = np.zeros(class_count, np.int64)
        self.square_metres: np.ndarray | None = np.zeros(class_count, np.float64)

    def add(self, classes: np.ndarray, row_pixels: np.ndarray, col_pixels: np.ndarray,
            pixel_m2: np.ndarray | None = None) -> None:
        """Count a (rows, cols) block of the class grid; ``row_pixels`` / ``col_pixels``: how many scene pixels
        each of its cell rows / columns covers inside the scene (an edge cell overhanging the scene covers fewer);
        ``pixel_m2``: the ground area of a pixel at each cell (None: unknown)."""
        if classes.shape != (len(row_pixels), len(col_pixels)):
            raise ValueError(f"a block of {classes.shape} cells with {len(row_pixels)} row and {len(col_pixels)} "
                             "column pixel counts")
        mapped = classes != self.nodata
        found = classes[mapped].astype(np.int64)
        outside = found[(found < 0) | (found >= len(self.cells))]
        if outside.size:
            raise ValueError(f"class index {outside[0]} outside 0..{len(self.cells) - 1} (nodata: {self.nodata})")
        pixels = np.outer(np.asarray(row_pixels, np.float64), np.asarray(col_pixels, np.float64))
        self.cells += np.bincount(found, minlength=len(self.cells))
        sums = np.bincount(found, pixels[mapped], minlength=len(self.pixels))  # exact below 2**53 pixels a block
        self.pixels += np.rint(sums).astype(np.int64)
        if pixel_m2 is None or self.square_metres is None:
            self.square_metres = None
        else:
            self.square_metres += np.bincount(found, (pixels * pixel_m2)[mapped], minlength=len(self.pixels))

    @property
    def hectares(self) -> np.ndarray | None:
        """Ground hectares per class (NaN for a class with cells where the CRS does not reach), or None."""
        return None if self.square_metres is None else self.square_metres / 10_000


def write_area_table(path: Path, names: Sequence[str], tally: AreaTally, error_name: Path | None = None) -> None:
    """Write the CSV ``class,cells,share,hectares`` at ``path``: a row per class of ``names`` in class-index order
    (zeros included, so that the tables of many scenes line up); ``share``: the class's scene pixels over all mapped
    ones (empty where nothing was mapped); ``hectares``: its ground area (empty where unknown: no CRS, or one that
    does not reach its pixels). Atomic; a full disk is DiskFullError naming ``error_name`` (the final name when
    ``path`` is a temporary one) or ``path``."""
    if len(names) != len(tally.cells):
        raise ValueError(f"{len(names)} class names for a tally of {len(tally.cells)} classes")
    total = int(tally.pixels.sum())
    try:
        with atomic_write(path, "w") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["class", "cells", "share", "hectares"])
            hectares = tally.hectares if tally.hectares is not None else np.full(len(names), np.nan)
            for name, cells, pixels, area in zip(names, tally.cells, tally.pixels, hectares):
                share = f"{pixels / total:.6f}" if total else ""
                writer.writerow([name, int(cells), share, f"{area:.2f}" if np.isfinite(area) else ""])
    except DiskFullError as error:
        raise DiskFullError(error_name or path) from error
