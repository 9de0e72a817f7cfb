"""A mosaic of the class maps of a folder: one GDAL VRT per coordinate system, which reads the maps where they lie
(nothing is copied): the union of their extents at the finest cell size among them, nodata between them, their
colour table and class names (as GDAL category names and attribute table too), and a QGIS style beside it."""

from __future__ import annotations

import hashlib
import json
import math
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rasterio.dtypes import dtype_rev, typename_fwd
from rasterio.transform import Affine

from rsnet.data.raster import open_raster
from rsnet.files import atomic_write
from rsnet.mapping.categories import add_categories, write_style

__all__ = ["write_mosaics"]


@dataclass(frozen=True)
class _ClassMap:
    """What a mosaic needs of a class map: where it lies, its size and sample type, and what its pixels mean."""

    path: Path
    crs: Any
    transform: Affine
    width: int
    height: int
    dtype: str
    nodata: float | None
    block: tuple[int, int]
    class_names: list[str] | None
    description: str | None
    colormap: dict[int, tuple[int, int, int, int]] | None

    @property
    def placed(self) -> bool:
        """Whether the map lies north up on a coordinate system (a VRT places maps by their corners only)."""
        t = self.transform
        return self.crs is not None and t.b == 0 and t.d == 0 and t.a > 0 and t.e < 0


def write_mosaics(class_maps: Sequence[Path], out_dir: Path, stem: str = "mosaic_classes") -> list[Path]:
    """Write a VRT mosaic of ``class_maps`` into ``out_dir``: ``<stem>.vrt`` when the maps share one coordinate
    system, else one ``<stem>_<CRS>.vrt`` per system (``EPSG-32631``, or ``crs-<hash of its WKT>`` for one without an
    authority code), each with a QGIS style of the same name (``.qml``); the VRTs written. Maps without a coordinate
    system, or rotated, are left out. Where maps overlap, the later one's data wins. ValueError naming two maps
    whose class names differ."""
    maps = [map_ for map_ in (_read(Path(path)) for path in class_maps) if map_.placed]
    for map_ in maps[1:]:
        if map_.class_names != maps[0].class_names:
            raise ValueError(f"{maps[0].path} and {map_.path} map different classes (their tag class_names): a mosaic "
                             "joins the maps of one model; mosaic them apart")
    groups = _by_crs(maps)
    written = []
    for members in groups:
        label = "" if len(groups) == 1 else f"_{_crs_label(members[0].crs)}"
        path = Path(out_dir) / f"{stem}{label}.vrt"
        if members[0].class_names is not None and members[0].colormap is not None:
            write_style(path.with_suffix(".qml"), members[0].class_names, members[0].colormap)
        with atomic_write(path, "wb") as handle:
            ET.ElementTree(_vrt(members, path.parent)).write(handle, encoding="utf-8")
        written.append(path)
    return written


def _read(path: Path) -> _ClassMap:
    """The class map at ``path``; ValueError naming it when GDAL cannot read it."""
    try:
        with open_raster(path) as src:
            names = src.tags().get("class_names")
            return _ClassMap(path, src.crs, src.transform, src.width, src.height, src.dtypes[0], src.nodata,
                             src.block_shapes[0], None if names is None else json.loads(names),
                             src.descriptions[0], _colormap(src))
    except Exception as error:  # noqa: BLE001 - rasterio's errors for a damaged file vary
        raise ValueError(f"cannot read class map {path}: {' '.join(str(error).split())}; map that scene again") \
            from error


def _colormap(src: Any) -> dict[int, tuple[int, int, int, int]] | None:
    """Band 1's colour table of the open raster ``src``; None where it has none."""
    try:
        return src.colormap(1)
    except ValueError:  # rasterio: "NULL color table"
        return None


def _by_crs(maps: Sequence[_ClassMap]) -> list[list[_ClassMap]]:
    """``maps`` grouped by coordinate system, in the order each system first appears."""
    groups: list[list[_ClassMap]] = []
    for map_ in maps:
        group = next((group for group in groups if group[0].crs == map_.crs), None)
        if group is None:
            groups.append([map_])
        else:
            group.append(map_)
    return groups


