"""What a class map's values mean to GIS software (rsnet.mapping.categories): GDAL category names and a raster
attribute table in a GeoTIFF's ``.aux.xml`` sidecar and in a VRT mosaic's band, read back through GDAL itself (the
libgdal rasterio loads, called with ctypes: rasterio reads neither), and the QGIS layer style (``.qml``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import xml.etree.ElementTree as ET
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.transform import Affine

from rsnet.files import DiskFullError
from rsnet.mapping.categories import write_categories, write_style
from rsnet.mapping.cog import RasterLayout, write_cog
from rsnet.mapping.mosaic import write_mosaics

NAMES = ["forest", "river", "road", "Forêt <mixte> & \"prairie\""]  # XML's special characters and a non-ASCII one
COLOURS = {0: (34, 139, 34, 255), 1: (30, 144, 255, 255), 2: (128, 128, 128, 255), 3: (220, 20, 60, 255),
           255: (0, 0, 0, 0)}
PALETTE = [(str(index), name, colour, "255")  # a QGIS style's entries: value, label, colour, alpha
           for index, (name, colour) in enumerate(zip(NAMES, ["#228b22", "#1e90ff", "#808080", "#dc143c"]))]
CELLS = Affine(10.0, 0.0, 500_000.0, 0.0, -10.0, 4_000_000.0)
RGB_COLUMNS = [("value", "min-max"), ("class", "name"), ("red", "red"), ("green", "green"), ("blue", "blue")]
USAGES = {0: "generic", 1: "pixel count", 2: "name", 5: "min-max", 6: "red", 7: "green", 8: "blue"}  # GFU_*


@lru_cache(maxsize=1)
def libgdal() -> ctypes.CDLL:
    """The libgdal rasterio's wheel bundles (else the system's), with the signatures of the calls used here."""
    package = Path(rasterio.__file__).parent
    found = sorted([*package.parent.glob("rasterio.libs/libgdal*"), *package.glob(".dylibs/libgdal*"),
                    *package.glob(".libs/libgdal*")])
    name = str(found[0]) if found else ctypes.util.find_library("gdal")
    if name is None:
        pytest.skip("no libgdal to call (rasterio's wheels bundle one)")
    lib = ctypes.CDLL(name)
    handle, text = ctypes.c_void_p, ctypes.c_char_p
    for function, restype, argtypes in [
            ("GDALOpen", handle, [text, ctypes.c_int]), ("GDALClose", None, [handle]),
            ("GDALGetMetadata", handle, [handle, text]), ("GDALGetRasterBand", handle, [handle, ctypes.c_int]),
            ("GDALGetRasterCategoryNames", ctypes.POINTER(text), [handle]), ("GDALGetDefaultRAT", handle, [handle]),
            ("GDALRATGetRowCount", ctypes.c_int, [handle]), ("GDALRATGetColumnCount", ctypes.c_int, [handle]),
            ("GDALRATGetNameOfCol", text, [handle, ctypes.c_int]),
            ("GDALRATGetUsageOfCol", ctypes.c_int, [handle, ctypes.c_int]),
            ("GDALRATGetValueAsString", text, [handle, ctypes.c_int, ctypes.c_int]),
            ("GDALComputeRasterStatistics", ctypes.c_int, [handle, ctypes.c_int, *[ctypes.c_void_p] * 6])]:
        getattr(lib, function).restype, getattr(lib, function).argtypes = restype, argtypes
    lib.GDALAllRegister()
    return lib


def gdal_band(path: Path) -> SimpleNamespace:
    """Band 1 of the raster at ``path`` as GDAL reads it: its category names, and its attribute table's columns
    (name, usage) and rows (values as strings); empty where it has none."""
    lib = libgdal()
    dataset = lib.GDALOpen(os.fsencode(path), 0)
    assert dataset, f"GDAL cannot open {path}"
    try:
        band = lib.GDALGetRasterBand(dataset, 1)
        lib.GDALGetMetadata(dataset, None)  # GTiff reads its .aux.xml on a call like this (any GIS makes one) only
        names = lib.GDALGetRasterCategoryNames(band)
        categories: list[str] = []
        while names and names[len(categories)] is not None:  # a NULL-terminated list of strings
            categories.append(names[len(categories)].decode())
        table = lib.GDALGetDefaultRAT(band)
        if not table:
            return SimpleNamespace(categories=categories, columns=[], rows=[])
        count = lib.GDALRATGetColumnCount(table)
        columns = [(lib.GDALRATGetNameOfCol(table, column).decode(),
                    USAGES.get(lib.GDALRATGetUsageOfCol(table, column))) for column in range(count)]
        rows = [[lib.GDALRATGetValueAsString(table, row, column).decode() for column in range(count)]
                for row in range(lib.GDALRATGetRowCount(table))]
        return SimpleNamespace(categories=categories, columns=columns, rows=rows)
    finally:
        lib.GDALClose(dataset)


def compute_statistics(path: Path) -> None:
    """Have GDAL compute band 1's statistics of the raster at ``path``, as QGIS does for a histogram or a stretch:
    GDAL adds them to the raster's ``.aux.xml`` when it closes the raster."""
    lib = libgdal()
    dataset = lib.GDALOpen(os.fsencode(path), 0)
    assert dataset, f"GDAL cannot open {path}"
    try:
        assert lib.GDALComputeRasterStatistics(lib.GDALGetRasterBand(dataset, 1), 0, *[None] * 6) == 0  # CE_None
    finally:
        lib.GDALClose(dataset)


