"""A map's output files (rsnet.mapping.cog, .areas, .mosaic): Cloud-Optimised GeoTIFFs streamed from row blocks
(layout, pixels, mode and NaN-aware average overviews, colour table and tags kept, bounded memory, identical bytes,
a full disk), the per-class area table, and the VRT mosaic of a folder's class maps."""

from __future__ import annotations

import csv
import json
import math
import tracemalloc
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import rasterio
from rasterio.crs import CRS
from rasterio.enums import Compression
from rasterio.transform import Affine

from rsnet.files import DiskFullError, disk_full_named
from rsnet.mapping import areas as areas_module
from rsnet.mapping import cog as cog_module
from rsnet.data.ground import GroundMeasure
from rsnet.mapping.areas import AreaTally, write_area_table
from rsnet.mapping.cog import RasterLayout, write_cog
from rsnet.mapping.mosaic import write_mosaics

NAMES = ["forest", "river", "road", "town"]
COLOURS = {0: (34, 139, 34, 255), 1: (30, 144, 255, 255), 2: (128, 128, 128, 255), 3: (220, 20, 60, 255),
           255: (0, 0, 0, 0)}
UTM = CRS.from_epsg(32631)
CELLS = Affine(10.0, 0.0, 500_000.0, 0.0, -10.0, 4_000_000.0)  # 10 m cells


def class_layout(height: int, width: int, **changes) -> RasterLayout:
    """The layout of a class map of ``height`` × ``width`` cells (tiles of 64: overviews on small rasters)."""
    settings = dict(height=height, width=width, count=1, dtype="uint8", nodata=255, crs=UTM, transform=CELLS,
                    resampling="mode", band_descriptions=("class index (its name: tag class_names)",),
                    tags={"class_names": json.dumps(NAMES)}, colormap=COLOURS, blocksize=64)
    return RasterLayout(**{**settings, **changes})


def probability_layout(height: int, width: int) -> RasterLayout:
    return RasterLayout(height, width, len(NAMES), "float32", float("nan"), UTM, CELLS, "average", tuple(NAMES),
                        blocksize=64)


def split(pixels: np.ndarray, rows: list[int]) -> Iterator[np.ndarray]:
    """(bands, H, W) ``pixels`` as blocks of ``rows`` rows each, from the top."""
    assert sum(rows) == pixels.shape[1]
    top = 0
    for count in rows:
        yield pixels[:, top:top + count]
        top += count


def random_classes(height: int, width: int, seed: int = 0) -> np.ndarray:
    classes = np.random.default_rng(seed).integers(0, len(NAMES), (1, height, width)).astype(np.uint8)
    classes[0, :5, :7] = 255
    return classes


def leftovers(folder: Path) -> list[str]:
    """Hidden files (staging, temporary) left in ``folder``."""
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("."))


# --- Cloud-Optimised GeoTIFFs ---------------------------------------------------------------------------------------

def test_cog_is_tiled_with_overviews_and_keeps_pixels_colours_and_tags(tmp_path: Path) -> None:
    classes = random_classes(150, 200)
    path = tmp_path / "scene_classes.tif"
    write_cog(path, split(classes, [7, 50, 0, 93]), class_layout(150, 200))
    with rasterio.open(path) as src:
        assert src.block_shapes == [(64, 64)] and src.profile["tiled"]
        assert src.overviews(1) == [2, 4]  # 150 × 200 -> 75 × 100 -> 38 × 50, the first level that fits a tile
        assert src.tags(ns="IMAGE_STRUCTURE")["LAYOUT"] == "COG"
        assert src.compression == Compression.deflate
        assert "PREDICTOR" not in src.tags(ns="IMAGE_STRUCTURE")  # none for a class map: it would be larger
        np.testing.assert_array_equal(src.read(), classes)
        assert src.nodata == 255 and src.crs == UTM and src.transform == CELLS
        assert {index: src.colormap(1)[index] for index in COLOURS} == COLOURS
        assert src.descriptions == ("class index (its name: tag class_names)",)
        assert json.loads(src.tags()["class_names"]) == NAMES
    assert leftovers(tmp_path) == []


