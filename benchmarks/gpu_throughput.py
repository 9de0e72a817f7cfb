"""Steady-state training throughput on a GPU: multi-epoch adaptive runs on a real-size set, images/s after epoch 1.

``make gpu-check`` runs it after its pass/fail table and ``bench_step.py``. For each image size (128 and 224 px)
and device set (``[cuda:0]``, and ``[cuda:0, cpu]`` to see the scheduler leave a slow CPU out), one run of
``scripts/train.py`` (trainer=adaptive, the baseline model, ResNet-18 from scratch, aid-dev or ``--root``);
the table gives the training images/s of epochs 2..E (the first epoch, with CUDA start-up and cuDNN's
autotuning, apart; the trainer times training alone), the images/s of whole epochs 2..E (training, evaluation,
checkpoints and barriers: the time between the first and the last epoch's log line, with ``--eval-every 1``),
the first epoch's seconds, the final test accuracy and the workers left out; the scheduler's admission lines
(a worker left out, and why) follow the table. ``--root`` may be a real-size set made by ``real_size_set.py``.

    python benchmarks/gpu_throughput.py                        # aid-dev next to the checkout
    python benchmarks/gpu_throughput.py --root /data/AID --epochs 3 --sizes 224
    python benchmarks/gpu_throughput.py --root REAL_SIZE --backbone resnet50 --batch-size 256 --sizes 224 \
        --configs 1gpu gpu+cpu --eval-every 1     # a real-size epoch: the GPU alone, then with the CPU beside it
    python benchmarks/gpu_throughput.py --cpu-stand-in --sizes 32 --epochs 2 --backbone test_resnet  # test the script
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from gpu_check import run_training, tail

REPO = Path(__file__).resolve().parents[1]
AID_DEV = REPO.parent / "shared" / "data" / "aid-dev" / "AID"
DEVICE_SETS = {"1gpu": ["cuda:0"], "gpu+cpu": ["cuda:0", "cpu"]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=AID_DEV, help="an AID-layout folder (default: aid-dev)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224])
    parser.add_argument("--configs", nargs="+", choices=list(DEVICE_SETS), default=list(DEVICE_SETS))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--eval-every", type=int, help="epochs between evaluations (default: only the last epoch)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run before it is killed")
    parser.add_argument("--cpu-stand-in", action="store_true", help="replace cuda:0 by cpu (tests this script)")
    return parser.parse_args()


EPOCH_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\].*\bepoch (\d+)/\d+: test accuracy")
SCHEDULER_NOTE = "adaptive: "  # a log message the scheduler starts so: a worker left out (and why), a new cadence


def run_logs(run_dir: Path) -> list[str]:
    """The run's console lines (the trainer logs to stdout in one process, to stderr from spawned workers)."""
    return [line for name in ("stdout.log", "stderr.log") if (run_dir / name).is_file()
            for line in (run_dir / name).read_text(errors="replace").splitlines()]


def whole_epoch_rate(lines: list[str], train_samples: int) -> float:
    """Training images per second of whole epochs 2..E (training, evaluation, checkpoints, barriers): the time
    between the first and the last evaluated epoch's log line; NaN with fewer than two such lines."""
    stamps = {}
    for line in lines:
        if found := EPOCH_LINE.search(line):
            moment = time.mktime(time.strptime(found[1], "%Y-%m-%d %H:%M:%S")) + int(found[2]) / 1000
            stamps[int(found[3])] = moment
    if len(stamps) < 2:
        return float("nan")
    first, last = min(stamps), max(stamps)
    return train_samples * (last - first) / (stamps[last] - stamps[first]) if stamps[last] > stamps[first] \
        else float("nan")


