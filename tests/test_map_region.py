"""Mapping a region (rsnet.mapping): windows flush with the scene's edges, a map killed (SIGKILL) at a known chunk
resumes where it stopped to the same files, a partial map's chunks whose bytes do not match their records (cut short,
forged, flipped, missing) are classified again or the map is refused with its folder kept, a second map of a scene
stops at once, complete scenes are skipped only when verified, a folder gets a mosaic;
chunks are claimed by speed - every rule about time proven in this process on speeds and clocks fed by hand (a claim
only if it ends before the others finish the rest, a slow worker left out, the fastest always works, the probe, a
simulated slowdown) - and two real CPU workers give the same files as one, whatever their timing."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import rasterio
import torch
import torch.distributed as dist
from helpers import MINI_ROOT, REPO, command_in_process, compose_command
from PIL import Image
from rasterio.transform import Affine

from rsnet.checkpoint import save_checkpoint
from rsnet.mapping.claims import MARGIN, ClaimBoard
from rsnet.mapping import partial as partial_map
from rsnet.mapping.grid import Axis, WindowGrid
from rsnet.mapping.imagery import Canvas
from rsnet.mapping.partial import (FLAGS, IMAGERY, PROBABILITIES, RECORD, SETTINGS, MapLock, PartialMap,
                                   partial_folder)
from rsnet.mapping.map_worker import PROBE_WINDOWS, _Meter, _probe, _simulated_delay

CLASSES = sorted(path.name for path in (MINI_ROOT / "Images").iterdir())[:6]
OUTPUTS = ("classes.tif", "classes.tif.aux.xml", "classes.qml", "probabilities.tif", "preview.png", "areas.csv",
           "map.json")
MAP = ("window=40", "stride=20", "batch_size=8")  # scene a: 24 x 30 windows, 90 chunks; scene b: 19 x 14, 34 chunks


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


def predict(checkpoint: Path, images: Path, out: Path, *overrides: str, prelude: str | None = None,
            returncode: int = 0) -> subprocess.CompletedProcess:
    """rsnet-predict map= as a user runs it, in a process of its own (and its own process group); ``prelude``: Python
    run in that process first (``python -c prelude scripts/predict.py ...``, which runs the script after it)."""
    script = [str(REPO / "scripts" / "predict.py"), f"checkpoint={checkpoint}", f"images={images}", f"map={out}",
              "progress_bar=false", "device=cpu", *overrides]
    command = [sys.executable, *(["-c", prelude] if prelude else []), *script]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert done.returncode == returncode, done.stderr[-3000:]
    return done


def map_here(checkpoint: Path, images: Path, out: Path, *overrides: str,
             capture: pytest.CaptureFixture) -> subprocess.CompletedProcess:
    """rsnet-predict map= in this process (``helpers.command_in_process``: no interpreter to start)."""
    return command_in_process("predict", f"checkpoint={checkpoint}", f"images={images}", f"map={out}",
                              "progress_bar=false", "device=cpu", *overrides, capture=capture)


def files(folder: Path, stem: str) -> dict[str, bytes]:
    return {suffix: (folder / f"{stem}_{suffix}").read_bytes() for suffix in OUTPUTS}


def chunks_stored(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The chunks of scene a that the maps of this test store from now on (``PartialMap.write_chunk`` recorded)."""
    stored: list[int] = []
    write_chunk = PartialMap.write_chunk

    def recorded(self: PartialMap, chunk: int, *args: object) -> int:
        if self.folder.name == ".a.map-partial":
            stored.append(chunk)
        return write_chunk(self, chunk, *args)

    monkeypatch.setattr(PartialMap, "write_chunk", recorded)
    return stored