def test_cog_overviews_take_the_majority_class_and_leave_nodata_out(tmp_path: Path) -> None:
    majority = np.random.default_rng(1).integers(0, len(NAMES), (64, 64)).astype(np.uint8)
    classes = np.repeat(np.repeat(majority, 2, axis=0), 2, axis=1)
    classes[0::2, 0::2] = (majority + 1) % len(NAMES)  # one cell of each 2 × 2 group another class
    classes[0:2, 0:2] = 255
    classes[1, 1] = 3  # three nodata cells and one of class 3: class 3
    majority[0, 0] = 3
    path = tmp_path / "classes.tif"
    write_cog(path, split(classes[None], [128]), class_layout(128, 128))
    with rasterio.open(path, overview_level=0) as overview:
        np.testing.assert_array_equal(overview.read(1), majority)


def test_cog_average_overviews_leave_nan_out(tmp_path: Path) -> None:
    probabilities = np.random.default_rng(2).random((len(NAMES), 128, 128)).astype(np.float32)
    probabilities[:, 0:2, 0:2] = np.nan  # a group without data: NaN
    probabilities[:, 2, 2] = np.nan  # one cell without data: the mean of the other three
    path = tmp_path / "probabilities.tif"
    write_cog(path, split(probabilities, [30, 98]), probability_layout(128, 128))
    groups = probabilities.astype(np.float64).reshape(len(NAMES), 64, 2, 64, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of the empty group
        expected = np.nanmean(groups, axis=(2, 4))
    with rasterio.open(path) as src:
        assert math.isnan(src.nodata) and src.descriptions == tuple(NAMES)
        assert src.tags(ns="IMAGE_STRUCTURE")["PREDICTOR"] == "3"  # floating-point predictor
        np.testing.assert_array_equal(src.read(), probabilities)
    with rasterio.open(path, overview_level=0) as overview:
        found = overview.read()
    assert np.isnan(found[:, 0, 0]).all() and np.isfinite(found[:, 1:, 1:]).all()
    np.testing.assert_allclose(found, expected, atol=1e-6)


def test_cog_draws_one_block_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "classes.tif"
    drawn: list[weakref.ref] = []

    def blocks() -> Iterator[np.ndarray]:
        for index in range(40):
            assert all(ref() is None for ref in drawn[:-1]), "blocks drawn earlier are still held"  # freed by
            # their reference count: arrays hold no cycles
            if index:
                assert leftovers(tmp_path), "staging starts before the last block"
            block = np.full((1, 8, 96), index % len(NAMES), np.uint8)
            drawn.append(weakref.ref(block))
            yield block
            del block

    write_cog(path, blocks(), class_layout(320, 96))
    with rasterio.open(path) as src:
        np.testing.assert_array_equal(src.read(1)[::8, 0], np.arange(40) % len(NAMES))


def test_cog_memory_is_bounded_by_a_strip_not_the_raster(tmp_path: Path) -> None:
    height, width = 2048, 2048  # 4 MiB of classes, in blocks of 64 KiB

    def blocks() -> Iterator[np.ndarray]:
        for top in range(0, height, 32):
            yield np.full((1, 32, width), top // 32 % len(NAMES), np.uint8)

    tracemalloc.start()
    try:
        write_cog(tmp_path / "classes.tif", blocks(), class_layout(height, width))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < height * width / 4, f"{peak} bytes at the peak for a {height * width}-byte raster"


def test_cog_bytes_are_the_same_for_the_same_pixels(tmp_path: Path) -> None:
    probabilities = np.random.default_rng(3).random((len(NAMES), 100, 90)).astype(np.float32)
    probabilities[:, 40:60] = np.nan
    first, second = tmp_path / "a" / "p.tif", tmp_path / "b" / "p.tif"
    first.parent.mkdir()
    second.parent.mkdir()
    write_cog(first, split(probabilities, [100]), probability_layout(100, 90))
    write_cog(second, split(probabilities, [13, 13, 74]), probability_layout(100, 90))
    assert first.read_bytes() == second.read_bytes()


def test_cog_without_coordinates(tmp_path: Path) -> None:
    classes = random_classes(70, 70)
    path = tmp_path / "picture_classes.tif"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_cog(path, split(classes, [70]), class_layout(70, 70, crs=None, transform=Affine.identity()))
    with rasterio.open(path) as src:
        assert src.crs is None
        np.testing.assert_array_equal(src.read(), classes)


def test_cog_on_a_full_disk_names_the_final_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    classes = random_classes(100, 100)
    final = tmp_path / "scene_classes.tif"
    output = tmp_path / ".scene_classes.tif.tmp"
    output.symlink_to("/dev/full")  # the COG itself cannot be written
    with pytest.raises(DiskFullError, match="scene_classes.tif") as caught:
        write_cog(output, split(classes, [100]), class_layout(100, 100), error_name=final)
    assert caught.value.path == str(final)
    assert leftovers(tmp_path) == [] and not final.exists()

    monkeypatch.setattr(cog_module, "secrets", SimpleNamespace(token_hex=lambda _: "f00d"))
    staging = tmp_path / ".scene_classes.tif.tmp.f00d.staging.tif"
    staging.symlink_to("/dev/full")  # the staged rows cannot be written: GDAL does not raise
    with pytest.raises(DiskFullError) as caught:
        write_cog(output, split(classes, [100]), class_layout(100, 100), error_name=final)
    assert caught.value.path == str(final)
    assert leftovers(tmp_path) == []


def test_cog_errors(tmp_path: Path) -> None:
    classes = random_classes(100, 100)
    blocked = tmp_path / "in_the_way.tif"
    blocked.mkdir()  # a folder where the file goes: GDAL cannot create it
    with pytest.raises(ValueError, match=r"cannot write .*in_the_way.tif: GDAL did not write it whole \(") as caught:
        write_cog(blocked, split(classes, [100]), class_layout(100, 100))
    assert "\n" not in str(caught.value)

    def failing() -> Iterator[np.ndarray]:
        yield classes[:, :50]
        raise RuntimeError("the model failed")

    path = tmp_path / "classes.tif"
    with pytest.raises(RuntimeError, match="the model failed"):  # the caller's error, as it is
        write_cog(path, failing(), class_layout(100, 100))
    with pytest.raises(ValueError, match="the blocks hold 50 rows and the raster 100"):
        write_cog(path, split(classes[:, :50], [50]), class_layout(100, 100))
    with pytest.raises(ValueError, match="more rows than the raster's 100"):
        write_cog(path, split(np.concatenate([classes, classes], axis=1), [60, 140]), class_layout(100, 100))
    with pytest.raises(ValueError, match=r"blocks must be \(1, rows, 100\) arrays of uint8"):
        write_cog(path, split(classes.astype(np.int64), [100]), class_layout(100, 100))
    with pytest.raises(ValueError, match="blocksize=100"):
        class_layout(100, 100, blocksize=100)
    with pytest.raises(ValueError, match="resampling='cubic'"):
        class_layout(100, 100, resampling="cubic")
    assert not path.exists() and leftovers(tmp_path) == []


# --- the area table ---------------------------------------------------------------------------------------------------

def hand_tally() -> AreaTally:
    """A 3 × 3 grid of 10-pixel cells over a 25 × 28 pixel scene: the last row covers 5 pixel rows, the last
    column 8 pixel columns; added in two blocks."""
    classes = np.array([[0, 1, 255],
                        [1, 1, 2],
                        [0, 255, 2]], np.uint8)
    rows, cols = np.array([10, 10, 5]), np.array([10, 10, 8])
    tally = AreaTally(len(NAMES), 255)
    tally.add(classes[:2], rows[:2], cols)
    tally.add(classes[2:], rows[2:], cols)
    return tally


def read_table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_area_tally_weights_edge_cells_by_their_pixels_inside_the_scene() -> None:
    tally = hand_tally()
    assert tally.cells.tolist() == [2, 3, 2, 0]
    assert tally.pixels.tolist() == [100 + 5 * 10, 3 * 100, 10 * 8 + 5 * 8, 0]
    with pytest.raises(ValueError, match="class index 7 outside 0..3"):
        tally.add(np.array([[7]], np.uint8), np.array([1]), np.array([1]))


def test_area_table_in_a_projected_crs(tmp_path: Path) -> None:
    path = tmp_path / "scene_areas.csv"
    tally = hand_tally()
    assert tally.hectares is None  # added without ground areas
    write_area_table(path, NAMES, tally)
    assert [row["hectares"] for row in read_table(path)] == ["", "", "", ""]
    tally = AreaTally(len(NAMES), 255)
    classes = np.array([[0, 1, 255], [1, 1, 2], [0, 255, 2]], np.uint8)
    tally.add(classes, np.array([10, 10, 5]), np.array([10, 10, 8]), np.full((3, 3), 100.0))  # 10 m pixels
    write_area_table(path, NAMES, tally)
    rows = read_table(path)
    assert [row["class"] for row in rows] == NAMES  # every class, in index order, zeros included
    assert [row["cells"] for row in rows] == ["2", "3", "2", "0"]
    assert [row["share"] for row in rows] == ["0.263158", "0.526316", "0.210526", "0.000000"]  # of 570 pixels
    assert [row["hectares"] for row in rows] == ["1.50", "3.00", "1.20", "0.00"]
    assert sum(float(row["share"]) for row in rows) == pytest.approx(1, abs=1e-5)
    assert path.read_text().splitlines()[0] == "class,cells,share,hectares"
    write_area_table(path, NAMES, AreaTally(len(NAMES), 255))  # nothing mapped: no shares
    assert [(row["cells"], row["share"]) for row in read_table(path)] == [("0", "")] * len(NAMES)


def scene_transform(crs: CRS, latitude: float, pixel_m: float = 0.6) -> Affine:
    """A north-up transform whose pixels are about ``pixel_m`` ground metres, with its top-left corner at 9° E and
    ``latitude`` (in UTM zone 32 N, Web Mercator or degrees)."""
    import pyproj

    x, y = pyproj.Transformer.from_crs("EPSG:4326", crs.to_wkt(), always_xy=True).transform(9.0, latitude)
    if crs.is_geographic:
        return Affine(pixel_m / (111_320 * math.cos(math.radians(latitude))), 0, x, 0, -pixel_m / 110_574, y)
    scale = 1 / math.cos(math.radians(latitude)) if crs.to_epsg() == 3857 else 1.0
    return Affine(pixel_m * scale, 0, x, 0, -pixel_m * scale, y)


def geodesic_hectares(crs: CRS, transform: Affine, cols: tuple[int, int], rows: tuple[int, int]) -> float:
    """The area on the ellipsoid of the pixels ``cols`` × ``rows`` (first, stop) of a raster: its outline, 100
    points a side, as a geodesic polygon (pyproj.Geod)."""
    import pyproj

    side = np.linspace(0, 1, 100, endpoint=False)
    (c0, c1), (r0, r1) = cols, rows
    outline_cols = np.concatenate([c0 + side * (c1 - c0), np.full(100, c1), c1 - side * (c1 - c0), np.full(100, c0)])
    outline_rows = np.concatenate([np.full(100, r0), r0 + side * (r1 - r0), np.full(100, r1), r1 - side * (r1 - r0)])
    source = pyproj.CRS.from_wkt(crs.to_wkt())
    lon, lat = pyproj.Transformer.from_crs(source, source.geodetic_crs, always_xy=True).transform(
        *(transform @ (outline_cols, outline_rows)))
    return abs(source.get_geod().polygon_area_perimeter(lon, lat)[0]) / 10_000


@pytest.mark.parametrize("epsg", [3857, 4326, 32632])
@pytest.mark.parametrize("latitude", [0.0, -22.0, 50.0, 70.0])
def test_hectares_are_ground_hectares_in_every_crs(epsg: int, latitude: float) -> None:
    """A 1200 × 1000 px scene of ~0.6 m pixels: each class's hectares within 0.5 % of the geodesic area of its
    pixels, whatever the CRS (in Web Mercator at 50° N a projected m² is 2.4 ground m²)."""
    crs = CRS.from_epsg(epsg)
    transform = scene_transform(crs, latitude)
    measure = GroundMeasure.of(crs, transform)
    step, rows, cols = 100, np.full(10, 100), np.full(12, 100)
    centres_cols, centres_rows = np.arange(12) * step + 50.0, np.arange(10) * step + 50.0
    classes = np.zeros((10, 12), np.uint8)
    classes[:, 7:] = 1  # class 1: the 500 px on the right
    tally = AreaTally(2, 255)
    tally.add(classes, rows, cols, measure.pixel_area_m2(centres_cols[None, :], centres_rows[:, None]))
    expected = [geodesic_hectares(crs, transform, (0, 700), (0, 1000)),
                geodesic_hectares(crs, transform, (700, 1200), (0, 1000))]
    assert tally.hectares == pytest.approx(expected, rel=0.005)
    assert 40 < sum(expected) < 46  # 1200 × 1000 pixels of about 0.6 m: 43.2 ha


@pytest.mark.parametrize("epsg", [3857, 4326, 32632])
@pytest.mark.parametrize("latitude", [0.0, -22.0, 50.0, 70.0])
def test_scale_bar_is_ground_metres_at_the_centre(epsg: int, latitude: float) -> None:
    """A bar a fifth of the scene's width at its centre: its length in ground metres within 1 % of the geodesic
    distance between its ends."""
    import pyproj

    crs = CRS.from_epsg(epsg)
    transform = scene_transform(crs, latitude)
    per_unit = GroundMeasure.of(crs, transform).metres_per_unit_east(600, 500)
    units = 240 * transform.a
    source = pyproj.CRS.from_wkt(crs.to_wkt())
    ends = pyproj.Transformer.from_crs(source, source.geodetic_crs, always_xy=True).transform(
        *(transform @ (np.array([480.0, 720.0]), np.array([500.0, 500.0]))))
    _, _, ground = source.get_geod().inv(ends[0][0], ends[1][0], ends[0][1], ends[1][1])
    assert per_unit * units == pytest.approx(ground, rel=0.01)
    assert per_unit * units == pytest.approx(144, rel=0.01)  # 240 pixels of 0.6 m


def test_no_ground_measure_without_a_crs_and_feet_count_as_feet() -> None:
    assert GroundMeasure.of(None, Affine.identity()) is None
    feet = CRS.from_epsg(2227)  # California zone 3, US survey feet: 2 ft pixels
    transform = Affine(2.0, 0.0, 6_000_000.0, 0.0, -2.0, 2_100_000.0)
    area = GroundMeasure.of(feet, transform).pixel_area_m2(np.array([0.5]), np.array([0.5]))
    assert area[0] == pytest.approx(4 * (1200 / 3937) ** 2, rel=1e-3)  # Lambert conformal: scale ~1 in the zone


def test_pixels_off_the_earth_have_no_hectares(tmp_path: Path) -> None:
    measure = GroundMeasure.of(CRS.from_epsg(4326), Affine(0.001, 0, 0.0, 0, -0.001, 95.0))  # latitude 95°
    tally = AreaTally(len(NAMES), 255)
    tally.add(np.zeros((1, 1), np.uint8), np.array([10]), np.array([10]), measure.pixel_area_m2(np.array([[5.0]]),
                                                                                                  np.array([[5.0]])))
    write_area_table(tmp_path / "areas.csv", NAMES, tally)
    assert [row["hectares"] for row in read_table(tmp_path / "areas.csv")] == ["", "0.00", "0.00", "0.00"]


def test_area_table_on_a_full_disk_names_the_final_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    @contextmanager
    def full_disk(path: Path, mode: str = "wb", errors: str | None = None) -> Iterator:
        with disk_full_named(path), open("/dev/full", mode) as handle:
            yield handle

    monkeypatch.setattr(areas_module, "atomic_write", full_disk)
    final = tmp_path / "scene_areas.csv"
    with pytest.raises(DiskFullError) as caught:
        write_area_table(tmp_path / ".scene_areas.csv.tmp", NAMES, hand_tally(), error_name=final)
    assert caught.value.path == str(final)


# --- the mosaic -------------------------------------------------------------------------------------------------------

def write_map(path: Path, classes: np.ndarray, transform: Affine, crs: CRS | None = UTM,
              names: list[str] = NAMES) -> Path:
    """A class map COG of (H, W) ``classes``, as a scene's map is written."""
    layout = class_layout(*classes.shape, crs=crs, transform=transform, tags={"class_names": json.dumps(names)})
    write_cog(path, split(classes[None], [classes.shape[0]]), layout)
    return path


def value_at(src, x: float, y: float) -> int:
    row, col = src.index(x, y)
    return int(src.read(1, window=((row, row + 1), (col, col + 1)))[0, 0])


def test_mosaic_of_two_scenes_with_a_gap(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.mkdir()
    west = np.full((20, 30), 1, np.uint8)
    west[0, 0] = 255  # the scene's own nodata
    east = np.full((20, 30), 2, np.uint8)
    first = write_map(maps / "west_classes.tif", west, CELLS)
    second = write_map(maps / "east_classes.tif", east, CELLS @ Affine.translation(40, 5))  # 10 cells to the east
    written = write_mosaics([first, second], maps)
    assert written == [maps / "mosaic_classes.vrt"]
    assert 'relativeToVRT="1">west_classes.tif<' in written[0].read_text()
    with rasterio.open(written[0]) as vrt:
        assert vrt.crs == UTM and vrt.res == (10.0, 10.0)
        assert vrt.bounds == (500_000.0, 4_000_000.0 - 25 * 10, 500_000.0 + 70 * 10, 4_000_000.0)
        assert value_at(vrt, 500_005.0, 3_999_895.0) == 1  # inside the west scene
        assert value_at(vrt, 500_405.0, 3_999_895.0) == 2  # inside the east scene
        assert value_at(vrt, 500_350.0, 3_999_895.0) == 255  # the gap between them
        assert value_at(vrt, 500_005.0, 3_999_995.0) == 255  # the west scene's own nodata
        assert vrt.nodata == 255
        assert {index: vrt.colormap(1)[index] for index in COLOURS} == COLOURS
        assert json.loads(vrt.tags()["class_names"]) == NAMES
        assert vrt.descriptions == ("class index (its name: tag class_names)",)


def test_mosaic_resamples_maps_of_coarser_cells(tmp_path: Path) -> None:
    fine = write_map(tmp_path / "fine_classes.tif", np.full((10, 10), 0, np.uint8), CELLS)
    coarse_cells = np.array([[1, 2], [3, 1]], np.uint8).repeat(5, axis=0).repeat(5, axis=1)  # 20 m cells
    coarse = write_map(tmp_path / "coarse_classes.tif", coarse_cells,
                       Affine(20.0, 0.0, 500_100.0, 0.0, -20.0, 4_000_000.0))
    [path] = write_mosaics([fine, coarse], tmp_path / "mosaic", stem="region")
    assert path == tmp_path / "mosaic" / "region.vrt"
    assert 'relativeToVRT="1">../coarse_classes.tif<' in path.read_text()
    with rasterio.open(path) as vrt:
        assert vrt.res == (10.0, 10.0) and vrt.shape == (20, 30)
        assert value_at(vrt, 500_005.0, 3_999_995.0) == 0
        assert value_at(vrt, 500_105.0, 3_999_995.0) == 1  # the coarse map's top-left cell, at 10 m
        assert value_at(vrt, 500_295.0, 3_999_995.0) == 2  # its top-right cell
        assert value_at(vrt, 500_105.0, 3_999_805.0) == 3  # its bottom-left cell
        assert value_at(vrt, 500_005.0, 3_999_805.0) == 255  # below the fine map


def test_mosaic_per_crs_and_maps_without_one_left_out(tmp_path: Path) -> None:
    zone31 = write_map(tmp_path / "a_classes.tif", np.full((8, 8), 1, np.uint8), CELLS)
    zone32 = write_map(tmp_path / "b_classes.tif", np.full((8, 8), 2, np.uint8), CELLS, crs=CRS.from_epsg(32632))
    custom = CRS.from_proj4("+proj=tmerc +lat_0=0 +lon_0=7 +k=1 +x_0=0 +y_0=0 +ellps=GRS80 +units=m +no_defs")
    local = write_map(tmp_path / "c_classes.tif", np.full((8, 8), 3, np.uint8), CELLS, crs=custom)
    picture = write_map(tmp_path / "d_classes.tif", np.full((8, 8), 0, np.uint8), Affine.identity(), crs=None)
    written = write_mosaics([zone31, picture, zone32, local], tmp_path)
    assert [path.name for path in written[:2]] == ["mosaic_classes_EPSG-32631.vrt", "mosaic_classes_EPSG-32632.vrt"]
    assert len(written) == 3 and written[2].name.startswith("mosaic_classes_crs-")
    for path, crs, value in zip(written, [UTM, CRS.from_epsg(32632), custom], [1, 2, 3]):
        with rasterio.open(path) as vrt:
            assert vrt.crs == crs and vrt.read(1).tolist() == [[value] * 8] * 8
    assert "d_classes.tif" not in "".join(path.read_text() for path in written)
    assert write_mosaics([picture], tmp_path / "none") == []


def test_mosaic_refuses_maps_of_other_classes(tmp_path: Path) -> None:
    first = write_map(tmp_path / "a_classes.tif", np.zeros((8, 8), np.uint8), CELLS)
    other = write_map(tmp_path / "b_classes.tif", np.zeros((8, 8), np.uint8), CELLS, names=["water", "land"])
    with pytest.raises(ValueError, match=r"a_classes.tif and .*b_classes.tif map different classes") as caught:
        write_mosaics([first, other], tmp_path)
    assert "\n" not in str(caught.value)
    assert not list(tmp_path.glob("*.vrt"))
