"""N-band rasters: ``dataset.bands`` resolution and reading, per-band statistics, the N-band augmentation on both paths,
the disk cache in the files' own sample type, ``in_chans`` through timm, and end-to-end runs of a 13-band
EuroSAT-layout set and a 4-band (RGB + NIR) folder through train, evaluate, export and predict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from rasterio.transform import Affine
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from eurosat_fakes import write_eurosat_ms
from helpers import command_in_process, run_train
from rsnet.data import build_datasets
from rsnet.data.cache import build_store
from rsnet.data.device_augment import DeviceAugment
from rsnet.data.errors import CorruptImageError
from rsnet.data.raster import Bands, band_statistics, resolve_bands, rgb_composite
from rsnet.data.transforms import HostAugment, jitter_bands

NIR_CLASSES = ("crops", "forest", "water")


def write_raster(path: Path, pixels: np.ndarray) -> Path:
    """A bands × H × W GeoTIFF (UTM 32N, 10 m pixels)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count, height, width = pixels.shape
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=count, dtype=pixels.dtype.name,
                       crs="EPSG:32632", transform=Affine(10, 0, 500_000, 0, -10, 5_500_000)) as dst:
        dst.write(pixels)
    return path


def write_nir_folder(root: Path, per_class: int = 4, size: int = 24) -> Path:
    """``root/<class>/<class>_<n>.tif``: 4-band uint16 (R, G, B, NIR), a spectrum per class."""
    rng = np.random.default_rng(1)
    for label, cls in enumerate(NIR_CLASSES):
        spectrum = np.array([600.0, 900.0, 700.0, 3000.0]) * (1.0 + 0.6 * label)
        for n in range(per_class):
            pixels = spectrum[:, None, None] + rng.normal(0, 80, (4, size, size))
            write_raster(root / cls / f"{cls}_{n}.tif", np.clip(pixels, 0, 65535).astype(np.uint16))
    return root


@pytest.fixture(scope="module")
def nir_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_nir_folder(tmp_path_factory.mktemp("nir") / "scenes")


def test_bands_resolve_all_indices_and_names(tmp_path: Path) -> None:
    first = write_raster(tmp_path / "a.tif", np.zeros((13, 8, 8), np.uint16))
    names = tuple(f"B{i:02d}" for i in range(1, 13)) + ("B8A",)
    everything = resolve_bands("all", first, names, (4, 3, 2))
    assert everything.indices == tuple(range(1, 14)) and everything.dtype == "uint16"
    assert everything.rgb == (3, 2, 1)  # B04, B03, B02 at their positions
    chosen = resolve_bands(["B08", 4, "3"], first, names, (4, 3, 2))
    assert chosen.indices == (8, 4, 3) and chosen.names == ("B08", "B04", "B03")
    assert chosen.rgb == (0, 1, 2)  # B02 is not read: the first three bands make the picture
    assert resolve_bands(None, first) is None  # RGB pictures, read as before


@pytest.mark.parametrize("setting, message", [
    ([14], r"band 14 does not exist: '.*a\.tif' has 13 band\(s\)"),
    (["NIR"], r"no band named 'NIR'; its bands have no names: use 1-based indices"),
    ([2, 2], r"lists a band twice"),
    ("some", r"dataset\.bands must be null \(RGB pictures\), all, or a list"),
])
def test_bad_bands_settings_name_the_setting_and_the_file(tmp_path: Path, setting: object, message: str) -> None:
    first = write_raster(tmp_path / "a.tif", np.zeros((13, 8, 8), np.uint16))
    with pytest.raises(ValueError, match=message):
        resolve_bands(setting, first)


def test_an_unsupported_sample_type_says_how_to_convert(tmp_path: Path) -> None:
    first = write_raster(tmp_path / "a.tif", np.zeros((2, 8, 8), np.float64))
    with pytest.raises(ValueError, match=r"float64 samples; rsnet reads uint8, uint16, int16, float32"):
        resolve_bands("all", first)


def test_reading_keeps_the_digital_numbers_and_the_band_order(tmp_path: Path) -> None:
    pixels = np.stack([np.full((16, 16), 1000 * (b + 1), np.uint16) for b in range(5)])
    path = write_raster(tmp_path / "a.tif", pixels)
    bands = resolve_bands([5, 1], path)
    out = bands.read(path, 8)
    assert out.shape == (8, 8, 2) and out.dtype == np.uint16
    assert (out[..., 0] == 5000).all() and (out[..., 1] == 1000).all()  # no stretch, selected order
    short = write_raster(tmp_path / "short.tif", pixels[:3])
    with pytest.raises(CorruptImageError, match=r"short\.tif.*it has 3 band\(s\), and the dataset's files have 5 "
                                                r"\(the model reads bands \[5, 1\]"):
        bands.read(short, 8)


