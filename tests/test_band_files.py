"""Band files that would train, evaluate or predict wrong without a word: another sample type, another band count,
inexact band indices, files wholly nodata, nodata counted in the statistics, a spec naming other bands, files too
large to read whole, band descriptions as names, and many-band files read as pictures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.transform import Affine

from rsnet.data import build_datasets
from rsnet.data.errors import CorruptImageError, CorruptImageWarning
from rsnet.data.raster import DEFAULT_MAX_PIXELS, band_statistics, resolve_bands

CLASSES = ("field", "water")


def write_raster(path: Path, pixels: np.ndarray, nodata: float | None = None,
                 descriptions: tuple[str, ...] = (), sparse_size: int | None = None) -> Path:
    """A bands × H × W GeoTIFF (EPSG:32633, 10 m pixels); ``sparse_size``: an empty (sparse) square of that side."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count, height, width = pixels.shape
    if sparse_size:
        height = width = sparse_size
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=count, dtype=pixels.dtype.name,
                       crs="EPSG:32633", transform=Affine(10, 0, 500_000, 0, -10, 5_540_000), nodata=nodata,
                       tiled=bool(sparse_size), sparse_ok=bool(sparse_size)) as dst:
        if not sparse_size:
            dst.write(pixels)
        for band, name in enumerate(descriptions, start=1):
            dst.set_band_description(band, name)
    return path


def write_folder(root: Path, bands: int = 4, dtype: str = "uint16", per_class: int = 3, **kw) -> Path:
    """``root/<class>/<n>.tif``: ``per_class`` files of ``bands`` bands a class, a level per class."""
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        for n in range(per_class):
            pixels = 1000 + 500 * label + rng.integers(0, 100, (bands, 12, 12))
            write_raster(root / name / f"{n}.tif", pixels.astype(dtype), **kw)
    return root


def test_a_file_of_another_sample_type_is_refused_not_cast(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "set")
    write_raster(root / "field" / "9.tif", np.full((4, 12, 12), 200, np.uint8))
    with pytest.raises(CorruptImageError, match=r"9\.tif'.*its samples are uint8, and the dataset's bands are "
                                                r"uint16: another sample type is another radiometric scale"):
        build_datasets("image_folder", root, 0.5, 0, 8, bands="all")


def test_a_file_with_more_bands_than_the_others_is_refused_not_cut(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "set")
    write_raster(root / "water" / "9.tif", np.full((6, 12, 12), 1500, np.uint16))
    with pytest.raises(CorruptImageError, match=r"9\.tif'.*it has 6 band\(s\), and the dataset's files have 4"):
        build_datasets("image_folder", root, 0.5, 0, 8, bands="all")
    with pytest.raises(CorruptImageError, match=r"it has 6 band\(s\), and the dataset's files have 4"):
        build_datasets("image_folder", root, 0.5, 0, 8, bands=[1, 2])  # band 2 of 6 is another band than of 4


@pytest.mark.parametrize("setting", [[1.7, 2.2, 3], [True, 2], [2.0, 3]])
def test_band_indices_must_be_whole_numbers(tmp_path: Path, setting: list) -> None:
    first = write_raster(tmp_path / "a.tif", np.zeros((4, 8, 8), np.uint16))
    with pytest.raises(ValueError, match=rf"dataset\.bands: {setting[0]!r} is not a band: list whole 1-based band "
                                         "indices or band names"):
        resolve_bands(setting, first)


@pytest.mark.parametrize("dtype, nodata, fill", [("uint16", 0, 0), ("float32", None, np.nan),
                                                 ("float32", -9999.0, -9999.0)])
def test_a_file_wholly_nodata_is_refused(tmp_path: Path, dtype: str, nodata: float | None, fill: float) -> None:
    root = write_folder(tmp_path / "set", dtype=dtype, nodata=nodata)
    write_raster(root / "field" / "9.tif", np.full((4, 12, 12), fill, dtype), nodata=nodata)
    with pytest.raises(CorruptImageError, match=r"9\.tif'.*every pixel of its bands is nodata"):
        build_datasets("image_folder", root, 0.5, 0, 8, bands="all")
    with pytest.warns(CorruptImageWarning, match=r"skipped 1 undecodable image"):
        data = build_datasets("image_folder", root, 0.5, 0, 8, bands="all", skip_corrupt=True)
    assert data.skipped == ["field/9.tif"]


def test_band_statistics_leave_out_integer_nodata(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "set", nodata=0)
    for name in CLASSES:  # half of every file is nodata
        for path in (root / name).iterdir():
            with rasterio.open(path, "r+") as dst:
                pixels = dst.read()
                pixels[:, :6] = 0
                dst.write(pixels)
    data = build_datasets("image_folder", root, 0.5, 0, 12, bands="all")
    train = np.stack([data.train.raw(i) for i in range(len(data.train))]).reshape(-1, 4).astype(np.float64)
    valid = train[train[:, 0] != 0]
    assert data.bands.nodata == 0
    np.testing.assert_allclose(data.mean, valid.mean(0), rtol=1e-9)
    np.testing.assert_allclose(data.std, valid.std(0), rtol=1e-9)


def test_band_statistics_name_an_empty_split_and_a_band_without_data() -> None:
    with pytest.raises(ValueError, match="no training image to compute the band statistics from"):
        band_statistics(np.zeros((3, 4, 4, 2), np.uint16), [])
    images = np.ones((3, 4, 4, 2), np.uint16)
    images[..., 1] = 0
    with pytest.raises(ValueError, match=r"^nir: every training sample is nodata \(0\)"):
        band_statistics(images, [0, 1, 2], nodata=0, names=("red", "nir"))