def _crs_label(crs: Any) -> str:
    """A short name for ``crs`` in a file name: its authority code (``EPSG-32631``), else a hash of its WKT."""
    authority = crs.to_authority()
    if authority is not None:
        return "-".join(authority)
    return "crs-" + hashlib.sha256(crs.to_wkt().encode()).hexdigest()[:8]


def _vrt(maps: Sequence[_ClassMap], folder: Path) -> ET.Element:
    """The VRT of ``maps`` (one coordinate system) for a file in ``folder``: their union at the finest cell size
    among them, the first map's nodata (else its type's largest value), colour table, description and class names
    (also as category names and an attribute table)."""
    first = maps[0]
    x_res, y_res = min(m.transform.a for m in maps), min(-m.transform.e for m in maps)
    west, north = min(m.transform.c for m in maps), max(m.transform.f for m in maps)
    east = max(m.transform.c + m.width * m.transform.a for m in maps)
    south = min(m.transform.f + m.height * m.transform.e for m in maps)
    root = ET.Element("VRTDataset", rasterXSize=str(_cells((east - west) / x_res)),
                      rasterYSize=str(_cells((north - south) / y_res)))
    ET.SubElement(root, "SRS").text = first.crs.to_wkt()
    ET.SubElement(root, "GeoTransform").text = f"{west!r}, {x_res!r}, 0.0, {north!r}, 0.0, {-y_res!r}"
    if first.class_names is not None:
        metadata = ET.SubElement(root, "Metadata")
        ET.SubElement(metadata, "MDI", key="class_names").text = json.dumps(first.class_names)
    band = ET.SubElement(root, "VRTRasterBand", dataType=typename_fwd[dtype_rev[first.dtype]], band="1")
    if first.description:
        ET.SubElement(band, "Description").text = first.description
    nodata = first.nodata if first.nodata is not None else np.iinfo(first.dtype).max
    ET.SubElement(band, "NoDataValue").text = _number(nodata)
    if first.colormap is not None:
        ET.SubElement(band, "ColorInterp").text = "Palette"
        table = ET.SubElement(band, "ColorTable")
        for index in range(max(first.colormap) + 1):
            c1, c2, c3, c4 = first.colormap.get(index, (0, 0, 0, 0))
            ET.SubElement(table, "Entry", c1=str(c1), c2=str(c2), c3=str(c3), c4=str(c4))
        if first.class_names is not None:
            add_categories(band, first.class_names, first.colormap)
    for map_ in maps:
        band.append(_source(map_, folder, west, north, x_res, y_res))
    ET.indent(root)
    return root


def _source(map_: _ClassMap, folder: Path, west: float, north: float, x_res: float, y_res: float) -> ET.Element:
    """``map_`` as a VRT source placed on the mosaic's grid (nearest-neighbour where its cells are another size; its
    nodata cells leave what lies under them)."""
    source = ET.Element("ComplexSource", resampling="nearest")
    try:
        name, relative = Path(os.path.relpath(map_.path, folder)).as_posix(), "1"
    except ValueError:  # another drive (Windows): no relative path
        name, relative = str(Path(map_.path).absolute()), "0"
    ET.SubElement(source, "SourceFilename", relativeToVRT=relative).text = name
    ET.SubElement(source, "SourceBand").text = "1"
    ET.SubElement(source, "SourceProperties", RasterXSize=str(map_.width), RasterYSize=str(map_.height),
                  DataType=typename_fwd[dtype_rev[map_.dtype]], BlockXSize=str(map_.block[1]),
                  BlockYSize=str(map_.block[0]))
    ET.SubElement(source, "SrcRect", xOff="0", yOff="0", xSize=str(map_.width), ySize=str(map_.height))
    t = map_.transform
    ET.SubElement(source, "DstRect", xOff=_number((t.c - west) / x_res), yOff=_number((north - t.f) / y_res),
                  xSize=_number(map_.width * t.a / x_res), ySize=_number(map_.height * -t.e / y_res))
    if map_.nodata is not None:
        ET.SubElement(source, "NODATA").text = _number(map_.nodata)
    return source


def _cells(extent: float) -> int:
    """Whole cells covering ``extent`` cells (rounding error forgiven)."""
    return max(1, math.ceil(round(extent, 6)))


def _number(value: float) -> str:
    """``value`` for the XML: a whole number as such (pixel offsets off by rounding error made whole), else exact."""
    return str(round(value)) if abs(value - round(value)) < 1e-6 else repr(float(value))
