"""The area of each class in a map: cells, scene pixels and ground area counted block by block as the class grid is
written, and the table of them (``<stem>_areas.csv``: cells, share of the mapped area, hectares).

Ground areas and lengths are measured on the CRS's ellipsoid (pyproj), not in the CRS's units: a Web Mercator metre
is 1/cos(latitude) metres on the ground, a degree of longitude shrinks towards the poles. A pixel's area at a point
is the parallelogram spanned by its two sides there, each side a geodesic (length and azimuth) between the centres
of its opposite edges; a cell counts its pixels at the area of the pixel at its centre."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyproj
from rasterio.transform import Affine

from rsnet.files import DiskFullError, atomic_write

__all__ = ["AreaTally", "GroundMeasure", "write_area_table"]


class GroundMeasure:
    """Ground metres of a raster's pixels (``crs``, ``transform``) anywhere in it; :meth:`of` gives None where PROJ
    cannot place the CRS on an ellipsoid (or there is no CRS)."""

    def __init__(self, crs: Any, transform: Affine) -> None:
        source = pyproj.CRS.from_user_input(crs.to_wkt())
        self._to_lonlat = pyproj.Transformer.from_crs(source, source.geodetic_crs, always_xy=True)
        self._geod = source.get_geod()
        self.transform = transform

    @classmethod
    def of(cls, crs: Any, transform: Affine) -> GroundMeasure | None:
        if crs is None:
            return None
        try:
            measure = cls(crs, transform)
        except pyproj.exceptions.ProjError:  # CRSError is one
            return None
        return measure if measure._geod is not None else None

    def _sides(self, cols: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """Azimuths and lengths (m) of the pixel's two sides at pixel coordinates (``cols``, ``rows``)."""
        ends = [self._to_lonlat.transform(*(self.transform @ (cols + dc, rows + dr)))
                for dc, dr in ((-0.5, 0), (0.5, 0), (0, -0.5), (0, 0.5))]
        across_azimuth, _, across = self._geod.inv(*ends[0], *ends[1])
        down_azimuth, _, down = self._geod.inv(*ends[2], *ends[3])
        return np.asarray(across_azimuth), np.asarray(across), np.asarray(down_azimuth), np.asarray(down)

    def pixel_area_m2(self, cols: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The ground area in m² of a pixel at each pixel coordinate (``cols``, ``rows``: arrays of one shape; NaN
        where the CRS does not reach, e.g. Web Mercator past ±85°)."""
        cols, rows = np.broadcast_arrays(np.asarray(cols, np.float64), np.asarray(rows, np.float64))
        across_azimuth, across, down_azimuth, down = self._sides(cols.ravel(), rows.ravel())
        area = across * down * np.abs(np.sin(np.radians(across_azimuth - down_azimuth)))
        return np.where(np.isfinite(area), area, np.nan).reshape(cols.shape)

    def metres_per_unit_east(self, col: float, row: float) -> float | None:
        """Ground metres in one CRS unit along the raster's x axis at pixel (``col``, ``row``): what sizes a scale bar
        drawn in CRS units there (None where not finite)."""
        _, across, _, _ = self._sides(np.array([col], np.float64), np.array([row], np.float64))
        units = float(np.hypot(self.transform.a, self.transform.d))
        metres = float(across[0]) / units if units else float("nan")
        return metres if np.isfinite(metres) and metres > 0 else None


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
