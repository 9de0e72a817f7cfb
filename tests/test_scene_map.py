"""Maps of whole scenes (rsnet.mapping, rsnet-predict map=): a mosaic of real images classified window by window
gives the classes of its tiles classified one by one, on the scene's coordinates; overlapping windows are averaged;
multispectral rasters; one-line errors; bounded memory; the benchmark's smoke run."""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import rasterio
import torch
from helpers import MINI_ROOT, REPO, command_in_process
from PIL import Image
from rasterio.transform import Affine
from test_map_categories import compute_statistics, gdal_band, palette

from rsnet.checkpoint import save_checkpoint
from rsnet.data.raster import Bands, open_raster
from rsnet.inference import load_predictor, read_image
from rsnet.mapping.plan import plan_scene, scene_window
from rsnet.mapping.region import map_scene

CLASSES = sorted(path.name for path in (MINI_ROOT / "Images").iterdir())[:8]
TILE = 128  # the sample's images: 128 px JPEGs


def north_up(west: float, north: float, pixel: float) -> Affine:
    """The transform of a north-up raster whose top-left corner is (``west``, ``north``), ``pixel`` units a pixel."""
    return Affine(pixel, 0.0, west, 0.0, -pixel, north)


ORIGIN = north_up(500_000.0, 4_000_000.0, 0.3)  # UTM zone 11N, 0.3 m pixels


def write_geotiff(path: Path, pixels: np.ndarray, transform: Affine = ORIGIN, crs: str = "EPSG:32611") -> Path:
    """(H, W, C) ``pixels`` as a GeoTIFF (uncompressed, lossless)."""
    with rasterio.open(path, "w", driver="GTiff", height=pixels.shape[0], width=pixels.shape[1],
                       count=pixels.shape[2], dtype=pixels.dtype.name, crs=crs, transform=transform) as dst:
        dst.write(np.moveaxis(pixels, -1, 0))
    return path


@pytest.fixture(scope="module")
def tiles() -> np.ndarray:
    """8 x 8 real images, (8, 8, 128, 128, 3): row i holds the first 8 images of class CLASSES[i]."""
    def first(name: str) -> list[Path]:
        return sorted((MINI_ROOT / "Images" / name).glob("*.jpg"))[:8]

    return np.stack([np.stack([np.asarray(Image.open(path).convert("RGB")) for path in first(name)])
                     for name in CLASSES])


