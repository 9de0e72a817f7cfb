"""The class palette (rsnet.mapping.palette) and the map preview (rsnet.mapping.preview): distinct colours, the
imagery under the classes, coordinates, scale bar, legend, layout for any aspect ratio, same bytes, full disk."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.text import Text
from PIL import Image

from rsnet.data.specs import AID_COUNTS, EUROSAT_COUNTS, NWPU_CLASSES, UCM_CLASSES
from rsnet.files import DiskFullError
from rsnet.mapping.palette import NAMED, class_colours, colour_table, palette_size
from rsnet.mapping.preview import ALPHA, PreviewGeometry, legend_entries, preview_figure, write_preview

NAMES = ["forest", "river", "runway", "storagetanks", "harbor", "golfcourse"]
NODATA = 255
GROUND = (90, 140, 200)  # the synthetic imagery's one colour
UTM = PreviewGeometry((500000.0, 3759674.0, 500593.0, 3760000.0), (500000.0, 3759616.0, 500614.0, 3760000.0),
                      "EPSG:32611", "m", 1.0)


def cielab(rgb: np.ndarray) -> np.ndarray:
    """sRGB (0..1) to CIELAB under D65, written out independently of the module's own conversion."""
    c = np.where(rgb > 0.04045, ((rgb + 0.055) / 1.055) ** 2.4, rgb / 12.92)
    x = (0.4124 * c[:, 0] + 0.3576 * c[:, 1] + 0.1805 * c[:, 2]) / 0.9505
    y = 0.2126 * c[:, 0] + 0.7152 * c[:, 1] + 0.0722 * c[:, 2]
    z = (0.0193 * c[:, 0] + 0.1192 * c[:, 1] + 0.9505 * c[:, 2]) / 1.0890

    def f(t: np.ndarray) -> np.ndarray:
        return np.where(t > 216 / 24389, np.cbrt(t), (24389 / 27 * t + 16) / 116)

    return np.stack([116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))], axis=1)


