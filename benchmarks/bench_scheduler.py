"""Scheduler end to end: trainer=sync vs local_sgd vs adaptive on two workers, one of them slowed down.

Runs ``scripts/train.py`` as a user would, once per strategy (interleaved over ``--repeats``), on the
bundled data/ucmerced-mini with the tiny ``test_resnet`` backbone, two CPU workers by default, and a
SIMULATED slowdown (``trainer.slowdown=[1.0, 2.0]``: worker 1 sleeps so every step takes twice as long).
Prints per strategy: training wall time of the run, images/s, final test accuracy, and the ratios to
sync measured in this run. Same epochs, same total batch, same seed for all three.

    python benchmarks/bench_scheduler.py [--devices cpu,cpu] [--slowdown 1.0,2.0] [--epochs 4] [--repeats 1]
    python benchmarks/bench_scheduler.py --devices cuda:0,cuda:1 --backbone resnet18 --image-size 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = ("sync", "local_sgd", "adaptive")


def run(strategy: str, args: argparse.Namespace, run_dir: Path) -> dict:
    overrides = [f"trainer={strategy}", f"trainer.devices=[{args.devices}]", f"epochs={args.epochs}",
                 f"backbone={args.backbone}", f"model={args.model}", f"dataset.image_size={args.image_size}",
                 f"batch_size={args.batch}", "log.progress_bar=false", f"log.attention_every={args.epochs + 1}",
                 f"hydra.run.dir={run_dir}", f"seed={args.seed}"]
    if args.slowdown:
        overrides.append(f"trainer.slowdown=[{args.slowdown}]")
    if strategy == "adaptive":
        overrides.append(f"trainer.merge_interval={args.merge_interval}")
    if strategy == "local_sgd":
        overrides.append(f"trainer.average_every={args.average_every}")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=args.timeout)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{strategy} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"wall_s": float(metrics["wall_time_s"]), "process_s": elapsed, "images_per_s": metrics["images_per_s"],
            "accuracy": float(metrics["accuracy"]), "log": done.stdout + done.stderr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="cpu,cpu")
    parser.add_argument("--slowdown", default="1.0,2.0", help="simulated slowdown per worker; '' for none")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--merge-interval", type=int, default=64)
    parser.add_argument("--average-every", type=int, default=2)
    parser.add_argument("--backbone", default="test_resnet")
    parser.add_argument("--model", default="baseline")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()

    results: dict[str, list[dict]] = {name: [] for name in STRATEGIES}
    with tempfile.TemporaryDirectory(prefix="bench_scheduler_") as tmp:
        for repeat in range(args.repeats):
            for name in STRATEGIES:
                result = run(name, args, Path(tmp) / f"{name}_{repeat}")
                results[name].append(result)
                print(f"  {name:<9} repeat {repeat}: {result['wall_s']:.1f} s, {result['accuracy']:.2f} %",
                      flush=True)
    print(f"\ndevices [{args.devices}], slowdown [{args.slowdown or 'none'}] (SIMULATED), {args.epochs} epochs, "
          f"batch {args.batch}, {args.model}/{args.backbone} at {args.image_size} px, {args.repeats} repeat(s)")
    print(f"{'strategy':<10} {'wall s':>8} {'img/s':>8} {'acc %':>7} {'time / sync':>12}")
    base = statistics.median(r["wall_s"] for r in results["sync"])
    for name in STRATEGIES:
        wall = statistics.median(r["wall_s"] for r in results[name])
        speed = statistics.median(r["images_per_s"] for r in results[name])
        accuracy = statistics.mean(r["accuracy"] for r in results[name])
        print(f"{name:<10} {wall:>8.1f} {speed:>8.1f} {accuracy:>7.2f} {wall / base:>12.2f}")
    merges = [line for line in results["adaptive"][-1]["log"].splitlines() if "merge " in line]
    if merges:
        print("\nadaptive, last merges of the last run:")
        for line in merges[-3:]:
            print("  " + line.split(" - ", 1)[-1])


if __name__ == "__main__":
    main()
