"""Maps of whole scenes: ``map_scene``'s window-by-window path against predict's per-file path on the same windows,
and the memory a map takes against the raster's size.

Writes a ``--size`` × ``--size`` 3-band uint8 GeoTIFF (tiled, 512 px blocks, deflate), block by block so that its
generation stays in bounded memory too: each 128 px cell is one of the bundled sample's real images, drawn at random.
Then, measured in one run, interleaved over ``--rounds`` rounds (the order alternating):

(a) ``map_scene`` on the whole grid of ``--window`` px windows (500 px on 20,000 px: 1,600 windows), read from the
    raster on disk one window at a time;
(b) the per-file path on the same windows: the first ``--files`` windows, written beforehand as PNG files,
    classified as rsnet-predict classifies files (``read_image``, then ``preprocess`` / ``probabilities`` in batches);

windows/s of each (best round, and the range), the ratio map / per-file (best rounds), and the resident memory of a
child process that maps the scene alone, before the map and at its peak during it (Linux: /proc/self/status),
beside the raster's size.
The model is an untrained ``--backbone`` baseline at ``--image-size`` px (speed only). The temporary folder holding
the raster and the files is removed afterwards.

    python benchmarks/bench_scene_map.py                               # 20,000 px, 1,600 windows of 500 px
    python benchmarks/bench_scene_map.py --size 4000                   # a quick run: 64 windows
    python benchmarks/bench_scene_map.py --size 1024 --window 256 --no-memory   # a smoke run (the test suite's)
    python benchmarks/bench_scene_map.py --backbone resnet18 --image-size 128
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "ucmerced-mini" / "Images"
CELL = 128  # the sample's images: 128 px
BLOCK = 512


def write_scene(path: Path, size: int, seed: int = 0) -> None:
    """A tiled GeoTIFF of the sample's images at random (EPSG:32611, 0.3 m pixels), written block by block."""
    import rasterio
    from PIL import Image
    from rasterio.transform import Affine

    images = np.stack([np.asarray(Image.open(file).convert("RGB")) for file in sorted(SAMPLE.glob("*/*.jpg"))])
    rng = np.random.default_rng(seed)
    cells = BLOCK // CELL
    with rasterio.open(path, "w", driver="GTiff", height=size, width=size, count=3, dtype="uint8", tiled=True,
                       blockxsize=BLOCK, blockysize=BLOCK, compress="deflate", crs="EPSG:32611",
                       transform=Affine(0.3, 0.0, 500_000.0, 0.0, -0.3, 4_000_000.0)) as dst:
        for _, window in dst.block_windows(1):
            picks = images[rng.integers(0, len(images), cells * cells)].reshape(cells, cells, CELL, CELL, 3)
            block = picks.transpose(0, 2, 1, 3, 4).reshape(BLOCK, BLOCK, 3)[:window.height, :window.width]
            dst.write(np.moveaxis(block, -1, 0), window=window)


def write_checkpoint(path: Path, backbone: str, image_size: int) -> Path:
    """An untrained baseline on ``backbone`` for the sample's 21 classes."""
    import torch

    from rsnet.checkpoint import save_checkpoint
    from rsnet.models import build_model

    torch.manual_seed(0)
    classes = sorted(folder.name for folder in SAMPLE.iterdir())
    model = build_model("baseline", backbone, len(classes)).eval()
    return save_checkpoint(path, {"model_config": model.model_config, "model_state": model.state_dict(),
                                  "class_names": classes, "image_size": image_size, "mean": [0.45] * 3,
                                  "std": [0.25] * 3, "epoch": 0})