def test_band_statistics_are_those_of_the_rows_given() -> None:
    images = np.random.default_rng(0).normal(500, 40, (10, 6, 6, 3)).astype(np.float32)
    images[..., 2] = 7.0  # a constant band gets std 1
    mean, std = band_statistics(images, [1, 3, 5, 7], chunk=3)
    picked = images[[1, 3, 5, 7]].reshape(-1, 3).astype(np.float64)
    assert np.allclose(mean, picked.mean(0)) and np.allclose(std[:2], picked.std(0)[:2]) and std[2] == 1.0


def test_n_band_augmentation_is_the_same_draw_on_the_host_and_the_device() -> None:
    rng = np.random.default_rng(3)
    images = rng.integers(0, 10_000, (6, 20, 20, 13)).astype(np.uint16)
    mean, std = tuple(float(v) for v in images.mean((0, 1, 2))), tuple(float(v) for v in images.std((0, 1, 2)))
    settings = dict(image_size=16, mean=mean, std=std, scale=(0.5, 1.0), color_jitter=0.3, max_pixel_value=1.0)
    indices = np.arange(6)
    host = HostAugment.for_training(**settings).apply(list(images), indices, seed=5, epoch=2)
    device = DeviceAugment.for_training(**settings).apply(torch.from_numpy(images.astype(np.float32)), indices, 5, 2)
    assert host.shape == (6, 13, 16, 16)
    rounding = 0.5 * 1.3 / min(std)  # the host resizes in uint16 (rounded), the device in float; jitter b <= 1.3
    assert torch.allclose(host, device.contiguous(), atol=1.2 * rounding)
    params = HostAugment.for_training(**settings).draw(5, 2, indices, 20, 20)
    assert params.jittered().any()  # the comparison covered per-band brightness/contrast


def test_per_band_jitter_keeps_each_band_mean_under_contrast() -> None:
    image = np.random.default_rng(0).integers(0, 5000, (8, 8, 4)).astype(np.uint16)
    out = jitter_bands(image, (1.0, 0.5, 1.3))
    assert np.allclose(out.mean((0, 1)), image.mean((0, 1)), rtol=1e-5)  # contrast around the band's own mean
    assert np.allclose(out.std((0, 1)), 0.5 * image.std((0, 1)), rtol=1e-4)
    assert np.allclose(jitter_bands(image, (1.2, 1.0, 1.0)), 1.2 * image.astype(np.float32), rtol=1e-6)


def test_the_disk_cache_holds_the_bands_in_their_own_sample_type(tmp_path: Path) -> None:
    paths = [str(write_raster(tmp_path / f"{i}.tif", np.full((13, 12, 12), 100 * i + 7, np.uint16)))
             for i in range(3)]
    bands = resolve_bands("all", paths[0])
    written = build_store("fake", ["a", "b", "c"], paths, 8, "disk", tmp_path / "cache", decoding=bands)
    assert written.array.shape == (3, 8, 8, 13) and written.array.dtype == np.uint16 and written.decoded == 3
    reused = build_store("fake", ["a", "b", "c"], paths, 8, "disk", tmp_path / "cache", decoding=bands)
    assert reused.decoded == 0 and (np.asarray(reused.array) == np.asarray(written.array)).all()
    assert int(reused.array[2, 0, 0, 12]) == 207
    sidecar = json.loads(next((tmp_path / "cache").glob("*.json")).read_text())
    assert sidecar["bands"]["dtype"] == "uint16" and "high_bit_depth" not in sidecar
    rgb = build_store("fake", ["a", "b", "c"], paths, 8, "disk", tmp_path / "cache",
                      decoding=resolve_bands([1], paths[0]))
    assert rgb.decoded == 3 and rgb.array.shape == (3, 8, 8, 1)  # other bands: another cache file


