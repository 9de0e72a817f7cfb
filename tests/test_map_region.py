"""Mapping a region (rsnet.mapping): windows flush with the scene's edges, a map killed at any moment resumes to the
same files, complete scenes are skipped only when verified, several CPU workers share a map by speed (a slow one
left out) with the same result, a folder gets a mosaic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from helpers import MINI_ROOT, REPO
from PIL import Image
from rasterio.transform import Affine

from rsnet.checkpoint import save_checkpoint
from rsnet.mapping.grid import Axis, WindowGrid
from rsnet.mapping.partial import FLAGS, partial_folder

CLASSES = sorted(path.name for path in (MINI_ROOT / "Images").iterdir())[:6]
OUTPUTS = ("classes.tif", "probabilities.tif", "preview.png", "areas.csv", "map.json")


def test_windows_end_flush_with_the_scene_and_every_cell_takes_the_windows_over_its_centre() -> None:
    grid = WindowGrid(1087, 1976, 257, 257, 32)  # an orthophoto mapped with 257 px windows
    assert grid.rows.offsets.tolist() == [0, 257, 514, 771, 830]  # the last one flush with the bottom edge
    assert grid.cols.offsets.tolist() == [0, 257, 514, 771, 1028, 1285, 1542, 1719]
    assert grid.cells == (5, 8) and grid.windows == 40 and grid.chunks == 2
    assert grid.rows.cell_pixels.tolist() == [257, 257, 257, 257, 59]  # the last cell overhangs the scene
    # cell row 3 (pixels 771..1027) holds the centres of the windows at 771 and 830; row 4 (1028..1086) the last one
    assert [grid.rows.windows_of_cell(i) for i in range(5)] == [(0, 1), (1, 2), (2, 3), (3, 5), (4, 5)]
    exact = Axis(1024, 128, 128)
    assert exact.offsets.tolist() == list(range(0, 1024, 128)) and exact.cells == 8  # no extra window
    overlapping = Axis(300, 128, 64)
    assert overlapping.offsets.tolist() == [0, 64, 128, 172]
    for axis in (grid.rows, grid.cols, exact, overlapping, Axis(129, 128, 1)):
        spans = [axis.windows_of_cell(cell) for cell in range(axis.cells)]
        assert all(first < stop for first, stop in spans)  # every cell of the scene has a window


def test_chunks_are_fixed_runs_of_windows() -> None:
    grid = WindowGrid(300, 300, 128, 64, 5)
    assert grid.windows == 16 and grid.chunks == 4
    assert list(grid.chunk_windows(3)) == [15] and grid.corner(15) == (172, 172) and grid.corner(4) == (64, 0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained baseline test_resnet at 32 px whose answers vary over the sample's images."""
    from rsnet.models import build_model

    torch.manual_seed(1)
    model = build_model("baseline", "test_resnet", len(CLASSES)).eval()
    with torch.no_grad():
        model.cam_classifiers()["main"].weight.mul_(40)
    payload = {"model_config": model.model_config, "model_state": model.state_dict(), "class_names": CLASSES,
               "image_size": 32, "mean": [0.45] * 3, "std": [0.25] * 3, "epoch": 0}
    return save_checkpoint(tmp_path_factory.mktemp("model") / "best.pt", payload)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two georeferenced mosaics of the sample's real images side by side (500 x 620 px and 400 x 300 px, EPSG:32611,
    0.3 m pixels, the second 200 m east of the first)."""
    folder = tmp_path_factory.mktemp("scenes")
    images = [np.asarray(Image.open(path).convert("RGB")) for path in sorted((MINI_ROOT / "Images").glob("*/*.jpg"))]
    rng = np.random.default_rng(0)
    for name, (height, width), west in (("a", (500, 620), 500_000.0), ("b", (400, 300), 500_200.0)):
        tiles = np.stack([images[i] for i in rng.integers(0, len(images), 25)]).reshape(5, 5, 128, 128, 3)
        pixels = tiles.transpose(0, 2, 1, 3, 4).reshape(640, 640, 3)[:height, :width]
        with rasterio.open(folder / f"{name}.tif", "w", driver="GTiff", height=height, width=width, count=3,
                           dtype="uint8", crs="EPSG:32611", transform=Affine(0.3, 0, west, 0, -0.3, 4_000_000.0),
                           tiled=True, blockxsize=128, blockysize=128) as dst:
            dst.write(np.moveaxis(pixels, -1, 0))
    return folder


def predict(checkpoint: Path, images: Path, out: Path, *overrides: str, wait: bool = True) -> subprocess.Popen:
    """rsnet-predict map= as a user runs it (a process of its own)."""
    command = [sys.executable, str(REPO / "scripts" / "predict.py"), f"checkpoint={checkpoint}", f"images={images}",
               f"map={out}", "progress_bar=false", "device=cpu", *overrides]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONHASHSEED": "0"}, start_new_session=True)
    if wait:
        out_text, err_text = process.communicate(timeout=300)
        assert process.returncode == 0, err_text[-3000:]
        process.stdout_text, process.stderr_text = out_text, err_text  # type: ignore[attr-defined]
    return process


def files(folder: Path, stem: str) -> dict[str, bytes]:
    return {suffix: (folder / f"{stem}_{suffix}").read_bytes() for suffix in OUTPUTS}


@pytest.fixture(scope="module")
def uninterrupted(checkpoint: Path, scenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    predict(checkpoint, scenes, out, "window=40", "stride=20", "batch_size=8")
    return out


def test_a_folder_maps_every_scene_flush_to_its_edges_with_a_mosaic(uninterrupted: Path) -> None:
    with rasterio.open(uninterrupted / "a_classes.tif") as classes:
        assert (classes.height, classes.width) == (25, 31)  # ceil(500 / 20), ceil(620 / 20)
        assert (classes.read(1) != classes.nodata).all()  # every cell has a class, the edges too
    with rasterio.open(uninterrupted / "mosaic_classes.vrt") as mosaic:
        assert mosaic.res == (6.0, 6.0) and mosaic.crs.to_epsg() == 32611
        right = 500_200.0 + 300 * 0.3  # scene b's east edge, on a grid of 6 m cells that starts at scene a's west edge
        assert mosaic.bounds.left == 500_000.0 and right <= mosaic.bounds.right < right + 6
        a_cell = mosaic.index(500_000.0 + 3 * 6 + 1, 4_000_000.0 - 2 * 6 - 1)  # cell (2, 3) of scene a
        with rasterio.open(uninterrupted / "a_classes.tif") as classes:
            assert mosaic.read(1)[a_cell] == classes.read(1)[2, 3]
    areas = (uninterrupted / "a_areas.csv").read_text().splitlines()
    assert areas[0] == "class,cells,share,hectares" and len(areas) == 1 + len(CLASSES)
    hectares = sum(float(line.split(",")[3]) for line in areas[1:])
    assert hectares == pytest.approx(500 * 620 * 0.09 / 10_000, abs=0.02)  # the scene's area, not the cells'


def test_a_map_killed_at_any_moment_resumes_to_the_same_files(checkpoint: Path, scenes: Path, uninterrupted: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "maps"
    process = predict(checkpoint, scenes, out, "window=40", "stride=20", "batch_size=8", "slowdown=[6.0]",
                      wait=False)
    flags = partial_folder(out, "a") / FLAGS
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill it once some chunks of the first scene are stored, not all
        if flags.exists() and 3 <= np.count_nonzero(np.fromfile(flags, np.uint8)) < 50:
            break
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    done = np.count_nonzero(np.fromfile(flags, np.uint8))
    assert 3 <= done < len(np.fromfile(flags, np.uint8))
    assert not (out / "a_classes.tif").exists() and not (out / "a_map.json").exists()  # nothing partial named final
    resumed = predict(checkpoint, scenes, out, "window=40", "stride=20", "batch_size=8")
    assert files(out, "a") == files(uninterrupted, "a") and files(out, "b") == files(uninterrupted, "b")
    assert not partial_folder(out, "a").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # nothing temporary left
    assert resumed.returncode == 0


def test_a_complete_scene_is_skipped_only_when_its_files_check_out(checkpoint: Path, scenes: Path,
                                                                   uninterrupted: Path, tmp_path: Path) -> None:
    out = tmp_path / "maps"
    out.mkdir()
    for suffix in OUTPUTS:
        for stem in "ab":
            (out / f"{stem}_{suffix}").write_bytes((uninterrupted / f"{stem}_{suffix}").read_bytes())
    (out / "b_preview.png").write_bytes(b"damaged")
    again = predict(checkpoint, scenes, out, "window=40", "stride=20", "batch_size=8")
    assert "a.tif\tcomplete already" in again.stdout_text and "b.tif\twrote" in again.stdout_text
    assert files(out, "b") == files(uninterrupted, "b")
    other = predict(checkpoint, scenes, out, "window=40", "stride=40", "batch_size=8")  # other settings: made anew
    assert "complete already" not in other.stdout_text
    assert json.loads((out / "a_map.json").read_text())["settings"]["stride"] == 40


@pytest.mark.parametrize("slowdown", [None, "[1.0,300.0]"])
def test_two_cpu_workers_share_a_map_by_speed_with_the_same_result(checkpoint: Path, scenes: Path, uninterrupted: Path,
                                                                  tmp_path: Path, slowdown: str | None) -> None:
    out = tmp_path / "maps"
    shared = predict(checkpoint, scenes, out, "window=40", "stride=20", "batch_size=8", "device=[cpu,cpu]",
                     *([f"slowdown={slowdown}"] if slowdown else []))
    assert files(out, "a") == files(uninterrupted, "a") and files(out, "b") == files(uninterrupted, "b")
    lines = [line for line in shared.stderr_text.splitlines() if "windows classified" in line]
    assert len(lines) == 2, shared.stderr_text[-3000:]
    if slowdown:
        assert "worker 1 left out of the rest of the map" in shared.stderr_text
    else:
        assert all(" 0 windows classified" not in line for line in lines)  # both did a part
