"""Decoding: 16-bit and float imagery is stretched to 8 bit (not clipped to a blank image), 8-bit is unchanged."""

from __future__ import annotations

import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import dataset_config, make_fake_archive
from PIL import Image

from rsnet.data import CorruptImageError, DecodeReport, HighBitDepthWarning, build_datasets, decode_image

W, H = 40, 24  # gradient images: value grows along x


def _gradient(lo: float, hi: float, dtype) -> np.ndarray:
    return np.tile(np.linspace(lo, hi, W), (H, 1)).astype(dtype)


def _write_gray(path: Path, mode: str) -> Path:
    """A horizontal gradient TIFF in PIL mode ``mode`` (16-bit values use only 12 bits, as many sensors do)."""
    if mode == "F":
        img = Image.fromarray(_gradient(0.01, 0.45, np.float32))  # reflectance-like floats
    elif mode == "I":
        img = Image.fromarray(_gradient(-500, 3500, np.int32))
    else:
        raw = _gradient(100, 4000, np.uint16).astype(">u2" if mode == "I;16B" else "<u2")
        img = Image.frombytes(mode, (W, H), raw.tobytes())
    img.save(path)
    with Image.open(path) as check:
        assert check.mode == mode  # the file really holds the mode under test
    return path


def _assert_stretched_gradient(img: np.ndarray) -> None:
    assert img.dtype == np.uint8 and img.shape[2] == 3
    assert int(img.max()) - int(img.min()) >= 240  # spans most of 0..255, not one flat value
    row = img[img.shape[0] // 2, :, 0].astype(int)
    assert np.all(np.diff(row) >= 0) and row[-1] > row[0]  # ordering preserved along the gradient


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I", "F"])
def test_high_bit_depth_gray_tiff_is_stretched(tmp_path, mode):
    path = _write_gray(tmp_path / "img.tif", mode)
    report = DecodeReport()
    img = decode_image(path, W, report=report)
    _assert_stretched_gradient(img)
    assert np.array_equal(img[..., 0], img[..., 2])  # gray -> equal channels
    assert report.rescaled == {str(path): mode}
    assert decode_image(path, W).shape == (W, W, 3)  # the predict call: (path, size) -> array


def test_16bit_rgb_png_keeps_channel_order_and_full_range(tmp_path):
    red = _gradient(0, 4095, np.uint16)
    rgb = np.stack([red, np.full_like(red, 2000), 4095 - red], axis=-1)
    path = tmp_path / "rgb16.png"
    cv2.imwrite(str(path), rgb[..., ::-1])  # OpenCV writes BGR
    with Image.open(path) as im:
        assert im.mode == "RGB" and int(np.asarray(im).max()) < 16  # what PIL alone makes of it
    report = DecodeReport()
    img = decode_image(path, W, report=report)
    mid = img[H // 2].astype(int)
    assert mid[-1, 0] - mid[0, 0] >= 240 and mid[0, 2] - mid[-1, 2] >= 240  # red rises, blue falls
    assert report.rescaled == {str(path): "RGB;16"}


def test_float_rgb_tiff_that_pil_cannot_open_is_read_through_opencv(tmp_path):
    red = _gradient(0.0, 0.3, np.float32)
    path = tmp_path / "float_rgb.tif"
    cv2.imwrite(str(path), np.stack([red, red, red], axis=-1))
    report = DecodeReport()
    _assert_stretched_gradient(decode_image(path, W, report=report))
    assert report.rescaled == {str(path): "3-band float32"}


def test_constant_and_nan_images_do_not_divide_by_zero(tmp_path):
    const = tmp_path / "const.tif"
    Image.frombytes("I;16", (W, H), np.full((H, W), 1234, "<u2").tobytes()).save(const)
    nan = _gradient(0.0, 1.0, np.float32)
    nan[:, :3] = np.nan
    nan_path = tmp_path / "nan.tif"
    Image.fromarray(nan).save(nan_path)
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        assert not decode_image(const, 16).any()
        _assert_stretched_gradient(decode_image(nan_path, W))


def test_minmax_follows_outliers_percentile_ignores_them_refuse_names_file_and_mode(tmp_path):
    pixels = _gradient(100, 4000, np.uint16)
    pixels[0, 0] = 65535  # one hot pixel
    path = tmp_path / "img.tif"
    Image.frombytes("I;16", (W, H), pixels.astype("<u2").tobytes()).save(path)
    minmax = decode_image(path, W, "minmax")
    assert minmax.min() == 0 and minmax.max() == 255 and minmax[W // 2, -1, 0] < 20  # gradient squeezed dark
    _assert_stretched_gradient(decode_image(path, W, "percentile"))
    with pytest.raises(CorruptImageError) as err:
        decode_image(path, W, "refuse")
    msg = str(err.value)
    assert str(path) in msg and "I;16" in msg and "dataset.high_bit_depth" in msg
    with pytest.raises(ValueError, match=r"dataset\.high_bit_depth must be one of"):
        decode_image(path, W, "clip")


@pytest.mark.parametrize("suffix,mode", [(".jpg", "RGB"), (".tif", "RGB"), (".png", "P"), (".png", "L"),
                                         (".png", "RGBA"), (".tif", "CMYK")])
def test_8bit_files_decode_exactly_as_before(tmp_path, suffix, mode):
    pixels = np.random.default_rng(0).integers(0, 256, (30, 50, 3), np.uint8)
    path = tmp_path / f"img{suffix}"
    Image.fromarray(pixels).convert(mode).save(path)
    with Image.open(path) as im:  # the pre-existing pipeline: draft (JPEG), convert, bilinear resize
        if im.format == "JPEG":
            im.draft("RGB", (24, 24))
        expected = np.asarray(im.convert("RGB").resize((24, 24), Image.Resampling.BILINEAR))
    report = DecodeReport()
    assert np.array_equal(decode_image(path, 24, report=report), expected)
    assert report.rescaled == {}


@pytest.mark.parametrize("cache", ["memory", "disk", "none"])
def test_dataset_warns_once_with_the_count_and_how(tmp_path, cache):
    top = make_fake_archive(tmp_path / "a", "ucmerced", per_class=2, size=W)
    for cls in ("beach", "forest", "river"):
        _write_gray(top / "Images" / cls / f"{cls}00.tif", "I;16")
    cdir = tmp_path / "cache"
    for _ in range(2):  # the second disk run reuses the cache and still reports the rescaled files
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            bundle = build_datasets("ucmerced", top, 0.5, 0, 16, cache=cache, cache_dir=cdir, check_counts=False)
        high = [str(w.message) for w in caught if issubclass(w.category, HighBitDepthWarning)]
        assert high == [
            f"ucmerced under '{top / 'Images'}': 3 of 42 images have 16-bit or float pixels (I;16: 3) and were "
            "rescaled to 8 bit by a per-image stretch of percentiles 2..98 to 0..255 "
            "(dataset.high_bit_depth=percentile; 'refuse' stops on such files instead)"]
    key = "beach/beach00.tif"
    ds = bundle.train if key in bundle.train.names else bundle.test
    img = ds.raw(ds.names.index(key))
    assert int(img.max()) - int(img.min()) >= 200  # stored stretched, not white


def test_rescaling_setting_is_part_of_the_disk_cache_key(tmp_path):
    top = make_fake_archive(tmp_path / "a", "ucmerced", per_class=2, size=W)
    _write_gray(top / "Images" / "beach" / "beach00.tif", "I;16")
    cdir = tmp_path / "cache"
    with pytest.warns(HighBitDepthWarning, match="percentile"):
        build_datasets("ucmerced", top, 0.5, 0, 16, cache="disk", cache_dir=cdir, check_counts=False)
    with pytest.warns(HighBitDepthWarning, match=r"min\.\.max"):
        again = build_datasets("ucmerced", top, 0.5, 0, 16, cache="disk", cache_dir=cdir, check_counts=False,
                               high_bit_depth="minmax")
    assert again.train.store.decoded == 42 and len(list(cdir.glob("*.npy"))) == 2


@pytest.mark.filterwarnings("ignore::rsnet.data.DatasetCountWarning")
def test_config_key_reaches_the_decoder(tmp_path):
    from rsnet.data import build_datasets_from_config

    top = make_fake_archive(tmp_path / "a", "ucmerced", per_class=2, size=W)
    _write_gray(top / "Images" / "beach" / "beach00.tif", "I;16")
    config = dataset_config("ucmerced", root=str(top), image_size=16, high_bit_depth="refuse")
    with pytest.raises(CorruptImageError, match=r"beach00\.tif.*dataset\.high_bit_depth=refuse"):
        build_datasets_from_config(config, seed=0)
