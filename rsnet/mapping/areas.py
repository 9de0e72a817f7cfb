"""The area of each class in a map: cells and scene pixels counted block by block as the class grid is written, and
the table of them (``<stem>_areas.csv``: cells, share of the mapped area, hectares where the CRS is projected)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rasterio.transform import Affine

from rsnet.files import DiskFullError, atomic_write

__all__ = ["AreaTally", "pixel_area_m2", "write_area_table"]


class AreaTally:
    """Cells and scene pixels per class of a class grid, added block by block (:meth:`add`); ``nodata`` cells are
    not counted."""

    def __init__(self, class_count: int, nodata: int) -> None:
        self.nodata = nodata
        self.cells = np.zeros(class_count, np.int64)
        self.pixels = np.zeros(class_count, np.int64)

    def add(self, classes: np.ndarray, row_pixels: np.ndarray, col_pixels: np.ndarray) -> None:
        """Count a (rows, cols) block of the class grid; ``row_pixels`` / ``col_pixels``: how many scene pixels
        each of its cell rows / columns covers inside the scene (an edge cell overhanging the scene covers fewer)."""
        if classes.shape != (len(row_pixels), len(col_pixels)):
            raise ValueError(f"a block of {classes.shape} cells with {len(row_pixels)} row and {len(col_pixels)} "
                             "column pixel counts")
        mapped = classes != self.nodata
        found = classes[mapped].astype(np.int64)
        outside = found[(found < 0) | (found >= len(self.cells))]
        if outside.size:
            raise ValueError(f"class index {outside[0]} outside 0..{len(self.cells) - 1} (nodata: {self.nodata})")
        weights = np.outer(np.asarray(row_pixels, np.float64), np.asarray(col_pixels, np.float64))[mapped]
        self.cells += np.bincount(found, minlength=len(self.cells))
        sums = np.bincount(found, weights, minlength=len(self.pixels))  # float64: exact below 2**53 pixels a block
        self.pixels += np.rint(sums).astype(np.int64)


def pixel_area_m2(crs: Any, transform: Affine) -> float | None:
    """The ground area in m² of one pixel of a raster at ``transform`` in ``crs`` where the CRS is projected (its
    linear unit converted to metres); None where it is geographic or missing (no constant pixel area)."""
    if crs is None or not crs.is_projected:
        return None
    metres = crs.linear_units_factor[1]
    return abs(transform.determinant) * metres * metres


def write_area_table(path: Path, names: Sequence[str], tally: AreaTally, pixel_area_m2: float | None,
                     error_name: Path | None = None) -> None:
    """Write the CSV ``class,cells,share,hectares`` at ``path``: a row per class of ``names`` in class-index order
    (zeros included, so that the tables of many scenes line up); ``share``: the class's scene pixels over all mapped
    ones (empty where nothing was mapped); ``hectares``: its pixels × ``pixel_area_m2`` (empty where None: the CRS
    is not projected). Atomic; a full disk is DiskFullError naming ``error_name`` (the final name when ``path`` is a
    temporary one) or ``path``."""
    if len(names) != len(tally.cells):
        raise ValueError(f"{len(names)} class names for a tally of {len(tally.cells)} classes")
    total = int(tally.pixels.sum())
    try:
        with atomic_write(path, "w") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["class", "cells", "share", "hectares"])
            for name, cells, pixels in zip(names, tally.cells, tally.pixels):
                share = f"{pixels / total:.6f}" if total else ""
                hectares = "" if pixel_area_m2 is None else f"{pixels * pixel_area_m2 / 10_000:.2f}"
                writer.writerow([name, int(cells), share, hectares])
    except DiskFullError as error:
        raise DiskFullError(error_name or path) from error