@pytest.fixture(scope="module")
def uninterrupted(checkpoint: Path, scenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both scenes mapped in one go (in this process, as ``map_here``), the reference of every other map here."""
    from rsnet.commands.predict import main

    out = tmp_path_factory.mktemp("uninterrupted")
    main(compose_command("predict", f"checkpoint={checkpoint}", f"images={scenes}", f"map={out}",
                         "progress_bar=false", "device=cpu", *MAP))
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


# The function that stores a chunk, wrapped to write its record at once and SIGKILL its own process group right after
# the third record: the kill comes at a known chunk, however fast or starved the machine (no window of time to hit
# from outside).
_KILLED_AFTER_THE_THIRD_RECORD = """
import os, runpy, signal, sys, threading
from rsnet.mapping.partial import PartialMap

write_chunk, lock, recorded = PartialMap.write_chunk, threading.Lock(), []

def killed_after_the_third(self, chunk, *args, **kwargs):
    with lock:  # the lanes store chunks at the same time: one at a time here, so no fourth record precedes the kill
        committed = write_chunk(self, chunk, *args, **kwargs) + self.commit()  # its bytes, on disk, then its record
        recorded.append(chunk)
        if len(recorded) == 3:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        return committed

PartialMap.write_chunk = killed_after_the_third
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_map_killed_at_any_moment_resumes_to_the_same_files(checkpoint: Path, scenes: Path, uninterrupted: Path,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    """rsnet-predict map= killed (SIGKILL) right after it stored its third chunk, a moment that is the same on any
    machine; run again, it classifies only the chunks not stored and writes an uninterrupted map's files."""
    out = tmp_path / "maps"
    killed = predict(checkpoint, scenes, out, *MAP, prelude=_KILLED_AFTER_THE_THIRD_RECORD, returncode=-signal.SIGKILL)
    flags = np.fromfile(partial_folder(out, "a") / FLAGS, RECORD)["done"]
    assert np.count_nonzero(flags) == 3 and len(flags) == 90, killed.stderr[-3000:]  # 3 chunks stored, not all
    assert not (out / "a_classes.tif").exists() and not (out / "a_map.json").exists()  # nothing partial named final
    stored = chunks_stored(monkeypatch)
    resumed = map_here(checkpoint, scenes, out, *MAP, capture=capsys)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert files(out, "a") == files(uninterrupted, "a") and files(out, "b") == files(uninterrupted, "b")
    assert sorted(stored) == sorted(set(range(90)) - set(np.flatnonzero(flags).tolist()))  # the 3 stored: not again
    assert not partial_folder(out, "a").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # nothing temporary left


def test_a_complete_scene_is_skipped_only_when_its_files_check_out(checkpoint: Path, scenes: Path,
                                                                   uninterrupted: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "maps"
    out.mkdir()
    for suffix in OUTPUTS:
        for stem in "ab":
            (out / f"{stem}_{suffix}").write_bytes((uninterrupted / f"{stem}_{suffix}").read_bytes())
    (out / "b_preview.png").write_bytes(b"damaged")
    again = map_here(checkpoint, scenes, out, *MAP, capture=capsys)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "a.tif\tcomplete already" in again.stdout and "b.tif\twrote" in again.stdout
    assert files(out, "b") == files(uninterrupted, "b")
    other = map_here(checkpoint, scenes, out, "window=40", "stride=40", "batch_size=8", capture=capsys)  # made anew
    assert other.returncode == 0, other.stderr[-3000:]
    assert "complete already" not in other.stdout
    assert json.loads((out / "a_map.json").read_text())["settings"]["stride"] == 40


def test_two_cpu_workers_give_the_files_of_one_whatever_their_timing(checkpoint: Path, scenes: Path,
                                                                      uninterrupted: Path, tmp_path: Path) -> None:
    """The one real run of several workers: what holds however the machine shares its cores between them (who
    classified which chunk, or whether one was left out, is timing; the claim rules are proven below on fed
    speeds)."""
    out = tmp_path / "maps"
    shared = predict(checkpoint, scenes, out, *MAP, "device=[cpu,cpu]")
    assert files(out, "a") == files(uninterrupted, "a") and files(out, "b") == files(uninterrupted, "b")
    reports = re.findall(r"^worker (\d) \(cpu\): (\d+) windows classified", shared.stderr, re.MULTILINE)
    assert sorted(rank for rank, _ in reports) == ["0", "1"], shared.stderr[-3000:]  # each worker reports
    windows = sum(json.loads((uninterrupted / f"{stem}_map.json").read_text())["windows"] for stem in "ab")
    assert sum(int(count) for _, count in reports) == windows  # every window classified once, by one of them
    record = json.loads((out / "a_map.json").read_text())
    assert record["classified_on"] == {"cpu": 90} and record["settings"]["amp"] == "none"


# --- a partial map proves its data: every chunk's record matches its bytes, else it is classified again --------------

CHUNK_BYTES = 8 * len(CLASSES) * 4  # a chunk's probabilities: 8 windows x the classes, float32


class Stopped(Exception):
    """Raised where a scene's outputs would be assembled."""


def stop(*args: object) -> None:
    raise Stopped


@pytest.fixture(scope="module")
def partial_a(checkpoint: Path, scenes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding scene a's partial map, every chunk stored and recorded, stopped before its outputs."""
    from rsnet.commands.predict import main

    out = tmp_path_factory.mktemp("partial")
    with pytest.MonkeyPatch.context() as patch, pytest.raises(Stopped):
        patch.setattr("rsnet.mapping.map_worker.assemble_scene", stop)
        main(compose_command("predict", f"checkpoint={checkpoint}", f"images={scenes / 'a.tif'}", f"map={out}",
                             "progress_bar=false", "device=cpu", *MAP))
    assert np.fromfile(partial_folder(out, "a") / FLAGS, RECORD)["done"].all()
    return out


def resume(checkpoint: Path, scenes: Path, out: Path, capture: pytest.CaptureFixture,
           returncode: int = 0) -> subprocess.CompletedProcess:
    """Map scene a into ``out`` again; its exit status must be ``returncode`` (2: with no traceback)."""
    done = map_here(checkpoint, scenes / "a.tif", out, *MAP, capture=capture)
    assert done.returncode == returncode and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def copied(partial: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the folder ``partial`` and its partial map of scene a."""
    shutil.copytree(partial, tmp_path / "maps")
    return tmp_path / "maps", partial_folder(tmp_path / "maps", "a")


def overwrite(path: Path, offset: int, payload: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(payload)


def test_a_chunks_record_is_written_only_once_its_bytes_are_on_the_disk(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 100 x 100 px scene of 50 px windows: 2 chunks of 2 windows; chunk 1 stored, chunk 0 never."""
    grid, canvas = WindowGrid(100, 100, 50, 50, 2), Canvas(100, 100, (0, 1, 2), "uint8", False)
    partial, found = PartialMap.prepare(tmp_path / ".s.map-partial", {"scene": "s"}, grid, 3, canvas)
    events: list[tuple[str, int]] = []
    write_all = partial_map._write_all
    monkeypatch.setattr(partial_map, "COMMIT_SECONDS", float("inf"))  # records only when the test commits
    monkeypatch.setattr(partial_map, "_sync", lambda fd: events.append(("sync", fd)))
    monkeypatch.setattr(partial_map, "_write_all", lambda fd, payload, offset: (events.append(("write", fd)),
                                                                                 write_all(fd, payload, offset)))
    strip = canvas.piece(np.full((3, 50, 100), 7, np.uint8), None, 50, 0)  # chunk 1: the strip of windows 2 and 3
    assert found == "" and partial.write_chunk(1, np.full((2, 3), 0.5), [strip]) == 0 and not partial.is_done(1)
    assert partial.commit() == 1 and partial.is_done(1)
    probabilities, imagery, flags = (partial._fd(name) for name in (PROBABILITIES, IMAGERY, FLAGS))
    assert events == [("write", probabilities), *[("write", imagery)] * 50, ("sync", probabilities),
                      ("sync", imagery), ("write", flags)]  # the bytes, on the disk, then the record
    assert partial.verified().tolist() == [False, True]  # chunk 0: zeros, and no record
    with pytest.raises(ValueError, match=r"\(chunk\(s\) 0 of 2 have no record or do not match it\); the folder is"):
        partial.prove()
    partial.close()


def test_each_chunks_record_names_the_kind_of_device_that_classified_it(tmp_path: Path) -> None:
    """A map made on a GPU and a CPU together says how many chunks each classified (the map's record copies it)."""
    grid, canvas = WindowGrid(100, 100, 50, 50, 2), Canvas(100, 100, (0, 1, 2), "uint8", False)
    folder = tmp_path / ".s.map-partial"
    PartialMap.prepare(folder, {"scene": "s"}, grid, 3, canvas)[0].close()
    strips = [canvas.piece(np.full((3, 50, 100), 7, np.uint8), None, row, 0) for row in (0, 50)]
    for chunk, device in ((0, "cuda"), (1, "cpu")):
        partial = PartialMap(folder, grid, 3, canvas, device)
        partial.write_chunk(chunk, np.full((2, 3), 0.5), [strips[chunk]])
        assert partial.commit() == 1
        partial.close()
    partial = PartialMap(folder, grid, 3, canvas)
    assert partial.classified_on() == {"cpu": 1, "cuda": 1} and partial.verified().tolist() == [True, True]
    partial.close()


def test_a_cut_short_probabilities_file_is_classified_again_from_where_it_was_cut(
        checkpoint: Path, scenes: Path, uninterrupted: Path, partial_a: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    out, folder = copied(partial_a, tmp_path)
    os.truncate(folder / PROBABILITIES, 40 * CHUNK_BYTES + 100)  # chunks 0-39 whole, chunk 40 cut in the middle
    stored = chunks_stored(monkeypatch)
    done = resume(checkpoint, scenes, out, capsys)
    assert f"{folder}: windows.f32 holds 7780 of 17280 bytes; chunk(s) 40-89 of 90 do not match their records" in \
        done.stderr, done.stderr
    assert sorted(stored) == list(range(40, 90)) and files(out, "a") == files(uninterrupted, "a")
    assert not folder.exists()


def test_records_of_chunks_never_written_are_not_trusted(checkpoint: Path, scenes: Path, uninterrupted: Path,
                                                         partial_a: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """Chunks 10-19 flagged done (as the one-byte flags of before) over bytes never written (sparse zeros)."""
    out, folder = copied(partial_a, tmp_path)
    overwrite(folder / PROBABILITIES, 10 * CHUNK_BYTES, bytes(10 * CHUNK_BYTES))
    overwrite(folder / FLAGS, 10 * RECORD.itemsize, b"\x01".ljust(RECORD.itemsize, b"\x00") * 10)
    stored = chunks_stored(monkeypatch)
    done = resume(checkpoint, scenes, out, capsys)
    assert f"{folder}: chunk(s) 10-19 of 90 do not match their records" in done.stderr, done.stderr
    assert sorted(stored) == list(range(10, 20)) and files(out, "a") == files(uninterrupted, "a")


@pytest.mark.parametrize(("name", "offset"), [(PROBABILITIES, 33 * CHUNK_BYTES + 5), (IMAGERY, (250 * 620 + 300) * 3)])
def test_a_flipped_byte_in_a_done_chunk_is_classified_again(checkpoint: Path, scenes: Path, uninterrupted: Path,
                                                            partial_a: Path, tmp_path: Path, name: str, offset: int,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    """A bit of a probability (a value off by a hair), or of the preview's imagery (canvas pixel 250, 300)."""
    out, folder = copied(partial_a, tmp_path)
    byte = (folder / name).read_bytes()[offset]
    overwrite(folder / name, offset, bytes([byte ^ 0x01]))
    stored = chunks_stored(monkeypatch)
    done = resume(checkpoint, scenes, out, capsys)
    assert stored and "do not match their records" in done.stderr, done.stderr
    assert stored == [33] if name == PROBABILITIES else 0 < len(stored) < 90
    assert files(out, "a") == files(uninterrupted, "a")


@pytest.mark.parametrize(("name", "said"), [(PROBABILITIES, "windows.f32 is missing; chunk(s) 0-89 of 90 do not "
                                                            "match their records"),
                                            (FLAGS, "chunks.done is missing; the chunks not proven"),
                                            (SETTINGS, "settings.json is missing or unreadable: the scene is mapped "
                                                       "afresh")])
def test_a_missing_file_of_a_partial_map_is_made_again(checkpoint: Path, scenes: Path, uninterrupted: Path,
                                                       partial_a: Path, tmp_path: Path, name: str, said: str,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    out, folder = copied(partial_a, tmp_path)
    (folder / name).unlink()
    stored = chunks_stored(monkeypatch)
    done = resume(checkpoint, scenes, out, capsys)
    assert f"{folder}: {said}" in done.stderr, done.stderr
    assert sorted(stored) == list(range(90)) and files(out, "a") == files(uninterrupted, "a")


def test_a_map_that_cannot_be_proved_is_one_line_and_keeps_its_folder(checkpoint: Path, scenes: Path,
                                                                      uninterrupted: Path, partial_a: Path,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """Chunk 7's bytes lost after it was stored (a disk that dropped them, or another hand), before the map ends."""
    out, folder = copied(partial_a, tmp_path)
    overwrite(folder / FLAGS, 0, bytes(10 * RECORD.itemsize))  # chunks 0-9 to classify
    write_chunk = PartialMap.write_chunk

    def lost(self: PartialMap, chunk: int, *args: object) -> int:
        committed = write_chunk(self, chunk, *args)
        if chunk == 7:
            overwrite(self.folder / PROBABILITIES, 7 * CHUNK_BYTES, bytes(CHUNK_BYTES))
        return committed

    monkeypatch.setattr(PartialMap, "write_chunk", lost)
    done = resume(checkpoint, scenes, out, capsys, returncode=2)
    assert done.stderr.splitlines()[-1] == (
        f"error: {folder}: the map cannot be proved from its data (chunk(s) 7 of 90 have no record or do not match "
        "it); the folder is kept: run the same command again to classify those chunks again")
    assert folder.is_dir() and not (out / "a_map.json").exists() and not (out / "a_classes.tif").exists()
    monkeypatch.undo()
    stored = chunks_stored(monkeypatch)
    again = resume(checkpoint, scenes, out, capsys)
    assert f"{folder}: chunk(s) 7 of 90 do not match their records" in again.stderr
    assert stored == [7] and files(out, "a") == files(uninterrupted, "a")


def test_a_second_map_of_a_scene_being_mapped_stops_at_once(checkpoint: Path, scenes: Path, partial_a: Path,
                                                            tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    out, folder = copied(partial_a, tmp_path)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    stored = chunks_stored(monkeypatch)
    with MapLock(out, "a"):  # held as the workers of a map hold it
        done = resume(checkpoint, scenes, out, capsys, returncode=2)
    assert done.stderr.splitlines()[-1] == (
        f"error: {folder}: another map of a into {out} is running (pid {os.getpid()}); wait for it to finish, stop "
        "it, or map into another folder")
    assert stored == [] and {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert sorted(path.name for path in out.iterdir()) == [".a.map-partial"]  # the lock's files go with it


# --- claims by speed, on speeds fed by hand ---------------------------------------------------------------------------

def boards(speeds: list[float | None], total: int, claimed: int = 0) -> list[ClaimBoard]:
    """One ClaimBoard per worker on one in-memory c10d store (torch's HashStore: the workers' store, in this process),
    each worker's measured windows/s published by hand (None: not measured yet), ``claimed`` of the map's ``total``
    windows claimed already."""
    store = dist.HashStore()
    claims = [ClaimBoard(store, rank, len(speeds), total) for rank in range(len(speeds))]
    for board, speed in zip(claims, speeds):
        if speed is not None:
            board.publish_speed(speed)
    claims[0].count_claimed(claimed)
    return claims


def claims_one_more(own: float, others: list[float | None], held: int = 0, remaining: int = 80,
                    batch: int = 8) -> bool:
    """Whether the last worker, at ``own`` windows/s with ``held`` windows claimed, claims one more chunk of
    ``batch`` windows while ``remaining`` of the map's windows are unclaimed and the others run at ``others``."""
    board = boards([*others, own], total=100, claimed=100 - remaining)[-1]
    return board.worth_claiming(own, held, batch)


def test_a_worker_claims_a_chunk_only_if_it_would_finish_it_before_the_others_finish_the_rest() -> None:
    # 80 windows unclaimed, the other worker at 10 windows/s: the rest after one more chunk of 8 takes it 7.2 s, and
    # the chunk (with what the worker holds already) must take at most MARGIN of that, 6.48 s
    assert MARGIN == 0.9
    assert claims_one_more(1.25, [10.0])  # 8 windows at 1.25/s: 6.4 s
    assert not claims_one_more(1.2, [10.0])  # 6.67 s
    assert claims_one_more(2.5, [10.0], held=8)  # 16 windows at 2.5/s: 6.4 s
    assert not claims_one_more(2.5, [10.0], held=16)  # 24 windows: 9.6 s
    assert claims_one_more(1.2, [10.0], remaining=160)  # more left: the others need 15.2 s for the rest
    assert claims_one_more(1.25, [5.0, 5.0]) and not claims_one_more(1.2, [5.0, 5.0])  # the others' speeds add up


def test_the_fastest_worker_always_works_and_one_alone_or_unmeasured_too() -> None:
    assert claims_one_more(10.0, [10.0], remaining=8) and claims_one_more(10.5, [10.0, 1.0], remaining=8)  # the
    # last chunk, which the others would finish in no time: the fastest takes it (equal workers both are fastest)
    assert claims_one_more(0.0, [10.0])  # not measured yet (before its probe)
    assert claims_one_more(0.1, [None]) and claims_one_more(0.1, [0.0])  # the others unmeasured, or left out


def test_a_slow_worker_is_left_out_for_the_rest_of_the_map_and_says_why(capsys: pytest.CaptureFixture) -> None:
    fast, slow = boards([100.0, 100.0 / 300], total=160, claimed=8)  # a probe 300 times slower (slowdown=300)
    assert not slow.worth_claiming(100.0 / 300, 0, 8)
    assert capsys.readouterr().err == (
        "worker 1 left out of the rest of the map: 8 windows would take it 24.00 s (0.3 windows/s), the others "
        "classify the remaining 144 in 1.44 s (100.0 windows/s)\n")
    assert slow.left_out and slow.store.get("map/speed/1") == b"0.0"  # the others count on it no more
    assert not slow.worth_claiming(1000.0, 0, 8)  # out for the rest of the map, whatever it measures next
    assert fast.worth_claiming(100.0, 0, 8) and not fast.left_out  # alone now
    assert capsys.readouterr().err == ""


def test_of_two_workers_that_each_see_the_other_as_faster_one_stays() -> None:
    first, second = boards([0.1, 10.0], total=160, claimed=8)
    assert not first.worth_claiming(0.1, 0, 8) and first.left_out
    # the second read the speeds at the same moment as the first, before the first had left, and measured itself
    # as slow as the first did: it sees the first as the faster one
    second.store.set("map/speed/0", repr(10.0))
    assert second.worth_claiming(0.1, 0, 8) and not second.left_out  # the last worker never leaves
    assert int(second.store.add("map/left_out", 0)) == 1


def share_out(speeds: list[float], chunks: int, batch: int = 8) -> tuple[dict[int, list[int]], list[float]]:
    """Workers at ``speeds`` (windows/s, fed) claim the ``chunks`` of a scene as map_worker does, each asking for its
    next chunk when it is free (time simulated: a chunk takes ``batch`` / speed s; the worker free first asks first):
    the chunks each classified, and when each finished."""
    claims = boards(list(speeds), total=chunks * batch)
    free_at, classified = [0.0] * len(speeds), {rank: [] for rank in range(len(speeds))}
    working = set(range(len(speeds)))
    while working:
        rank = min(working, key=lambda worker: (free_at[worker], worker))
        board = claims[rank]
        chunk = board.claim(0, chunks) if board.worth_claiming(speeds[rank], 0, batch) else None
        if chunk is None:
            working.discard(rank)
            continue
        board.count_claimed(batch)
        classified[rank].append(chunk)
        free_at[rank] += batch / speeds[rank]
    return classified, free_at


@pytest.mark.parametrize("speeds", [(10.0, 10.0), (10.0, 1.0), (10.0, 10.0 / 300)],
                         ids=["equal", "10x-slower", "300x-slower"])
def test_workers_share_a_map_by_their_speeds_and_a_slow_one_never_finishes_last(
        speeds: tuple[float, float], capsys: pytest.CaptureFixture) -> None:
    classified, finished = share_out(list(speeds), chunks=20)
    assert sorted(classified[0] + classified[1]) == list(range(20))  # every chunk once
    left_out = capsys.readouterr().err
    if speeds[0] == speeds[1]:
        assert len(classified[0]) == len(classified[1]) == 10 and left_out == ""  # both did a part, a half each
    else:
        assert "worker 1 left out of the rest of the map" in left_out and 19 in classified[0]
        assert finished[1] <= finished[0]  # the slow worker's last chunk ends before the fast one's
        assert (len(classified[1]) > 0) == (speeds[1] == 1.0)  # 10x slower: a part; 300x: none


# --- the probe, the simulated slowdown and the meter, on clocks fed by hand -------------------------------------------

class FedClock:
    """A clock that only a sleep advances."""

    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class FedProbe:
    """A stand-in WindowClassifier whose probe took the seconds it is fed."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.asked = seconds, []

    def probe(self, windows: int) -> float:
        self.asked.append(windows)
        return self.seconds


def test_the_probe_publishes_its_windows_per_second_stretched_by_the_simulated_slowdown() -> None:
    board = boards([None, None], total=100)[1]
    slow, delays = SimpleNamespace(slowdown=300.0), []
    probe = FedProbe(0.5)
    speed = _probe(slow, probe, board, 8, delay=lambda *args: delays.append(args))
    assert probe.asked == [PROBE_WINDOWS] and speed == PROBE_WINDOWS / (0.5 * 300)
    assert delays == [(slow, 0.5, board)]  # the slowdown served as a delay, which ends once the map is claimed
    assert board.store.get("map/speed/1") == repr(speed).encode()  # published before the first claim
    small = FedProbe(0.5)
    assert _probe(SimpleNamespace(slowdown=1.0), small, board, 2, delay=lambda *args: None) == 4.0
    assert small.asked == [2]  # no more windows than a chunk holds


def test_a_simulated_slowdown_sleeps_its_share_and_a_probes_sleep_ends_once_the_map_is_claimed() -> None:
    clock = FedClock()
    _simulated_delay(SimpleNamespace(slowdown=4.0), 0.5, clock=clock, sleep=clock.sleep)
    assert clock.now == pytest.approx(1.5) and max(clock.slept) <= 0.02  # (4 - 1) x 0.5 s, in short sleeps
    clock = FedClock()
    _simulated_delay(SimpleNamespace(slowdown=1.0), 0.5, clock=clock, sleep=clock.sleep)
    assert clock.slept == []
    board, clock = boards([None, None], total=100)[1], FedClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.slept) == 10:
            board.count_claimed(100)  # the other worker claimed the whole map meanwhile

    _simulated_delay(SimpleNamespace(slowdown=300.0), 0.5, board, clock=clock, sleep=sleep)
    assert len(clock.slept) == 10 and clock.now == pytest.approx(0.2)  # not the 149.5 s of the slowdown


def test_the_meter_counts_the_seconds_spent_classifying_scenes_only() -> None:
    clock = FedClock()
    meter = _Meter(2.5, clock=clock)
    assert meter.speed == 2.5  # the probe's until a chunk is classified
    meter.start()
    clock.now = 2.0
    meter.add(8)
    assert meter.speed == 4.0
    clock.now = 3.0
    meter.stop()  # the scene done; writing its outputs, preparing the next one: not classifying
    clock.now = 100.0
    meter.start()
    clock.now = 101.0
    meter.add(8)
    assert (meter.windows, meter.busy, meter.speed) == (16, 3.0, 4.0)


def test_a_precision_that_is_not_one_is_refused_before_anything(checkpoint: Path, scenes: Path,
                                                                tmp_path: Path) -> None:
    from rsnet.mapping.region import map_scenes

    with pytest.raises(ValueError) as refused:
        map_scenes(checkpoint, [scenes / "a.tif"], tmp_path / "maps", devices=["cpu"], amp="fp32")
    assert str(refused.value).startswith("amp='fp32': use bf16 (mixed precision in bfloat16), fp16")
    assert not (tmp_path / "maps").exists()
