"""What a class map's values mean, where GIS software looks for it: GDAL category names and a raster attribute table
(value, class, red, green, blue, cells, hectares) in a band's XML (a GeoTIFF's ``.aux.xml`` sidecar, a VRT's band),
and a QGIS layer style (``.qml``: a paletted renderer naming and colouring every class), which QGIS applies to the
layer of the same base name."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

from rsnet.files import DiskFullError, atomic_write

__all__ = ["add_categories", "write_categories", "write_style"]

Colours = Mapping[int, Sequence[int]]  # class index to 0..255 (red, green, blue[, alpha]): a colour table
QGIS_VERSION = "3.28.0-Firenze"  # the version a style is written for (QGIS converts an older one's on loading it)
_INTEGER, _REAL, _STRING = 0, 1, 2  # GDALRATFieldType
_GENERIC, _PIXEL_COUNT, _NAME, _MIN_MAX, _RED, _GREEN, _BLUE = 0, 1, 2, 5, 6, 7, 8  # GDALRATFieldUsage


def add_categories(band: ET.Element, names: Sequence[str], colours: Colours, cells: Sequence[int] | None = None,
                   hectares: Sequence[float] | None = None) -> None:
    """Append to ``band`` (a ``PAMRasterBand`` or ``VRTRasterBand`` element) the category names of class indexes
    0..len(``names``) - 1 and a thematic attribute table of a row per class: value, class, red, green, blue (from
    ``colours``), and ``cells`` and ``hectares`` where given (one per class; a NaN area is written as such)."""
    for column, values in (("cells", cells), ("hectares", hectares)):
        if values is not None and len(values) != len(names):
            raise ValueError(f"{len(values)} values of {column} for {len(names)} classes")
    categories = ET.SubElement(band, "CategoryNames")
    for name in names:
        ET.SubElement(categories, "Category").text = name
    rgb = list(zip(*(_colour(colours, index)[:3] for index in range(len(names)))))
    columns = [("value", _INTEGER, _MIN_MAX, range(len(names))), ("class", _STRING, _NAME, names),
               ("red", _INTEGER, _RED, rgb[0]), ("green", _INTEGER, _GREEN, rgb[1]), ("blue", _INTEGER, _BLUE, rgb[2])]
    if cells is not None:
        columns.append(("cells", _INTEGER, _PIXEL_COUNT, [int(count) for count in cells]))
    if hectares is not None:
        columns.append(("hectares", _REAL, _GENERIC, [f"{area:.2f}" if math.isfinite(area) else "nan"
                                                      for area in hectares]))
    table = ET.SubElement(band, "GDALRasterAttributeTable", tableType="thematic")
    for index, (name, kind, usage, _) in enumerate(columns):
        field = ET.SubElement(table, "FieldDefn", index=str(index))
        for tag, text in (("Name", name), ("Type", kind), ("Usage", usage)):
            ET.SubElement(field, tag).text = str(text)
    for row, values in enumerate(zip(*(values for *_, values in columns))):
        entry = ET.SubElement(table, "Row", index=str(row))
        for value in values:
            ET.SubElement(entry, "F").text = str(value)


def write_categories(path: Path, names: Sequence[str], colours: Colours, cells: Sequence[int] | None,
                     hectares: Sequence[float] | None, error_name: Path | None = None) -> None:
    """Write at ``path`` the GDAL sidecar (``<raster>.aux.xml``) giving band 1 of a class map the category names and
    attribute table of :func:`add_categories`. Atomic; a full disk is DiskFullError naming ``error_name`` (the final
    name when ``path`` is a temporary one) or ``path``."""
    root = ET.Element("PAMDataset")
    add_categories(ET.SubElement(root, "PAMRasterBand", band="1"), names, colours, cells, hectares)
    _write_xml(path, root, error_name)


def write_style(path: Path, names: Sequence[str], colours: Colours, error_name: Path | None = None) -> None:
    """Write at ``path`` a QGIS layer style (``.qml``) drawing band 1 with a paletted renderer: each class index in
    its colour of ``colours``, labelled with its name; other values (nodata) are not drawn. Atomic, as
    :func:`write_categories`."""
    root = ET.Element("qgis", version=QGIS_VERSION, styleCategories="Symbology")
    renderer = ET.SubElement(ET.SubElement(root, "pipe"), "rasterrenderer", type="paletted", band="1", opacity="1",
                             alphaBand="-1", nodataColor="")
    ET.SubElement(renderer, "rasterTransparency")
    palette = ET.SubElement(renderer, "colorPalette")
    for index, name in enumerate(names):
        red, green, blue, *alpha = _colour(colours, index)
        ET.SubElement(palette, "paletteEntry", value=str(index), color=f"#{red:02x}{green:02x}{blue:02x}",
                      label=name, alpha=str(alpha[0] if alpha else 255))
    ET.SubElement(root, "blendMode").text = "0"
    _write_xml(path, root, error_name, "<!DOCTYPE qgis PUBLIC 'http://mrcc.com/qgis.dtd' 'SYSTEM'>\n")


def _colour(colours: Colours, index: int) -> tuple[int, ...]:
    """The 0..255 channels of class ``index`` in ``colours``; ValueError for a class without a colour."""
    if index not in colours:
        raise ValueError(f"class index {index} has no colour in the colour table (indexes {sorted(colours)})")
    return tuple(int(channel) for channel in colours[index])


def _write_xml(path: Path, root: ET.Element, error_name: Path | None, doctype: str = "") -> None:
    """``root`` as an indented UTF-8 XML file at ``path`` (atomic), after ``doctype``."""
    ET.indent(root)
    try:
        with atomic_write(path, "wb") as handle:
            handle.write((doctype + ET.tostring(root, encoding="unicode") + "\n").encode())
    except DiskFullError as error:
        raise DiskFullError(error_name or path) from error
