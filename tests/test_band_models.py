"""A multispectral model's checks when it predicts, maps and loads: files of another sample type or band count,
files wholly nodata or too large, and band statistics (mean/std) that are not usable, as one line naming the file."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from helpers import command_in_process, write_checkpoint
from rasterio.transform import Affine

from rsnet.checkpoint import save_checkpoint
from rsnet.data.raster import Bands
from rsnet.inference import UnreadableImageError, load_predictor, read_image
from rsnet.mapping.region import map_scene

NAMES = ("blue", "green", "red", "nir")


def write_raster(path: Path, pixels: np.ndarray, nodata: float | None = None, sparse_size: int | None = None) -> Path:
    """A bands × H × W GeoTIFF (EPSG:32633, 10 m pixels); ``sparse_size``: an empty (sparse) square of that side."""
    count, height, width = pixels.shape
    height, width = (sparse_size, sparse_size) if sparse_size else (height, width)
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=count, dtype=pixels.dtype.name,
                       crs="EPSG:32633", transform=Affine(10, 0, 500_000, 0, -10, 5_540_000), nodata=nodata,
                       tiled=bool(sparse_size), sparse_ok=bool(sparse_size)) as dst:
        if not sparse_size:
            dst.write(pixels)
    return path


def band_checkpoint(path: Path, **overrides: object) -> Path:
    """A baseline test_resnet reading the 4 bands of 4-band uint16 files at 32 px, 3 classes."""
    from rsnet.models import build_model

    torch.manual_seed(0)
    model = build_model("baseline", "test_resnet", 3, in_chans=4).eval()
    bands = Bands((1, 2, 3, 4), NAMES, "uint16", (2, 1, 0), count=4)
    payload = {"model_config": model.model_config, "model_state": model.state_dict(),
               "class_names": ["water", "field", "town"], "image_size": 32, "mean": [900.0, 1000.0, 1100.0, 2000.0],
               "std": [300.0, 300.0, 300.0, 600.0], "bands": bands.to_metadata(),
               "footprint": {"pixels": 64.0, "metres": 640.0}, "epoch": 0, **overrides}
    return save_checkpoint(path, payload)


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory):
    return load_predictor(band_checkpoint(tmp_path_factory.mktemp("model") / "best.pt"), "cpu")


@pytest.mark.parametrize("case, message", [
    ("uint8", "its samples are uint8, and the dataset's bands are uint16"),
    ("six bands", "it has 6 band(s), and the dataset's files have 4"),
    ("nodata", "every pixel of its bands is nodata"),
    ("bomb", "it has 30000 × 30000 = 900,000,000 pixels, more than max_pixels=178956970"),
])
def test_predict_refuses_a_file_the_model_would_read_wrong(predictor, tmp_path: Path, case: str, message: str) -> None:
    pixels = {"uint8": np.full((4, 40, 40), 90, np.uint8), "six bands": np.full((6, 40, 40), 900, np.uint16),
              "nodata": np.zeros((4, 40, 40), np.uint16), "bomb": np.zeros((4, 1, 1), np.uint16)}[case]
    path = write_raster(tmp_path / "x.tif", pixels, nodata=0 if case == "nodata" else None,
                        sparse_size=30_000 if case == "bomb" else None)
    with pytest.raises(UnreadableImageError) as refused:
        predictor.read_images([path])
    assert str(refused.value).startswith(f"cannot read image {path}: ") and message in str(refused.value)


def test_predicts_max_pixels_setting_raises_the_cap(tmp_path: Path, capsys) -> None:
    checkpoint = band_checkpoint(tmp_path / "best.pt")
    image = write_raster(tmp_path / "x.tif", np.full((4, 40, 40), 1000, np.uint16))
    refused = command_in_process("predict", f"checkpoint={checkpoint}", f"images={image}", "max_pixels=100",
                                 "progress_bar=false", capture=capsys)
    assert refused.returncode == 2 and "more than max_pixels=100 " in refused.stderr
    done = command_in_process("predict", f"checkpoint={checkpoint}", f"images={image}", "max_pixels=1600",
                              "progress_bar=false", capture=capsys)
    assert done.returncode == 0 and done.stdout.startswith(str(image))


@pytest.mark.parametrize("case, message", [
    ("uint8", "holds uint8 samples and the model's bands are uint16: convert the scene to uint16"),
    ("five bands", "has 5 band(s) and the model was trained on files of 4: its band numbers would mean other bands"),
])
def test_a_scene_the_model_would_read_wrong_is_refused_before_any_window(predictor, tmp_path: Path, case: str,
                                                                          message: str) -> None:
    pixels = np.full((5, 128, 128), 900, np.uint16) if case == "five bands" else np.full((4, 128, 128), 90, np.uint8)
    scene = write_raster(tmp_path / "scene.tif", pixels)
    with pytest.raises(ValueError) as refused:
        map_scene(predictor, scene, tmp_path / "maps", progress=False)
    assert str(refused.value).startswith(f"{scene} {message}") and not (tmp_path / "maps").exists()


@pytest.mark.parametrize("mean, std, message", [
    ([math.nan, 1000.0, 1100.0, 2000.0], [300.0] * 4, r"its mean of band\(s\) \[1\] is \[nan\], and must be finite"),
    ([900.0] * 4, [300.0, 0.0, 300.0, 300.0], r"its std of band\(s\) \[2\] is \[0\.0\], and must be finite numbers "
                                              r"above 0"),
    ([900.0] * 3, [300.0] * 3, r"its mean has 3 entries, and the model reads 4 band\(s\)"),
    ([900.0] * 4, [300.0, math.inf, 300.0, 300.0], r"its std of band\(s\) \[2\] is \[inf\]"),
])
def test_unusable_band_statistics_in_a_checkpoint_are_one_line(tmp_path: Path, mean: list, std: list,
                                                               message: str) -> None:
    checkpoint = band_checkpoint(tmp_path / "best.pt", mean=mean, std=std)  # signed: only its contents are wrong
    with pytest.raises(ValueError, match=rf"^{checkpoint}: {message}.*: retrain, or restore the file"):
        load_predictor(checkpoint, "cpu")


def test_unusable_statistics_stop_evaluate_and_export_too(tmp_path: Path, capsys) -> None:
    checkpoint = write_checkpoint(tmp_path / "best.pt", arch="baseline", mean=[0.4, math.nan, 0.4])
    for command, extra in (("export", f"out={tmp_path / 'exported'}"), ("evaluate", "dataset=ucmerced_mini")):
        done = command_in_process(command, f"checkpoint={checkpoint}", extra, capture=capsys)
        assert done.returncode == 2 and "its mean of band(s) [2] is [nan]" in done.stderr, (command, done.stderr)
        assert done.stderr.count("\n") == 1


def test_a_file_of_the_model_reads_as_before(predictor, tmp_path: Path) -> None:
    samples = np.random.default_rng(0).integers(500, 3000, (4, 40, 40)).astype(np.uint16)
    image = read_image(write_raster(tmp_path / "x.tif", samples), 32, predictor.decoding)
    assert image.shape == (32, 32, 4) and image.dtype == np.uint16


@pytest.mark.parametrize("format", ["timm", "state_dict"])
def test_a_multispectral_export_draws_attention_maps(tmp_path: Path, format: str) -> None:
    from rsnet.export import export_checkpoint

    export_checkpoint(band_checkpoint(tmp_path / "best.pt"), tmp_path / "export", format=format, head="main")
    exported = load_predictor(tmp_path / "export", "cpu", attention=True)
    assert exported.full_model is not None  # rebuilt with the model's 4 input bands, checked against its logits
    samples = np.random.default_rng(0).integers(500, 3000, (2, 32, 32, 4)).astype(np.uint16)
    assert exported.full_model(exported.preprocess(samples)).main_logits.shape == (2, 3)