def grid_case(rows: int = 4, cols: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Classes 0 (left half) and 2 (right half, top row nodata), and their shares."""
    classes = np.zeros((rows, cols), dtype=np.uint8)
    classes[:, cols // 2:] = 2
    classes[0, cols // 2:] = NODATA
    mapped = classes[classes != NODATA]
    return classes, np.bincount(mapped, minlength=len(NAMES)) / mapped.size


def ground(height: int = 326, width: int = 593) -> np.ndarray:
    return np.broadcast_to(np.array(GROUND, dtype=np.uint8), (height, width, 3)).copy()


def png(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB")).astype(int)


def count_near(pixels: np.ndarray, colour: np.ndarray, tolerance: int = 3) -> int:
    return int(np.all(np.abs(pixels - colour) <= tolerance, axis=-1).sum())


def legend_labels(figure) -> list[str]:
    legends = [*figure.legends, *(axes.get_legend() for axes in figure.axes if axes.get_legend())]
    assert len(legends) == 1
    return [text.get_text() for text in legends[0].get_texts()]


def hue(lab: np.ndarray) -> np.ndarray:
    """CIELAB hue angle in degrees, 0..360."""
    return np.degrees(np.arctan2(lab[..., 2], lab[..., 1])) % 360


@pytest.mark.parametrize("names", [UCM_CLASSES, list(AID_COUNTS), NWPU_CLASSES, list(EUROSAT_COUNTS),
                                   [f"class {i}" for i in range(45)]],
                         ids=["ucmerced", "aid", "nwpu_resisc45", "eurosat", "45_unknown"])
def test_every_dataset_s_classes_are_distinct_saturated_not_grey(names: list[str]) -> None:
    colours = class_colours(names)
    assert colours.shape == (len(names), 3) and colours.min() >= 0.0 and colours.max() <= 1.0
    lab = cielab(colours)
    distance = np.linalg.norm(lab[:, None] - lab[None], axis=-1) + np.diag(np.full(len(names), np.inf))
    assert distance.min() >= 10.0  # ΔE: 16.9, 14.1, 14.1, 21.8, 14.1
    assert np.hypot(lab[:, 1], lab[:, 2]).min() >= 12.0  # no grey, no white, no black
    assert lab[:, 0].min() >= 25.0


def alone(names: list[str]) -> np.ndarray:
    """CIELAB of each name's colour in a map of its own (no keyword taken by another class)."""
    return cielab(np.array([class_colours([name])[0] for name in names]))


def test_known_names_get_their_conventional_colours_whatever_the_spelling() -> None:
    spellings = ["DenseResidential", "dense_residential", "denseresidential", "Dense Residential"]
    assert len({tuple(lab) for lab in alone(spellings)}) == 1
    green = alone(["forest", "Forest", "meadow", "Park", "golf_course", "HerbaceousVegetation", "chaparral"])
    assert ((hue(green) > 100) & (hue(green) < 170)).all()
    water = alone(["river", "lake", "SeaLake", "pond", "harbor", "Port"])
    assert ((hue(water) > 240) & (hue(water) < 300)).all()
    residential = alone(["dense_residential", "MediumResidential", "sparseresidential"])
    assert ((hue(residential) > 15) & (hue(residential) < 45)).all()  # red
    assert (np.diff(residential[:, 0]) > 10).all()  # dense dark, sparse light
    transport = alone(["freeway", "runway", "intersection", "overpass", "parking_lot", "bridge"])
    assert (np.hypot(transport[:, 1], transport[:, 2]) < 25).all()  # muted: slate, not a hue of its own
    park, parking = alone(["park", "parking_lot"])
    assert np.linalg.norm(park - parking) > 10  # the longest keyword wins
    bare = hue(alone(["desert", "beach", "BareLand", "mountain"]))
    assert ((bare > 60) & (bare < 100)).all()  # sand to earth


def test_a_class_keeps_its_colour_whatever_else_the_map_holds() -> None:
    forest, unknown = class_colours(["forest", "quarry"])
    assert np.array_equal(class_colours(["river", "forest"])[1], forest)  # a named class: by name
    assert np.array_equal(class_colours(["river", "quarry"])[1], unknown)  # any other class: by index
    assert not np.array_equal(class_colours(["quarry", "river"])[0], unknown)
    assert np.array_equal(class_colours(["a", "b", "c"]), class_colours(["a", "b", "c"]))
    size = palette_size()
    assert size >= 45
    names = [f"class {i}" for i in range(size + 3)]
    assert np.array_equal(class_colours(names)[size:], class_colours(names[:3]))
    assert len({tuple(c) for c in class_colours(names[:size])}) == size
    assert class_colours([]).shape == (0, 3)


def test_a_second_class_of_one_keyword_and_unknown_classes_stay_off_the_named_colours() -> None:
    forest, dense_forest = cielab(class_colours(["forest", "dense forest"]))
    assert np.linalg.norm(forest - dense_forest) >= 10.0
    named = cielab(np.array([to_rgb(colour) for colour in NAMED.values()]))
    unknown = cielab(class_colours([f"class {i}" for i in range(palette_size())]))
    assert np.linalg.norm(unknown[:, None] - named[None], axis=-1).min() >= 10.0


def test_colour_table_is_the_palette_in_bytes() -> None:
    table = colour_table(NWPU_CLASSES, nodata=NODATA)
    assert set(table) == {*range(45), NODATA}
    assert table[NODATA] == (0, 0, 0, 0)
    expected = np.round(255 * class_colours(NWPU_CLASSES)).astype(int)
    assert all(table[i] == (*expected[i], 255) for i in range(45))
    assert table[NWPU_CLASSES.index("forest")] == (0x1B, 0x6B, 0x2F, 255)
    assert all(isinstance(v, int) for entry in table.values() for v in entry)
    assert NODATA not in colour_table(NAMES[:3])


def test_legend_entries_list_only_present_classes_largest_first() -> None:
    classes, shares = grid_case()
    assert legend_entries(NAMES, shares, classes, NODATA) == [(0, "forest 57.1 %"), (2, "runway 42.9 %")]
    shares = np.array([0.5, 0.0, 0.2, 0.0003, 0.0, 0.2997])  # a class under 0.05 %; one in the grid only (4)
    classes = np.array([[0, 4], [NODATA, 5]])
    assert legend_entries(NAMES, shares, classes, NODATA) == [
        (0, "forest 50.0 %"), (5, "golfcourse 30.0 %"), (2, "runway 20.0 %"), (3, "storagetanks <0.1 %"),
        (4, "harbor 0.0 %")]


def test_preview_shows_imagery_under_the_classes(tmp_path: Path) -> None:
    classes, shares = grid_case()
    path = tmp_path / "preview.png"
    write_preview(path, classes, NODATA, NAMES, shares, "scene.tif", UTM, ground())
    pixels = png(path)
    assert 600 <= pixels.shape[1] <= 1600 and 350 <= pixels.shape[0] <= 1000
    colours = np.round(255 * class_colours(NAMES)).astype(int)
    blend = np.round(ALPHA * colours[0] + (1 - ALPHA) * np.array(GROUND))
    assert count_near(pixels, blend) > 50_000  # class 0 over the imagery: both show
    assert count_near(pixels, np.array(GROUND)) > 10_000  # nodata: the imagery unchanged
    assert count_near(pixels, colours[0], tolerance=1) < 2_000  # opaque: the legend's patch only
    assert count_near(pixels, colours[1], tolerance=1) == 0  # a class absent from the map


def test_preview_without_imagery_draws_classes_opaque(tmp_path: Path) -> None:
    classes, shares = grid_case()
    path = tmp_path / "preview.png"
    write_preview(path, classes, NODATA, NAMES, shares, "scene.tif", UTM)
    pixels = png(path)
    colours = np.round(255 * class_colours(NAMES)).astype(int)
    assert count_near(pixels, colours[0], tolerance=1) > 50_000
    assert count_near(pixels, colours[2], tolerance=1) > 20_000


def test_projected_geometry_labels_axes_limits_and_scale_bar() -> None:
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    classes, shares = grid_case()
    figure = preview_figure(classes, NODATA, NAMES, shares, "scene.tif", UTM, ground())
    axes = figure.axes[0]
    assert axes.get_xlabel() == "easting (m), EPSG:32611" and axes.get_ylabel() == "northing (m)"
    assert axes.get_xlim() == (500000.0, 500593.0) and axes.get_ylim() == (3759674.0, 3760000.0)  # not the overhang
    bars = [artist for artist in axes.artists if isinstance(artist, AnchoredSizeBar)]
    assert [bar.txt_label.get_text() for bar in bars] == ["100 m at centre"]  # a fifth of 593 m, rounded
    assert legend_labels(figure) == ["forest 57.1 %", "runway 42.9 %"]
    assert "scene.tif" in [text.get_text() for text in figure.findobj(Text)]


def test_geographic_geometry(tmp_path: Path) -> None:
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    classes, shares = grid_case()
    geometry = PreviewGeometry((-117.2, 33.9, -117.05, 34.0), (-117.2, 33.9, -117.05, 34.0), "EPSG:4326", "°",
                               92_300.0, geographic=True)
    figure = preview_figure(classes, NODATA, NAMES, shares, "scene.tif", geometry, ground(200, 300))
    axes = figure.axes[0]
    assert axes.get_xlabel() == "longitude (°), EPSG:4326" and axes.get_ylabel() == "latitude (°)"
    bars = [artist for artist in axes.artists if isinstance(artist, AnchoredSizeBar)]
    assert [bar.txt_label.get_text() for bar in bars] == ["2 km at centre"]  # 0.15° x 92.3 km / 5 = 2.8 km
    write_preview(tmp_path / "geo.png", classes, NODATA, NAMES, shares, "scene.tif", geometry, ground(200, 300))
    assert png(tmp_path / "geo.png").shape[1] > png(tmp_path / "geo.png").shape[0]


def test_no_crs_geometry_is_in_pixels_with_rows_downwards(tmp_path: Path) -> None:
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    classes, shares = grid_case(2, 3)
    geometry = PreviewGeometry((0, 500, 700, 0), (0, 512, 768, 0), None, "px", None)
    figure = preview_figure(classes, NODATA, NAMES, shares, "scene.tif", geometry)
    axes = figure.axes[0]
    assert axes.get_xlabel() == "column (px)" and axes.get_ylabel() == "row (px)"
    assert axes.get_ylim() == (500, 0)  # row 0 at the top
    assert not [artist for artist in axes.artists if isinstance(artist, AnchoredSizeBar)]
    path = tmp_path / "tiny.png"
    write_preview(path, classes, NODATA, NAMES, shares, "scene.tif", geometry, ground(500, 700))
    pixels = png(path)
    colours = np.round(255 * class_colours(NAMES)).astype(int)
    blend = np.round(ALPHA * colours[2] + (1 - ALPHA) * np.array(GROUND))
    top_left = pixels[: pixels.shape[0] // 2, : pixels.shape[1] // 2]
    assert count_near(top_left, blend) < count_near(pixels, blend) / 4  # class 2 is in the right half


@pytest.mark.parametrize("bounds", [(0, 0, 20000, 1000), (0, 0, 1000, 20000), (0, 0, 300, 200)])
def test_every_aspect_ratio_fits_the_figure(bounds: tuple[float, float, float, float]) -> None:
    classes, shares = grid_case()
    geometry = PreviewGeometry(bounds, bounds, "EPSG:32633", "m", 1.0)
    figure = preview_figure(classes, NODATA, NAMES, shares, "a title " * 10, geometry)
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    page = figure.bbox
    axes = figure.axes[0]
    boxes = [axes.get_tightbbox(renderer), *(legend.get_window_extent(renderer) for legend in figure.legends)]
    for box in boxes:
        assert box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1 and box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1
    width, height = axes.get_position().width * page.width, axes.get_position().height * page.height
    ratio = (bounds[3] - bounds[1]) / (bounds[2] - bounds[0])
    assert height / width == pytest.approx(ratio, rel=0.05)
    assert max(width, height) >= 600  # the map, not the legend, fills the figure


def test_45_classes_render_with_every_class_in_the_legend(tmp_path: Path) -> None:
    names = [f"class {i:02d} thermal power station" for i in range(45)]
    classes = np.arange(45 * 4, dtype=np.uint16).reshape(9, 20) % 45
    shares = np.bincount(classes.ravel(), minlength=45) / classes.size
    geometry = PreviewGeometry((0, 0, 2000, 900), (0, 0, 2000, 900), "EPSG:32633", "m", 1.0)
    figure = preview_figure(classes, 65535, names, shares, "45 classes", geometry)
    assert sorted(legend_labels(figure)) == sorted(f"{name} 2.2 %" for name in names)
    path = tmp_path / "many.png"
    write_preview(path, classes, 65535, names, shares, "45 classes", geometry)
    height, width, _ = png(path).shape
    assert width <= 2000 and height <= 2000


def test_same_inputs_give_same_bytes(tmp_path: Path) -> None:
    classes, shares = grid_case()
    for name in ("a.png", "b.png"):
        write_preview(tmp_path / name, classes, NODATA, NAMES, shares, "scene.tif", UTM, ground())
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()


@pytest.mark.parametrize("final", [None, "map/preview.png"])
def test_full_disk_names_the_final_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, final: str | None) -> None:
    def full(self, fp, *args, **kwargs) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Image.Image, "save", full)
    classes, shares = grid_case()
    path, error_name = tmp_path / ".preview.png.tmp", (tmp_path / final if final else None)
    with pytest.raises(DiskFullError) as caught:
        write_preview(path, classes, NODATA, NAMES, shares, "scene.tif", UTM, error_name=error_name)
    assert caught.value.path == str(error_name or path)


def test_unusable_inputs_name_the_file() -> None:
    classes, shares = grid_case()
    path = Path("out/preview.png")
    with pytest.raises(ValueError, match=r"preview out/preview.png: classes holds 0\.\.7"):
        write_preview(path, np.where(classes == 2, 7, classes), NODATA, NAMES, shares, "t", UTM)
    with pytest.raises(ValueError, match="shares has shape"):
        write_preview(path, classes, NODATA, NAMES, shares[:3], "t", UTM)
    with pytest.raises(ValueError, match="imagery is float64"):
        write_preview(path, classes, NODATA, NAMES, shares, "t", UTM, np.zeros((4, 4, 3)))
    assert not path.exists()