@pytest.fixture(scope="module")
def scene(tiles: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The tiles as one 1024 x 1024 mosaic: a GeoTIFF (EPSG:32611, 0.3 m), a plain PNG, and each tile as a PNG."""
    folder = tmp_path_factory.mktemp("scene")
    mosaic = tiles.transpose(0, 2, 1, 3, 4).reshape(8 * TILE, 8 * TILE, 3)
    (folder / "tiles").mkdir()
    for row in range(8):
        for col in range(8):
            Image.fromarray(tiles[row, col]).save(folder / "tiles" / f"{row}_{col}.png")
    Image.fromarray(mosaic).save(folder / "plain.png")
    return SimpleNamespace(mosaic=mosaic, tif=write_geotiff(folder / "mosaic.tif", mosaic), png=folder / "plain.png",
                           tiles=folder / "tiles")


@pytest.fixture(scope="module")
def checkpoint(tiles: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A baseline test_resnet at 128 px whose classifier is the class centroids of the tiles' features, so that its
    answers differ from tile to tile; a training image is 128 px, 38.4 m."""
    from rsnet.models import build_model

    torch.manual_seed(0)
    model = build_model("baseline", "test_resnet", len(CLASSES)).eval()
    mean, std = [0.45, 0.45, 0.45], [0.25, 0.25, 0.25]
    images = torch.from_numpy(tiles.reshape(-1, TILE, TILE, 3)).permute(0, 3, 1, 2).float() / 255
    inputs = (images - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    classifier, features = model.cam_classifiers()["main"], []
    hook = classifier.register_forward_pre_hook(lambda module, args: features.append(args[0]))
    with torch.no_grad():
        model(inputs)
    hook.remove()
    centred = features[0] - features[0].mean(0)
    centroids = centred.reshape(len(CLASSES), 8, -1).mean(1)
    with torch.no_grad():
        classifier.weight.copy_(centroids * 20 / centroids.norm(dim=1, keepdim=True))
        classifier.bias.copy_(-classifier.weight @ features[0].mean(0))
    payload = {"model_config": model.model_config, "model_state": model.state_dict(), "class_names": CLASSES,
               "image_size": TILE, "mean": mean, "std": std, "footprint": {"pixels": 128.0, "metres": 38.4},
               "epoch": 0}
    return save_checkpoint(tmp_path_factory.mktemp("model") / "best.pt", payload)


@pytest.fixture(scope="module")
def predictor(checkpoint: Path):
    return load_predictor(checkpoint, "cpu")


def test_a_mosaic_of_real_images_maps_to_the_classes_of_its_tiles_on_the_scene(predictor, scene, tmp_path) -> None:
    result = map_scene(predictor, scene.tif, tmp_path, window=128, progress=False)
    assert result.grid == (8, 8) and result.windows == 64 and (result.window, result.stride) == (128, 128)
    one_by_one = [[predictor.top_k(read_image(scene.tiles / f"{row}_{col}.png", TILE)[None])[0][0][0]
                   for col in range(8)] for row in range(8)]
    assert [[CLASSES[i] for i in row] for row in result.classes.tolist()] == one_by_one
    assert len({name for row in one_by_one for name in row}) >= 4  # the tiles' answers differ: a real check
    with rasterio.open(scene.tif) as src, rasterio.open(result.classes_path) as classes:
        assert classes.crs == src.crs and classes.transform == src.transform @ Affine.scale(128)
        assert classes.dtypes == ("uint8",) and classes.nodata == 255
        assert classes.tags(ns="IMAGE_STRUCTURE")["LAYOUT"] == "COG" and classes.block_shapes == [(512, 512)]
        assert json.loads(classes.tags()["class_names"]) == CLASSES
        assert (classes.read(1) == result.classes).all()
    with rasterio.open(result.probabilities_path) as probabilities:
        assert probabilities.count == len(CLASSES) and list(probabilities.descriptions) == CLASSES
        assert probabilities.crs.to_epsg() == 32611 and probabilities.transform == ORIGIN @ Affine.scale(128)
        cells = probabilities.read()
    np.testing.assert_allclose(cells.sum(axis=0), 1.0, atol=1e-5)
    tile = predictor.probabilities(read_image(scene.tiles / "3_5.png", TILE)[None])[0].numpy()
    np.testing.assert_allclose(cells[:, 3, 5], tile, atol=1e-5)
    assert result.preview_path == tmp_path / "mosaic_preview.png"
    with Image.open(result.preview_path) as preview:
        assert preview.format == "PNG" and min(preview.size) > 400  # the map over its imagery, and the legend
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "mosaic_areas.csv", "mosaic_classes.qml", "mosaic_classes.tif", "mosaic_classes.tif.aux.xml", "mosaic_map.json",
        "mosaic_preview.png", "mosaic_probabilities.tif"]  # no temporary file, no partial map left


def test_gdal_and_qgis_name_and_colour_the_classes_and_a_rerun_keeps_what_qgis_adds(predictor, scene,
                                                                                    tmp_path: Path) -> None:
    first = map_scene(predictor, scene.tif, tmp_path, window=256, progress=False)
    with open(first.areas_path, newline="") as handle:
        table = list(csv.DictReader(handle))
    with rasterio.open(first.classes_path) as classes:
        colours = [classes.colormap(1)[index][:3] for index in range(len(CLASSES))]
    band = gdal_band(first.classes_path)
    assert band.categories == CLASSES and [row[1] for row in band.rows] == [row["class"] for row in table]
    assert [[int(value) for value in row[2:6]] for row in band.rows] == [
        [*colour, int(row["cells"])] for colour, row in zip(colours, table)]
    assert [float(row[6]) for row in band.rows] == [float(row["hectares"]) for row in table]
    assert palette(tmp_path / "mosaic_classes.qml") == [(str(index), name, "#{:02x}{:02x}{:02x}".format(*colour), "255")
                                                         for index, (name, colour) in enumerate(zip(CLASSES, colours))]
    compute_statistics(first.classes_path)  # GDAL rewrites the sidecar, as when QGIS draws a histogram
    assert "STATISTICS_MEAN" in Path(f"{first.classes_path}.aux.xml").read_text()
    assert map_scene(predictor, scene.tif, tmp_path, window=256, progress=False).skipped
    (tmp_path / "mosaic_classes.qml").unlink()
    assert not map_scene(predictor, scene.tif, tmp_path, window=256, progress=False).skipped  # a file missing
    assert (tmp_path / "mosaic_classes.qml").is_file() and gdal_band(first.classes_path).categories == CLASSES


def test_overlapping_windows_average_the_probabilities_of_every_window_over_a_cell(predictor, scene, tmp_path) -> None:
    result = map_scene(predictor, scene.tif, tmp_path, window=128, stride=64, progress=False)
    assert result.grid == (16, 16) and result.windows == 15 * 15  # cells of 64 px; a window every 64 px
    with rasterio.open(result.probabilities_path) as probabilities:
        cells = probabilities.read()
        assert probabilities.transform == ORIGIN @ Affine.scale(64)

    def window(row: int, col: int) -> np.ndarray:  # the probabilities of the window at these pixels
        pixels = scene.mosaic[row:row + 128, col:col + 128]
        return predictor.probabilities(pixels[None])[0].numpy()

    # cell (3, 5) spans pixels 192..255 x 320..383: the windows starting at rows 128/192 and columns 256/320 hold it
    by_hand = np.mean([window(r, c) for r in (128, 192) for c in (256, 320)], axis=0)
    np.testing.assert_allclose(cells[:, 3, 5], by_hand, atol=1e-5)
    np.testing.assert_allclose(cells[:, 0, 15], window(0, 896), atol=1e-5)  # a corner cell: one window
    assert result.classes[3, 5] == by_hand.argmax()


def test_windows_flush_with_the_right_and_bottom_edges_classify_every_cell(predictor, scene, tmp_path) -> None:
    raster = write_geotiff(tmp_path / "crop.tif", scene.mosaic[:300, :300])
    result = map_scene(predictor, raster, tmp_path / "maps", window=128, progress=False)
    assert result.windows == 9 and result.grid == (3, 3)  # windows at 0, 128 and 172 (flush); ceil(300 / 128) cells
    assert (result.classes != 255).all()
    with rasterio.open(result.probabilities_path) as probabilities:
        cells = probabilities.read()
    # the last cell (pixels 256..299, centre 278): the window flush with the corner alone
    np.testing.assert_allclose(cells[:, 2, 2], predictor.probabilities(scene.mosaic[172:300, 172:300][None])[0].numpy(),
                               atol=1e-5)
    def window(row: int, col: int) -> np.ndarray:
        return predictor.probabilities(scene.mosaic[row:row + 128, col:col + 128][None])[0].numpy()

    # cell 1 (pixels 128..255, centre 192) lies in the windows at 128 and at 172: their mean
    np.testing.assert_allclose(cells[:, 1, 1], np.mean([window(r, c) for r in (128, 172) for c in (128, 172)], 0),
                               atol=1e-5)
    np.testing.assert_allclose(cells[:, 0, 2], window(0, 172), atol=1e-5)


def test_windows_mostly_over_the_scenes_nodata_are_not_classified(predictor, scene, tmp_path) -> None:
    pixels = np.maximum(scene.mosaic, 1)  # no black pixel in the data: GDAL masks one whose every band is nodata
    pixels[:, :448] = 0  # an empty border: 3.5 tiles wide
    raster = write_geotiff(tmp_path / "border.tif", pixels)
    with rasterio.open(raster, "r+") as dst:
        dst.nodata = 0
    result = map_scene(predictor, raster, tmp_path / "maps", window=128, progress=False)
    assert result.windows == 8 * 5  # columns 0-2 are empty, column 3 is half data (classified), 4-7 whole
    assert (result.classes[:, :3] == 255).all() and (result.classes[:, 3:] != 255).all()
    unmasked = map_scene(predictor, write_geotiff(tmp_path / "plain.tif", pixels), tmp_path / "maps", window=128,
                         progress=False)
    assert unmasked.windows == 64 and (unmasked.classes != 255).all()  # no nodata declared: every window


def test_the_window_is_a_training_images_ground_size_else_its_width_else_the_image_size(tmp_path: Path) -> None:
    pixels = np.zeros((200, 200, 3), np.uint8)
    half_metre = write_geotiff(tmp_path / "utm.tif", pixels, north_up(500_000, 4_000_000, 0.5))
    degrees = write_geotiff(tmp_path / "wgs84.tif", pixels, north_up(-117, 34, 1e-5), "EPSG:4326")
    trained = SimpleNamespace(footprint={"pixels": 128.0, "metres": 38.4}, image_size=64)
    old = SimpleNamespace(footprint={}, image_size=64)
    with open_raster(half_metre) as utm, open_raster(degrees) as wgs84:
        assert scene_window(trained, utm) == (77, "a training image's ground size, 38.4 m, at 0.5 m per pixel on "
                                                  "the ground at the scene's centre")
        assert scene_window(trained, wgs84) == (38, "a training image's ground size, 38.4 m, at 1.01 m per pixel on "
                                                    "the ground at the scene's centre")  # 1e-5 degrees at 34° N
        assert scene_window(old, utm) == (64, "the model's image size; it records no training image size")
        assert scene_window(trained, utm, 100) == (100, "window=100")
        sourced = SimpleNamespace(footprint={"pixels": 128.0, "metres": 76.8, "source": "the dataset's 0.6 m pixels"})
        assert scene_window(sourced, utm)[1].startswith("a training image's ground size, 76.8 m (the dataset's 0.6 m "
                                                        "pixels), at 0.5 m per pixel")


def test_the_window_is_said_in_pixels_and_metres_and_an_unknown_footprint_is_a_warning(
        predictor, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    raster = write_geotiff(tmp_path / "scene.tif", np.zeros((300, 300, 3), np.uint8), north_up(500_000, 4e6, 0.5))
    with caplog.at_level(logging.INFO, logger="rsnet.mapping.plan"):
        plan_scene(predictor, raster, tmp_path / "maps")  # the fixture's model: 128 px covering 38.4 m
    assert [record.getMessage() for record in caplog.records] == [
        f"{raster}: window 77 px = 39 m on the ground, stride 77 px (a training image's ground size, 38.4 m, at 0.5 m "
        "per pixel on the ground at the scene's centre)"]
    caplog.clear()
    unknown = SimpleNamespace(**{**vars(predictor), "footprint": {"pixels": 128.0, "metres": None}})
    with caplog.at_level(logging.INFO, logger="rsnet.mapping.plan"):
        plan_scene(unknown, raster, tmp_path / "maps")
    said = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert said[0] == (logging.INFO, f"{raster}: window 128 px = 64 m on the ground, stride 128 px (a training "
                                     "image's width in pixels; its ground size is unknown)")
    assert said[1][0] == logging.WARNING and "pass window= in this scene's pixels (0.5 m each)" in said[1][1]
    assert len(said) == 2


def test_a_run_on_the_bundled_sample_from_before_it_had_a_ground_resolution_maps_at_its_scale() -> None:
    from rsnet.model_loading import _footprint

    assert _footprint({"pixels": 128.0, "metres": None}, "ucmerced_mini") == {
        "pixels": 128.0, "metres": pytest.approx(76.8), "source": "ucmerced_mini's 0.6 m pixels"}
    assert _footprint({"pixels": 600.0, "metres": None}, "aid") == {"pixels": 600.0, "metres": None}  # varies: unknown
    assert _footprint({"pixels": 64.0, "metres": 640.0}, "ucmerced_mini") == {"pixels": 64.0, "metres": 640.0}


@pytest.mark.parametrize("crs, transform, window", [
    ("EPSG:32633", Affine.rotation(30) @ Affine.scale(10, -10), 16),  # transform.a alone: 8.66 m, 18 px
    ("EPSG:32633", Affine.rotation(90) @ Affine.scale(10, -10), 16),  # transform.a = 0: ZeroDivisionError
    ("EPSG:32633", Affine.shear(20, 0) @ Affine.scale(10, -10), 16),
    ("EPSG:3857", Affine.scale(10, -10), 25),  # 10 projected m at 50° N: 6.43 m on the ground
])
def test_the_ground_size_of_a_pixel_is_measured_at_the_scenes_centre(tmp_path: Path, crs: str, transform: Affine,
                                                                     window: int) -> None:
    origin = {"EPSG:32633": (500_000, 5_540_000), "EPSG:3857": (1_669_792, 6_446_276)}[crs]  # 15° E, 50° N
    raster = write_geotiff(tmp_path / "scene.tif", np.zeros((64, 64, 3), np.uint8),
                           Affine.translation(*origin) @ transform, crs)
    trained = SimpleNamespace(footprint={"pixels": 16.0, "metres": 160.0}, image_size=32)
    with open_raster(raster) as src:
        size, rule = scene_window(trained, src)
    assert size == window and rule.endswith("m per pixel on the ground at the scene's centre")


def test_a_web_mercator_scene_gets_ground_hectares_and_a_ground_scale_bar(predictor, tmp_path: Path) -> None:
    """1200 × 1000 px of 0.6 m ground pixels at 50° N in EPSG:3857 (0.933 projected m a pixel): the table's hectares
    are the geodesic area of the scene (43.2 ha), not the projected one (104.6 ha)."""
    import pyproj

    x, y = pyproj.Transformer.from_crs("EPSG:4326", "EPSG:3857", always_xy=True).transform(9.0, 50.0)
    transform = north_up(x, y, 0.6 / np.cos(np.radians(50.0)))
    raster = write_geotiff(tmp_path / "mercator.tif", np.full((1000, 1200, 3), 90, np.uint8), transform, "EPSG:3857")
    map_scene(predictor, raster, tmp_path / "maps", progress=False, window=200)
    with open(tmp_path / "maps" / "mercator_areas.csv", newline="") as handle:
        hectares = sum(float(row["hectares"]) for row in csv.DictReader(handle))
    geod = pyproj.Geod(ellps="WGS84")
    corners = [transform @ corner for corner in ((0, 0), (1200, 0), (1200, 1000), (0, 1000))]
    lon, lat = pyproj.Transformer.from_crs("EPSG:3857", "EPSG:4326", always_xy=True).transform(*zip(*corners))
    expected = abs(geod.polygon_area_perimeter(lon, lat)[0]) / 10_000
    assert hectares == pytest.approx(expected, rel=0.005) and expected == pytest.approx(43.2, abs=0.2)


def test_a_plain_png_gives_the_same_map_without_coordinates(predictor, scene, tmp_path) -> None:
    georeferenced = map_scene(predictor, scene.tif, tmp_path / "tif", progress=False)
    plain = map_scene(predictor, scene.png, tmp_path / "png", progress=False)
    assert georeferenced.window == plain.window == 128  # 38.4 m at 0.3 m; a training image's 128 px
    assert "ground size" in georeferenced.window_rule and "width in pixels" in plain.window_rule
    assert (plain.classes == georeferenced.classes).all()
    with rasterio.open(plain.classes_path) as classes:
        assert classes.crs is None and classes.transform == Affine.scale(128)


def multispectral_checkpoint(path: Path) -> Path:
    """A baseline test_resnet reading bands 1-4 of uint16 rasters at 32 px, 3 classes."""
    from rsnet.models import build_model

    torch.manual_seed(0)
    model = build_model("baseline", "test_resnet", 3, in_chans=4).eval()
    bands = Bands((1, 2, 3, 4), ("blue", "green", "red", "nir"), "uint16", (2, 1, 0))
    return save_checkpoint(path, {"model_config": model.model_config, "model_state": model.state_dict(),
                                  "class_names": ["water", "field", "town"], "image_size": 32,
                                  "mean": [900.0, 1000.0, 1100.0, 2000.0], "std": [300.0, 300.0, 300.0, 600.0],
                                  "bands": bands.to_metadata(), "footprint": {"pixels": 64.0, "metres": 640.0},
                                  "epoch": 0})


def test_a_multispectral_model_maps_a_4_band_raster_and_names_a_raster_without_its_bands(tmp_path: Path) -> None:
    predictor = load_predictor(multispectral_checkpoint(tmp_path / "ms.pt"), "cpu")
    samples = np.random.default_rng(0).integers(0, 4000, (256, 256, 4)).astype(np.uint16)
    raster = write_geotiff(tmp_path / "s2.tif", samples, north_up(300_000, 5_000_000, 10))
    result = map_scene(predictor, raster, tmp_path / "maps", progress=False)
    assert (result.window, result.grid) == (64, (4, 4))  # 640 m at 10 m per pixel
    assert set(np.unique(result.classes)) <= {0, 1, 2}
    with rasterio.open(result.probabilities_path) as probabilities:
        first = probabilities.read()[:, 0, 0]
    window = predictor.bands.from_window(np.moveaxis(samples[:64, :64], -1, 0), raster, 32)  # its own dtype, 32 px
    np.testing.assert_allclose(first, predictor.probabilities(window[None])[0].numpy(), atol=1e-5)
    three = write_geotiff(tmp_path / "rgb.tif", samples[..., :3], north_up(300_000, 5_000_000, 10))
    with pytest.raises(ValueError) as refused:
        map_scene(predictor, three, tmp_path / "maps", progress=False)
    assert str(refused.value) == (f"{three} has 3 band(s) and the model reads bands [1, 2, 3, 4] (blue, green, red, "
                                  "nir): map a raster that holds them")


@pytest.mark.parametrize("case, message", [
    ("large window", "window 600 px > raster 512 × 400 px: pass window=... (at most 400)"),
    ("stride", "stride 200 px > window 100 px leaves pixels that no window sees: pass stride=... (1 to 100)"),
    ("zero window", "window=0: must be a whole number >= 1"),
    ("five bands", "has 5 bands and the model was trained on RGB pictures (gray, RGB or RGBA): map an RGB rendering"),
    ("unreadable", "cannot read raster"),
])
def test_bad_input_is_one_line_naming_the_file(predictor, tmp_path: Path, case: str, message: str) -> None:
    raster = write_geotiff(tmp_path / "scene.tif", np.zeros((400, 512, 5 if case == "five bands" else 3), np.uint8))
    options = {"large window": {"window": 600}, "stride": {"window": 100, "stride": 200},
               "zero window": {"window": 0}}.get(case, {})
    if case == "unreadable":
        raster.write_bytes(b"not a raster")
    with pytest.raises(ValueError) as refused:
        map_scene(predictor, raster, tmp_path / "maps", progress=False, **options)
    text = str(refused.value)
    assert message in text and "\n" not in text and (case == "zero window" or str(raster) in text)
    assert not (tmp_path / "maps").exists()  # refused before anything is written


@pytest.mark.parametrize("suffix, library_says", [(".jpg", "libjpeg: Premature end of JPEG file"),
                                                  (".png", "band 1: IReadBlock failed at X offset 0")])
def test_a_damaged_block_is_named_in_gdals_own_words(predictor, tmp_path: Path, suffix: str,
                                                     library_says: str) -> None:
    """A JPEG or PNG cut short (a large, highly compressed PNG is what a decompression bomb looks like): the error
    names the file, the pixel and what the codec said, not rasterio's "Read failed. See previous exception" (GDAL's
    messages of the reading thread are collected per read)."""
    from PIL import Image

    scene = tmp_path / f"scene{suffix}"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (400, 512, 3)).astype(np.uint8)).save(scene)
    scene.write_bytes(scene.read_bytes()[:scene.stat().st_size // 3])
    with pytest.raises(ValueError) as refused:
        map_scene(predictor, scene, tmp_path / "maps", progress=False)
    text = str(refused.value)
    assert text.startswith(f"cannot read raster {scene} at pixel (") and "\n" not in text
    assert library_says in text and "See previous exception" not in text, text


_PEAK_MEMORY_SCRIPT = """
import sys
from pathlib import Path
from rsnet.inference import load_predictor
from rsnet.mapping.region import map_scene

def peak_kib():  # this process's own peak resident memory (getrusage's carries the parent's over an exec)
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM:")).split()[1])

checkpoint, small, large, out = sys.argv[1:]
predictor = load_predictor(checkpoint, "cpu")
map_scene(predictor, small, out + "/warm-up", window=250, progress=False)  # first use: libraries, fonts, a preview
before = peak_kib()
result = map_scene(predictor, large, out + "/maps", window=375, progress=False)
mapped = peak_kib() - before
import rasterio
with rasterio.open(large) as src:  # then what an unbounded reader would hold: the raster read whole
    whole = src.read()
print(result.windows, mapped, peak_kib() - before, flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak resident memory from /proc")
def test_memory_stays_bounded_by_a_batch_of_windows_not_the_raster(tmp_path: Path) -> None:
    """The process's peak resident memory (GDAL's block cache and the decoded windows included, which Python's
    allocator tracing cannot see) grows by far less than the raster while a 16000 × 6000 scene is mapped; reading the
    raster whole afterwards, as an unbounded reader would, shows in the same measure (one process: one interpreter
    start, one map of the large scene)."""
    from helpers import write_checkpoint

    height, size, block = 16_000, 6000, 512
    raster = tmp_path / "large.tif"
    with rasterio.open(raster, "w", driver="GTiff", height=height, width=size, count=3, dtype="uint8", tiled=True,
                       blockxsize=block, blockysize=block, crs="EPSG:32611", transform=ORIGIN) as dst:
        for _, window in dst.block_windows(1):  # written block by block
            shade = (window.row_off + 3 * window.col_off) // block % 256
            dst.write(np.full((3, window.height, window.width), shade, np.uint8), window=window)
    small = write_geotiff(tmp_path / "small.tif", np.zeros((1000, 1000, 3), np.uint8))  # a preview of full size
    checkpoint = write_checkpoint(tmp_path / "small.pt", arch="baseline", image_size=32)
    raster_kib = 3 * height * size / 1024
    done = subprocess.run([sys.executable, "-c", _PEAK_MEMORY_SCRIPT, str(checkpoint), str(small), str(raster),
                           str(tmp_path)], check=False, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    windows, mapped, read_whole = (int(value) for value in done.stdout.splitlines()[-1].split())
    assert windows == 688  # 43 rows of windows (the last flush with the bottom edge) x 16
    # measured: 0-4 MiB above the peak of the warm-up map of a 1,000 px scene (the preview's figure, the interpreter's
    # allocations); GDAL's block cache is held to two readers' strips of window rows while windows are read
    assert mapped < raster_kib / 2, f"{mapped / 1024:.0f} MiB more resident, {raster_kib / 1024:.0f} MiB raster"
    assert read_whole > raster_kib * 0.9, f"{read_whole / 1024:.0f} MiB"  # the measure sees a raster held whole


def test_rsnet_predict_map_writes_the_files_of_every_image_and_a_mosaic(checkpoint: Path, scene, tmp_path: Path,
                                                                 capsys) -> None:
    images = tmp_path / "scenes"
    images.mkdir()
    write_geotiff(images / "north.tif", scene.mosaic[:256, :256])
    write_geotiff(images / "south.tif", scene.mosaic[256:512, :384])
    maps = tmp_path / "maps"
    done = command_in_process("predict", f"checkpoint={checkpoint}", f"images={images}", f"map={maps}",
                              "progress_bar=false", capture=capsys)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in maps.iterdir()) == sorted(["mosaic_classes.vrt", "mosaic_classes.qml", *(
        f"{stem}_{suffix}" for stem in ("north", "south") for suffix in (
            "classes.tif", "classes.tif.aux.xml", "classes.qml", "probabilities.tif", "preview.png", "areas.csv",
            "map.json"))])
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[1].startswith(f"{images / 'south.tif'}\twrote {maps / 'south_classes.tif'}")
    assert lines[2] == f"wrote {maps / 'mosaic_classes.vrt'}: a mosaic of the class maps"
    assert ("2 x 3 cells, window 128 px (a training image's ground size, 38.4 m, at 0.3 m per pixel on the ground at "
            "the scene's centre)") in lines[1]
    for extra, needle in [(f"out={tmp_path / 'p.csv'}", "out= is for images classified whole"),
                          ("stride=0", "stride=0: must be a whole number >= 1")]:
        refused = command_in_process("predict", f"checkpoint={checkpoint}", f"images={images}", f"map={maps}", extra,
                                     capture=capsys)
        assert refused.returncode == 2 and needle in refused.stderr and refused.stderr.count("\n") == 1


def test_the_benchmark_runs_at_a_small_size(capsys) -> None:
    spec = importlib.util.spec_from_file_location("bench_scene_map", REPO / "benchmarks" / "bench_scene_map.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--size", "1024", "--window", "256", "--rounds", "1", "--forward-batches", "2", "--no-memory"])
    out = capsys.readouterr().out
    assert "| map, 2 reader(s) | 16 |" in out and "| forward, lanes | 2 batches |" in out
    assert "map, 2 reader(s): " in out and "x the model's forward rate (best rounds)" in out


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device whose every write is ENOSPC")
@pytest.mark.parametrize("failing", ["classes.tif", "probabilities.tif", "preview.png"])
def test_a_full_disk_leaves_every_earlier_file_of_the_map_as_it_was(predictor, scene, tmp_path: Path, monkeypatch,
                                                                     failing: str, capfd) -> None:
    from rsnet.files import DiskFullError

    maps = tmp_path / "maps"
    first = map_scene(predictor, scene.tif, maps, window=256, progress=False)
    def named_files() -> dict[str, bytes]:
        return {path.name: path.read_bytes() for path in maps.iterdir() if not path.name.startswith(".")}

    before = named_files()
    monkeypatch.setattr("rsnet.mapping.assemble.secrets.token_hex", lambda n: "full")
    (maps / f".mosaic_{failing}.full.tmp").symlink_to("/dev/full")  # GDAL's (or PIL's) writes there all fail
    with pytest.raises(DiskFullError) as full:
        map_scene(predictor, scene.tif, maps, window=128, progress=False)
    assert str(full.value).startswith(f"no space left on device while writing {maps / f'mosaic_{failing}'}")
    assert named_files() == before  # nothing replaced
    assert [path.name for path in maps.iterdir() if path.name.startswith(".")] == [
        ".mosaic.map-partial"]  # no temporary file left; the windows classified are kept for the next try
    assert first.classes_path.is_file() and not first.classes_path.is_symlink()
    assert "_tiffSeekProc" not in capfd.readouterr().err  # libtiff's own lines: held back, rsnet's error names the file


def test_a_folder_in_the_way_of_a_map_file_is_one_line_before_any_window(predictor, scene, tmp_path: Path) -> None:
    (tmp_path / "maps" / "mosaic_probabilities.tif").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"mosaic_probabilities\.tif is a folder, and the map of .*mosaic\.tif "
                                         r"writes a file there: move the folder, or pass another map="):
        map_scene(predictor, scene.tif, tmp_path / "maps", progress=False)