def write_window_files(raster: Path, folder: Path, window: int, count: int) -> list[Path]:
    """The first ``count`` windows of the map's grid (row by row), each as a PNG file."""
    from PIL import Image
    from rasterio.windows import Window

    from rsnet.data.raster import open_raster

    folder.mkdir()
    paths = []
    with open_raster(raster) as src:
        columns = src.width // window
        for index in range(min(count, columns * (src.height // window))):
            row, col = divmod(index, columns)
            pixels = src.read([1, 2, 3], window=Window(col * window, row * window, window, window))
            paths.append(folder / f"window_{index:05d}.png")
            Image.fromarray(np.moveaxis(pixels, 0, -1)).save(paths[-1])
    return paths


def per_file(predictor, paths: Sequence[Path], batch: int) -> float:
    """Seconds to classify ``paths`` as rsnet-predict does: decode each file, then a batch at a time."""
    from rsnet.inference import read_image

    started = time.perf_counter()
    for start in range(0, len(paths), batch):
        batch_paths = paths[start:start + batch]
        images = np.stack([read_image(path, predictor.image_size, predictor.decoding) for path in batch_paths])
        predictor.probabilities(predictor.preprocess(images))
    return time.perf_counter() - started


def map_once(predictor, raster: Path, out: Path, window: int, batch: int) -> tuple[float, int]:
    """Seconds to map ``raster`` (the three files written included) and the windows classified."""
    from rsnet.scene_map import map_scene

    started = time.perf_counter()
    result = map_scene(predictor, raster, out, window=window, batch_size=batch, progress=False)
    return time.perf_counter() - started, result.windows


def rss_kib(field: str) -> int:
    """This process's ``VmRSS`` (resident now) or ``VmHWM`` (its peak) in KiB, from /proc/self/status (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def child_map(raster: str, checkpoint: str, window: int, batch: int) -> None:
    """In a child process: map the scene alone; print its resident memory (KiB) before the map and its peak during
    the map (the peak is reset once the model is loaded: /proc/self/clear_refs), as JSON."""
    from rsnet.inference import load_predictor

    predictor = load_predictor(checkpoint, "cpu")
    map_once(predictor, Path(raster).parent / "warm-up.tif", Path(raster).parent / "child-warm-up", window, batch)
    before = rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    seconds, windows = map_once(predictor, Path(raster), Path(raster).parent / "child-map", window, batch)
    print(json.dumps({"before_kib": before, "peak_kib": rss_kib("VmHWM"), "seconds": seconds, "windows": windows}))


def child_peak(raster: Path, checkpoint: Path, window: int, batch: int) -> dict:
    """What :func:`child_map` printed, run in a fresh interpreter."""
    done = subprocess.run([sys.executable, __file__, "--child", str(raster), str(checkpoint), "--window", str(window),
                           "--batch", str(batch)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(args: argparse.Namespace) -> None:
    import torch

    from rsnet.inference import load_predictor

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench_scene_map-") as temporary:
        folder = Path(temporary)
        raster = folder / "scene.tif"
        started = time.perf_counter()
        write_scene(raster, args.size)
        generated = time.perf_counter() - started
        checkpoint = write_checkpoint(folder / "model.pt", args.backbone, args.image_size)
        predictor = load_predictor(checkpoint, "cpu")
        files = write_window_files(raster, folder / "windows", args.window, args.files)
        print(f"scene {args.size} x {args.size} px, 3 x uint8, {raster.stat().st_size / 2**20:.0f} MiB on disk "
              f"(deflate, {BLOCK} px blocks; written in {generated:.1f} s); window {args.window} px; {args.backbone} "
              f"at {args.image_size} px, batch {args.batch}, {torch.get_num_threads()} threads (CPU)")
        write_scene(folder / "warm-up.tif", 2 * args.window)  # a small scene: the first map loads fonts, ...
        map_once(predictor, folder / "warm-up.tif", folder / "warm-up", args.window, args.batch)
        per_file(predictor, files[:args.batch], args.batch)
        rates: dict[str, list[float]] = {"map_scene": [], "per-file": []}
        windows = 0
        for round_ in range(args.rounds):
            for name in (("map_scene", "per-file") if round_ % 2 == 0 else ("per-file", "map_scene")):
                if name == "map_scene":
                    seconds, windows = map_once(predictor, raster, folder / "map", args.window, args.batch)
                    rates[name].append(windows / seconds)
                else:
                    rates[name].append(len(files) / per_file(predictor, files, args.batch))
        peak = None if args.no_memory else child_peak(raster, checkpoint, args.window, args.batch)
    raster_mib = 3 * args.size * args.size / 2**20
    print(f"\n{args.rounds} interleaved rounds\n")
    print("| path | windows | windows/s (best) | range over rounds |")
    print("|---|---:|---:|---|")
    for name, count in (("map_scene", windows), ("per-file", len(files))):
        print(f"| {name} | {count:,} | {max(rates[name]):.1f} | {min(rates[name]):.1f}–{max(rates[name]):.1f} |")
    print(f"\nmap / per-file: {max(rates['map_scene']) / max(rates['per-file']):.2f}x windows/s (best rounds)")
    if peak is None:
        return
    before, during = peak["before_kib"] / 1024, peak["peak_kib"] / 1024
    print(f"a child process mapping the scene alone: resident {before:.0f} MiB before the map (model loaded), peak "
          f"{during:.0f} MiB during it (+{during - before:.0f} MiB) for a raster of {raster_mib:.0f} MiB "
          f"({peak['windows']:,} windows in {peak['seconds']:.1f} s)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=20_000, help="the scene's side in pixels")
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--backbone", default="test_resnet")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=256, help="windows written as files for the per-file path")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-memory", action="store_true", help="leave out the child process measuring memory")
    parser.add_argument("--child", nargs=2, metavar=("RASTER", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_map(*args.child, args.window, args.batch)
    else:
        bench(args)


if __name__ == "__main__":
    main()
