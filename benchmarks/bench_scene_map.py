"""Maps of whole scenes: the map's windows/s against the model's own forward rate on random windows of the same shape,
the reader pool's share, a slow partner, and the memory a map takes against the raster's size.

Writes a ``--size`` × ``--size`` 3-band uint8 GeoTIFF (tiled, 512 px blocks, deflate), block by block so that its
generation stays in bounded memory too: each 128 px cell is one of the bundled sample's real images, drawn at random.
Then, measured in one run, interleaved over ``--rounds`` rounds (the order alternating):

(a) ``map_scene`` on the whole grid of ``--window`` px windows, read from the raster on disk, with ``--readers``
    reader threads (and, with ``--compare-readers``, with 1);
(b) the model's forward rate: batches of random windows (already decoded, the map's batch size) classified as the map
    classifies them (the same lanes: on a CPU one forward per core, each on one thread; a GPU's one lane), and as one
    forward on every core; the better of the two is the model's rate;

windows/s of each (best round, and the range) and the ratio map / forward. With ``--partner N`` (or
``--beside-cpu``): whole ``rsnet-predict map=`` runs (start-up included) on ``--device`` alone and beside a CPU worker
(slowed N times, SIMULATED), interleaved, and the ratio pair / alone. With memory (default): the resident memory of a
child process that maps the scene alone, before the map and at its peak, beside the raster's size. The model is an
untrained ``--backbone`` baseline at ``--image-size`` px (speed only). The temporary folder is removed afterwards.

    python benchmarks/bench_scene_map.py --size 20000 --window 128 --backbone resnet18 --image-size 128
    python benchmarks/bench_scene_map.py --size 20000 --window 500 --compare-readers   # test_resnet at 64 px
    python benchmarks/bench_scene_map.py --size 4000 --window 128 --partner 300 --no-memory
    python benchmarks/bench_scene_map.py --size 1024 --window 256 --rounds 1 --no-memory   # a smoke run (the tests')
    python benchmarks/bench_scene_map.py --device cuda --size 20000 --window 128 --backbone resnet18 --image-size 128 \
        --batch 256 --beside-cpu --rounds 2 --no-memory                                   # a GPU, and a GPU + the CPU
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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


def map_once(predictor, raster: Path, out: Path, window: int, batch: int, readers: int) -> tuple[float, int]:
    """Seconds to map ``raster`` afresh (its files written included) and the windows classified."""
    from rsnet.mapping.region import map_scene

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    result = map_scene(predictor, raster, out, window=window, batch_size=batch, progress=False, readers=readers)
    return time.perf_counter() - started, result.windows


def forward_rates(predictor, batch: int, batches: int) -> tuple[float, float]:
    """Windows/s of the model on random decoded windows: on the map's lanes (on a CPU one single-threaded forward per
    core; on a GPU its one lane), and as one forward on every core (a GPU: the same)."""
    import torch

    from rsnet.mapping.forward import WindowClassifier

    classifier = WindowClassifier(predictor)
    size = predictor.image_size
    images = np.random.default_rng(0).integers(0, 256, (batch, size, size, 3)).astype(np.uint8)
    cores = torch.get_num_threads()
    classifier(images)
    started = time.perf_counter()
    for _ in range(batches):
        classifier(images)  # returns the probabilities on the host: the GPU has finished
    whole = batches * batch / (time.perf_counter() - started)
    if predictor.device.type == "cuda":
        return whole, whole
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(cores) as lanes:
            list(lanes.map(lambda _: classifier(images), range(cores)))
            started = time.perf_counter()
            list(lanes.map(lambda _: classifier(images), range(batches)))
            laned = batches * batch / (time.perf_counter() - started)
    finally:
        torch.set_num_threads(cores)
    return laned, whole


def predict_run(raster: Path, checkpoint: Path, out: Path, window: int, batch: int, devices: str,
                slowdown: str | None = None) -> float:
    """Seconds of a whole ``rsnet-predict map=`` run (a process of its own)."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, str(REPO / "scripts" / "predict.py"), f"checkpoint={checkpoint}", f"images={raster}",
               f"map={out}", f"window={window}", f"batch_size={batch}", f"device={devices}", "progress_bar=false"]
    started = time.perf_counter()
    done = subprocess.run(command + ([f"slowdown={slowdown}"] if slowdown else []), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return time.perf_counter() - started


def rss_kib(field: str) -> int:
    """This process's ``VmRSS`` (resident now) or ``VmHWM`` (its peak) in KiB, from /proc/self/status (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def child_map(raster: str, checkpoint: str, window: int, batch: int, readers: int) -> None:
    """In a child process: map the scene alone; print its resident memory (KiB) before the map and its peak during
    the map (the peak is reset once the model is loaded and a small map made: /proc/self/clear_refs), as JSON."""
    from rsnet.inference import load_predictor

    predictor = load_predictor(checkpoint, "cpu")
    folder = Path(raster).parent
    map_once(predictor, folder / "warm-up.tif", folder / "child-warm-up", window, batch, readers)
    before = rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    seconds, windows = map_once(predictor, Path(raster), folder / "child-map", window, batch, readers)
    print(json.dumps({"before_kib": before, "peak_kib": rss_kib("VmHWM"), "seconds": seconds, "windows": windows}))


def child_peak(raster: Path, checkpoint: Path, window: int, batch: int, readers: int) -> dict:
    """What :func:`child_map` printed, run in a fresh interpreter."""
    done = subprocess.run([sys.executable, __file__, "--child", str(raster), str(checkpoint), "--window", str(window),
                           "--batch", str(batch), "--readers", str(readers)], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _row(name: str, values: Sequence[float], count: int | str) -> str:
    return f"| {name} | {count} | {max(values):.1f} | {min(values):.1f}–{max(values):.1f} |"


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
        predictor = load_predictor(checkpoint, args.device)
        where = torch.cuda.get_device_name(predictor.device) if predictor.device.type == "cuda" else "CPU"
        print(f"scene {args.size} x {args.size} px, 3 x uint8, {raster.stat().st_size / 2**20:.0f} MiB on disk "
              f"(deflate, {BLOCK} px blocks; written in {generated:.1f} s); window {args.window} px; {args.backbone} "
              f"at {args.image_size} px, batch {args.batch}, {torch.get_num_threads()} cores; {where}")
        write_scene(folder / "warm-up.tif", 2 * args.window)  # a small scene: the first map loads fonts, ...
        map_once(predictor, folder / "warm-up.tif", folder / "warm-up", args.window, args.batch, args.readers)
        readers = sorted({args.readers, 1}) if args.compare_readers else [args.readers]
        rates: dict[str, list[float]] = {**{f"map, {r} reader(s)": [] for r in readers},
                                         "forward, lanes": [], "forward, one on every core": []}
        windows = 0
        for round_ in range(args.rounds):
            for name in (list(rates) if round_ % 2 == 0 else list(reversed(rates))):
                if name.startswith("map"):
                    count = int(name.split(", ")[1].split()[0])
                    seconds, windows = map_once(predictor, raster, folder / "map", args.window, args.batch, count)
                    rates[name].append(windows / seconds)
                elif name == "forward, lanes":
                    laned, whole = forward_rates(predictor, args.batch, args.forward_batches)
                    rates["forward, lanes"].append(laned)
                    rates["forward, one on every core"].append(whole)
        partner = bench_partner(args, raster, checkpoint, folder) if args.partner or args.beside_cpu else None
        peak = None if args.no_memory else child_peak(raster, checkpoint, args.window, args.batch, args.readers)
    print(f"\n{args.rounds} interleaved rounds\n")
    print("| path | windows | windows/s (best) | range over rounds |")
    print("|---|---:|---:|---|")
    for name, values in rates.items():
        if values:
            print(_row(name, values, f"{windows:,}" if name.startswith("map") else f"{args.forward_batches} batches"))
    model_rate = max(max(rates["forward, lanes"]), max(rates["forward, one on every core"]))
    for name in rates:
        if name.startswith("map"):
            count = int(name.split(", ")[1].split()[0])
            print(f"\n{name}: {max(rates[name]) / model_rate:.2f}x the model's forward rate (best rounds); "
                  f"{max(rates[name]) / count:.1f} windows/s per reader thread")
    if partner is not None:
        alone, pair = partner
        ratios = [p / a for a, p in zip(alone, pair)]
        beside = f"a {args.partner:g}x slower CPU worker" if args.partner else "a CPU worker"
        print(f"\nwhole rsnet-predict map= runs (start-up included), {len(alone)} interleaved rounds: {args.device} "
              f"alone {statistics.median(alone):.1f} s ({min(alone):.1f}–{max(alone):.1f}), beside {beside} "
              f"{statistics.median(pair):.1f} s ({min(pair):.1f}–{max(pair):.1f}); pair / alone "
              f"{', '.join(f'{r:.3f}' for r in ratios)}, median {statistics.median(ratios):.3f}")
    if peak is not None:
        before, during = peak["before_kib"] / 1024, peak["peak_kib"] / 1024
        print(f"\na child process mapping the scene alone: resident {before:.0f} MiB before the map (model loaded), "
              f"peak {during:.0f} MiB during it (+{during - before:.0f} MiB) for a raster of "
              f"{3 * args.size * args.size / 2**20:.0f} MiB ({peak['windows']:,} windows in {peak['seconds']:.1f} s)")


def bench_partner(args: argparse.Namespace, raster: Path, checkpoint: Path,
                  folder: Path) -> tuple[list[float], list[float]]:
    """Whole-run seconds on ``args.device`` alone and beside a CPU worker (``args.partner``: SIMULATED that many times
    slower), interleaved over ``args.rounds`` rounds."""
    device = "cuda:0" if args.device.startswith("cuda") else args.device
    slowdown = f"[1.0,{args.partner}]" if args.partner else None
    alone, pair = [], []
    for round_ in range(args.rounds):
        for kind in (("alone", "pair") if round_ % 2 == 0 else ("pair", "alone")):
            if kind == "alone":
                alone.append(predict_run(raster, checkpoint, folder / "alone", args.window, args.batch, device))
            else:
                pair.append(predict_run(raster, checkpoint, folder / "pair", args.window, args.batch,
                                        f"[{device},cpu]", slowdown))
    return alone, pair


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=20_000, help="the scene's side in pixels")
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--backbone", default="test_resnet")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--readers", type=int, default=2, help="reader threads of the map")
    parser.add_argument("--compare-readers", action="store_true", help="also map with one reader thread")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--forward-batches", type=int, default=20, help="batches timed for the forward rate")
    parser.add_argument("--device", default="cpu", help="where the map and the forward rate run (cpu, cuda)")
    parser.add_argument("--partner", type=float, default=None,
                        help="also time whole runs beside a CPU worker SIMULATED this many times slower")
    parser.add_argument("--beside-cpu", action="store_true", help="also time whole runs beside a CPU worker (a GPU's)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-memory", action="store_true", help="leave out the child process measuring memory")
    parser.add_argument("--child", nargs=2, metavar=("RASTER", "CHECKPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if args.child:
        child_map(*args.child, args.window, args.batch, args.readers)
    elif args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_scene_map: no CUDA device visible, nothing measured (run it with --device cpu for the CPU)")
    else:
        bench(args)


if __name__ == "__main__":
    main()