@pytest.mark.parametrize("setting", ["all", ["B8A"], ["B04"]])
def test_a_spec_that_names_other_bands_than_the_files_have_is_refused(tmp_path: Path, setting: object) -> None:
    first = write_raster(tmp_path / "a.tif", np.zeros((12, 8, 8), np.uint16))
    names = tuple(f"B{i:02d}" for i in range(1, 13)) + ("B8A",)
    with pytest.raises(ValueError, match=r"'.*a\.tif' has 12 band\(s\), and eurosat_ms's files have 13 \(B01, .*, "
                                         r"B8A\): its files are another product"):
        resolve_bands(setting, first, names, (4, 3, 2), "eurosat_ms")


def test_a_file_larger_than_max_pixels_is_refused_before_it_is_read(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "set")
    write_raster(root / "field" / "bomb.tif", np.zeros((4, 1, 1), np.uint16), sparse_size=20_000)  # a few KB
    assert (root / "field" / "bomb.tif").stat().st_size < 100_000 and 20_000 ** 2 > DEFAULT_MAX_PIXELS
    with pytest.raises(CorruptImageError, match=r"bomb\.tif'.*it has 20000 × 20000 = 400,000,000 pixels, more than "
                                                r"max_pixels=178956970 .*raise dataset\.max_pixels"):
        build_datasets("image_folder", root, 0.5, 0, 8, bands="all")
    with pytest.raises(CorruptImageError, match=r"more than max_pixels=100 "):
        build_datasets("image_folder", root, 0.5, 0, 8, bands="all", max_pixels=100)
    with pytest.raises(ValueError, match=r"dataset\.max_pixels=0: must be a whole number of pixels >= 1"):
        build_datasets("image_folder", root, 0.5, 0, 8, bands="all", max_pixels=0)


def test_band_descriptions_name_the_bands_and_every_file_must_agree(tmp_path: Path) -> None:
    named = ("red", "green", "blue", "nir")
    root = write_folder(tmp_path / "set", descriptions=named)
    data = build_datasets("image_folder", root, 0.5, 0, 8, bands=["nir", "red"])
    assert data.bands.indices == (4, 1) and data.bands.names == ("nir", "red") and data.bands.described
    write_raster(root / "water" / "9.tif", np.full((4, 12, 12), 1500, np.uint16),
                 descriptions=("nir", "red", "green", "blue"))
    with pytest.raises(CorruptImageError, match=r"9\.tif'.*its bands \[4, 1\] are named \['blue', 'nir'\], and the "
                                                r"dataset's \['nir', 'red'\]: every file must name its bands alike"):
        build_datasets("image_folder", root, 0.5, 0, 8, bands=["nir", "red"])


def test_many_band_files_without_dataset_bands_say_to_set_it(tmp_path: Path) -> None:
    root = write_folder(tmp_path / "set", bands=13)
    with pytest.raises(ValueError, match=r"'.*\.tif' has 13 bands, and image_folder is read as RGB pictures "
                                         r"\(dataset\.bands=null\): set dataset\.bands=all"):
        build_datasets("image_folder", root, 0.5, 0, 8)


@pytest.mark.parametrize("bands", [4, 128, 130, 300])
def test_normalisation_takes_any_number_of_bands(bands: int) -> None:
    from rsnet.data.normalize import to_float_chw

    images = np.random.default_rng(0).integers(0, 4000, (2, 6, 5, bands)).astype(np.uint16)
    mean, std = np.linspace(100, 900, bands), np.linspace(10, 90, bands)
    out = to_float_chw(images, mean, std, max_pixel_value=1.0)
    expected = (np.moveaxis(images, -1, 1) - mean[:, None, None]) / std[:, None, None]
    assert out.shape == (2, bands, 6, 5)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-4)


def test_a_many_band_file_read_as_a_picture_says_to_set_dataset_bands_and_opencv_stays_quiet(tmp_path: Path,
                                                                                              capfd) -> None:
    from rsnet.data.decode import decode_image

    many = write_raster(tmp_path / "s2.tif", np.full((13, 12, 12), 900, np.uint16))
    cut = tmp_path / "cut.tif"
    cut.write_bytes(many.read_bytes()[:200])
    with pytest.raises(CorruptImageError, match=r"s2\.tif': it has 13 bands, and a picture is gray, RGB or RGBA: "
                                                r"set dataset\.bands"):
        decode_image(many, 8)
    with pytest.raises(CorruptImageError, match=r"cut\.tif'"):
        decode_image(cut, 8)
    printed = capfd.readouterr()
    assert "imread" not in printed.err + printed.out and "ERROR" not in printed.err


def test_gdal_messages_stay_out_of_the_log_where_rsnet_names_the_file(tmp_path: Path, caplog) -> None:
    import logging

    caplog.set_level(logging.INFO)  # as a run's log records
    bands = resolve_bands("all", write_raster(tmp_path / "a.tif", np.ones((4, 8, 8), np.uint16)))
    broken = tmp_path / "broken.tif"
    broken.write_bytes((tmp_path / "a.tif").read_bytes()[:300])
    with pytest.raises(CorruptImageError, match=r"broken\.tif'"):
        bands.read(broken, 8)
    assert [record.getMessage() for record in caplog.records if record.name.startswith("rasterio")] == []
