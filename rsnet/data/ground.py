"""Ground metres of a raster's pixels in any coordinate system, measured on the CRS's ellipsoid (pyproj), not in the
CRS's units: a Web Mercator metre is 1/cos(latitude) metres on the ground, a degree of longitude shrinks towards the
poles. A pixel's area at a point is the parallelogram spanned by its two sides there, each side a geodesic (length
and azimuth) between the centres of its opposite edges, so rotated and sheared transforms count right too."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyproj
from rasterio.transform import Affine

__all__ = ["GroundMeasure", "ground_pixel_size"]


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


def ground_pixel_size(src: Any) -> float | None:
    """Metres on the ground of a pixel's side at the centre of the open raster ``src`` (the square root of a pixel's
    ground area there), else None (no coordinate system, or PROJ cannot place it on the Earth)."""
    measure = GroundMeasure.of(src.crs, src.transform)
    if measure is None:
        return None
    area = float(measure.pixel_area_m2(np.array(src.width / 2), np.array(src.height / 2)))
    return math.sqrt(area) if math.isfinite(area) and area > 0 else None