def run(devices: list[str], size: int, args: argparse.Namespace, tmp: Path) -> tuple[str, list[str], dict]:
    """One run's table row (or its failure), its first 3 merges' lines (each worker's speed) and the scheduler's
    decisions (the first 8), and its figures (``steady``, ``whole`` images/s, ``run_s``; empty on a failure)."""
    run_dir = tmp / f"{'_'.join(devices)}_{size}".replace(":", "")
    run_dir.mkdir(parents=True)
    command = [sys.executable, str(REPO / "scripts" / "train.py"), "trainer=adaptive",
               f"trainer.devices=[{','.join(devices)}]", "model=baseline", f"backbone={args.backbone}",
               "backbone.pretrained=false", "dataset=aid", f"dataset.root={args.root}", f"dataset.image_size={size}",
               f"epochs={args.epochs}", f"eval_every={args.eval_every or args.epochs}", f"batch_size={args.batch_size}",
               "log.progress_bar=false", f"log.attention_every={args.epochs + 1}", f"hydra.run.dir={run_dir}"]
    started = time.perf_counter()
    status = run_training(command, run_dir, args.timeout)
    lines = run_logs(run_dir)
    messages = [line.split(" - ", 1)[-1] for line in lines]
    first_merges = [message for message in messages if message.startswith("merge ")][:3]  # the workers' speeds
    admission = [f"{', '.join(devices)}, {size} px: {message}" for message in
                 first_merges + [message for message in messages if message.startswith(SCHEDULER_NOTE)][:8]]
    if status != 0:
        return (f"| {', '.join(devices)} | {size} | FAIL ({'timeout' if status is None else status}): "
                f"{tail(run_dir / 'stderr.log', 3).replace(chr(10), ' / ')} | | | | | |", admission, {})
    metrics = json.loads((run_dir / "metrics.json").read_text())
    walls = [float(epoch["wall_time_s"]) for epoch in metrics["history"]]
    samples = metrics["train_samples"]
    steady = samples * (len(walls) - 1) / (walls[-1] - walls[0]) if len(walls) > 1 else float("nan")
    whole = whole_epoch_rate(lines, samples)
    workers = metrics.get("scheduler", {}).get("workers", [])
    left_out = sum(not worker.get("active", True) for worker in workers)
    run_s = time.perf_counter() - started
    return (f"| {', '.join(devices)} | {size} | {steady:,.0f} | {whole:,.0f} | {walls[0]:.1f} | "
            f"{metrics['accuracy']:.2f} | {left_out} | {run_s:.0f} |", admission,
            {"steady": steady, "whole": whole, "run_s": run_s})


def summary_ratios(size: int, figures: dict[str, dict]) -> list[str]:
    """The targets' ratios of one image size: whole epochs over training images/s per run, and the GPU + CPU run's
    speed over the GPU alone (the inverse ratio of their run seconds, start-up included)."""
    lines = [f"{size} px, {config}: whole epochs / training = {found['whole'] / found['steady']:.2f}"
             for config, found in figures.items() if found]
    alone, pair = figures.get("1gpu"), figures.get("gpu+cpu")
    if alone and pair:
        lines.append(f"{size} px: GPU + CPU / GPU alone, whole runs = {alone['run_s'] / pair['run_s']:.2f} "
                     f"({pair['run_s']:.0f} s vs {alone['run_s']:.0f} s)")
    return lines


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available() and not args.cpu_stand_in:
        print("no CUDA device visible: no GPU throughput to measure")
        return 0
    if not args.root.is_dir():
        print(f"--root {args.root} is not a folder: point it at aid-dev's or AID's class folders")
        return 2
    name = "CPU stand-in" if args.cpu_stand_in else torch.cuda.get_device_name(0)
    print(f"# Steady-state throughput: {name}, {args.backbone}, baseline model, batch {args.batch_size}, "
          f"{args.epochs} epochs of {args.root}, evaluated every {args.eval_every or args.epochs} epochs\n")
    print(f"| devices | image size | train images/s, epochs 2..{args.epochs} | whole epochs 2..{args.epochs}, "
          "images/s | first epoch s | test OA % | left out | run s |\n|---|---|---|---|---|---|---|---|", flush=True)
    decisions: list[str] = []
    ratios: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu_throughput_") as tmp:
        for size in args.sizes:
            figures = {}
            for config in args.configs:
                devices = [("cpu" if args.cpu_stand_in and d.startswith("cuda") else d) for d in DEVICE_SETS[config]]
                row, admission, figures[config] = run(devices, size, args, Path(tmp))
                print(row, flush=True)
                decisions += admission
            ratios += summary_ratios(size, figures)
    print("\n" + "\n".join(ratios) if ratios else "")
    print("\nscheduler decisions: " + ("\n  ".join(["", *decisions]) if decisions else
                                        "none logged (every worker kept, the cadence unchanged)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