def test_a_folder_of_four_band_rasters_is_normalised_with_its_training_statistics(nir_folder: Path) -> None:
    data = build_datasets("image_folder", nir_folder, 0.5, 0, 16, bands="all")
    assert data.channels == 4 and data.bands.dtype == "uint16" and data.bands.rgb == (0, 1, 2)
    train_pixels = np.stack([data.train.raw(i) for i in range(len(data.train))]).reshape(-1, 4)
    assert np.allclose(data.mean, train_pixels.mean(0), rtol=1e-6)
    batch, _ = data.test.get_batch(range(len(data.test)))
    assert batch.shape == (len(data.test), 4, 16, 16)
    assert abs(float(batch.mean())) < 0.5  # normalised by the train statistics, not divided by 255
    assert data.footprint == {"pixels": 24.0, "metres": pytest.approx(240.1, abs=0.05),  # 24 px of 10 m (UTM 32N's
                              "source": "the training images' georeference"}
    # central meridian, where a projected metre is 1 / 0.9996 m on the ground)
    picture = data.test.picture(0)
    assert picture.dtype == np.uint8 and picture.shape == (16, 16, 3)


def test_the_rgb_composite_stretches_each_band_for_pictures_only() -> None:
    image = np.zeros((10, 10, 4), np.uint16)
    image[..., 3] = np.arange(100).reshape(10, 10) * 50
    picture = rgb_composite(image, (3, 0, 0))
    assert picture.dtype == np.uint8 and picture[..., 0].max() == 255 and picture[..., 0].min() == 0
    assert (picture[..., 1] == 0).all()


def test_a_pretrained_rgb_first_convolution_is_adapted_to_the_band_count(tmp_path: Path) -> None:
    import timm

    from rsnet.models import build_model

    weights = tmp_path / "test_resnet.pth"
    reference = timm.create_model("test_resnet", pretrained=False)
    torch.save(reference.state_dict(), weights)
    model = build_model("baseline", "test_resnet", 5, pretrained=str(weights), in_chans=4)
    conv = model.backbone.net.conv1[0].weight if isinstance(model.backbone.net.conv1, torch.nn.Sequential) else \
        model.backbone.net.conv1.weight
    rgb = reference.state_dict()[[k for k in reference.state_dict() if k.endswith("weight")][0]]
    assert conv.shape[1] == 4 and model.model_config["in_chans"] == 4
    assert torch.allclose(conv[:, :3], rgb * 3 / 4, atol=1e-6)  # timm repeats the RGB filters, scaled by 3/4
    assert model(torch.zeros(2, 4, 32, 32)).main_logits.shape == (2, 5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eurosat_ms", "rgb_nir_folder"])
def test_multispectral_sets_train_evaluate_export_and_predict(tmp_path: Path, nir_folder: Path, kind: str,
                                                              capfd: pytest.CaptureFixture) -> None:
    if kind == "eurosat_ms":
        root = write_eurosat_ms(tmp_path / "data", per_class=2, size=16)
        dataset = ["dataset=eurosat_ms", f"dataset.root={root.parent}", "dataset.train_ratio=0.5",
                   "dataset.image_size=32"]
        channels, probe = 13, next(root.rglob("Forest_1.tif"))
    else:
        dataset = ["dataset=image_folder", f"dataset.root={nir_folder}", "dataset.bands=all", "dataset.image_size=32"]
        channels, probe = 4, nir_folder / "water" / "water_0.tif"
    run = tmp_path / "run"
    status = run_train(run, *dataset, "backbone=test_resnet", "model=esd_mbenet", "epochs=1", "batch_size=4",
                       "log.progress_bar=false", "trainer.devices=[cpu]")
    assert status == 0, capfd.readouterr().err
    checkpoint = torch.load(run / "checkpoints" / "last.pt", weights_only=False)
    assert len(checkpoint["bands"]["indices"]) == channels == len(checkpoint["mean"])
    assert checkpoint["model_config"]["in_chans"] == channels
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    assert "attention/cam_main" in events.Tags()["images"]  # drawn on the RGB composite of the bands

    scored = command_in_process("evaluate", f"checkpoint={run}", "progress_bar=false", capture=capfd)
    assert scored.returncode == 0, scored.stderr
    tested = len(json.loads((run / "split.json").read_text())["test"])
    assert f"test split ({tested} images): accuracy" in scored.stdout

    exported = command_in_process("export", f"checkpoint={run}", f"out={tmp_path / 'export'}", "format=torchscript",
                                  capture=capfd)
    assert exported.returncode == 0, exported.stderr
    model_json = json.loads((tmp_path / "export" / "model.json").read_text())
    assert model_json["bands"] == checkpoint["bands"] and model_json["max_abs_diff"] == 0

    predicted = command_in_process("predict", f"checkpoint={tmp_path / 'export'}", f"images={probe}",
                                   "progress_bar=false", capture=capfd)
    assert predicted.returncode == 0, predicted.stderr
    assert predicted.stdout.startswith(str(probe)) and predicted.stdout.split("\t")[1] in checkpoint["class_names"]