def class_map(path: Path, transform: Affine = CELLS) -> Path:
    """A 16 × 16 class map COG as a scene's map is written (its colour table, its names in tag class_names)."""
    classes = np.arange(16 * 16, dtype=np.uint8).reshape(1, 16, 16) % len(NAMES)
    write_cog(path, [classes], RasterLayout(16, 16, 1, "uint8", 255, CRS.from_epsg(32631), transform, "mode",
                                            tags={"class_names": json.dumps(NAMES)}, colormap=COLOURS, blocksize=16))
    return path


def palette(style: Path) -> list[tuple[str, str, str, str]]:
    """(value, label, colour, alpha) of each entry of the paletted renderer of the QGIS style at ``style``."""
    root = ET.parse(style).getroot()
    assert root.tag == "qgis" and root.get("version", "").startswith("3.")
    [renderer] = root.iter("rasterrenderer")
    assert (renderer.get("type"), renderer.get("band")) == ("paletted", "1")
    return [(entry.get("value"), entry.get("label"), entry.get("color"), entry.get("alpha"))
            for entry in renderer.find("colorPalette")]


def test_gdal_reads_category_names_and_an_attribute_table_from_the_sidecar(tmp_path: Path) -> None:
    path = class_map(tmp_path / "scene_classes.tif")
    assert gdal_band(path).categories == [] and gdal_band(path).rows == []  # a GeoTIFF holds neither itself
    write_categories(Path(f"{path}.aux.xml"), NAMES, COLOURS, np.array([64, 64, 64, 64]), [0.64, 0.6, 1.005, 2e6])
    band = gdal_band(path)
    assert band.categories == NAMES
    assert band.columns == [*RGB_COLUMNS, ("cells", "pixel count"), ("hectares", "generic")]
    assert band.rows == [["0", "forest", "34", "139", "34", "64", "0.64"],
                         ["1", "river", "30", "144", "255", "64", "0.6"],
                         ["2", "road", "128", "128", "128", "64", "1"],  # 1.005 to 2 decimals, as in the area table
                         ["3", NAMES[3], "220", "20", "60", "64", "2000000"]]
    with rasterio.open(path) as src:  # the pixels, colour table and tags are the GeoTIFF's as before
        assert src.colormap(1)[3] == COLOURS[3] and json.loads(src.tags()["class_names"]) == NAMES
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["scene_classes.tif", "scene_classes.tif.aux.xml"]


def test_unknown_areas_leave_the_hectares_column_out_and_a_nan_area_stays_nan(tmp_path: Path) -> None:
    path = class_map(tmp_path / "classes.tif")
    write_categories(Path(f"{path}.aux.xml"), NAMES, COLOURS, [1, 2, 3, 4], None)
    assert gdal_band(path).columns == [*RGB_COLUMNS, ("cells", "pixel count")]
    write_categories(Path(f"{path}.aux.xml"), NAMES, COLOURS, [1, 2, 3, 4], [1.0, float("nan"), 0.0, 2.5])
    assert [row[-1] for row in gdal_band(path).rows][:2] == ["1", "nan"]
    with pytest.raises(ValueError, match="3 values of cells for 4 classes"):
        write_categories(tmp_path / "x.aux.xml", NAMES, COLOURS, [1, 2, 3], None)
    with pytest.raises(ValueError, match=r"class index 3 has no colour in the colour table \(indexes \[0, 1, 2\]\)"):
        write_style(tmp_path / "x.qml", NAMES, {index: COLOURS[index] for index in range(3)})
    assert not (tmp_path / "x.aux.xml").exists() and not (tmp_path / "x.qml").exists()


def test_the_qgis_style_is_a_paletted_renderer_with_the_names_and_colours_of_the_table(tmp_path: Path) -> None:
    style = tmp_path / "scene_classes.qml"
    write_style(style, NAMES, COLOURS)
    assert style.read_text(encoding="utf-8").startswith("<!DOCTYPE qgis PUBLIC 'http://mrcc.com/qgis.dtd' 'SYSTEM'>")
    assert palette(style) == PALETTE


def test_a_full_disk_names_the_final_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("rsnet.files.os.replace", full)
    for write, final in [(lambda path: write_categories(path, NAMES, COLOURS, None, None, tmp_path / "a.aux.xml"),
                          "a.aux.xml"), (lambda path: write_style(path, NAMES, COLOURS, tmp_path / "a.qml"), "a.qml")]:
        with pytest.raises(DiskFullError, match=f"while writing {tmp_path / final}"):
            write(tmp_path / ".staged.tmp")
    assert list(tmp_path.iterdir()) == []


def test_the_mosaic_band_carries_the_category_names_colours_and_a_style(tmp_path: Path) -> None:
    west = class_map(tmp_path / "west_classes.tif")
    east = class_map(tmp_path / "east_classes.tif", CELLS @ Affine.translation(16, 0))
    [mosaic] = write_mosaics([west, east], tmp_path)
    band = gdal_band(mosaic)
    assert band.categories == NAMES and band.columns == RGB_COLUMNS
    assert band.rows[3] == ["3", NAMES[3], "220", "20", "60"]
    with rasterio.open(mosaic) as vrt:
        assert {index: vrt.colormap(1)[index] for index in COLOURS} == COLOURS
    assert palette(tmp_path / "mosaic_classes.qml") == PALETTE
