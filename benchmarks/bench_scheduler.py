"""Scheduler end to end: trainer=sync vs local_sgd vs adaptive on two workers, with and without a slowed one.

Runs ``scripts/train.py`` as a user would, once per strategy, scenario and seed (seeds interleaved: seed 0 of
every strategy, then seed 1, ...), on the bundled data/ucmerced-mini, two CPU workers with one torch thread
each (``trainer.cpu_threads=1``). Two scenarios in one invocation:

* ``--slowdown 1.0,2.0``: SIMULATED heterogeneity, worker 1 sleeps (2 − 1) × its own compute time after every
  step, so it computes half as fast;
* ``--even-slowdown 1.0,1.0``: identical workers (the adaptive scheduler's overhead against sync).

Same epochs, total batch, model and seeds for all three strategies. For every scenario it prints a table:
wall s (training time of the run from metrics.json, summed over the seeds), samples/s (training samples ×
epochs / wall, over all seeds), final test accuracy (mean ± std over the seeds), throughput ratio to sync
and accuracy difference to sync; then one verdict line per target (printed, not asserted):

* slowdown [1, 2]: adaptive samples/s ≥ 1.35 × sync's (ideal (1 + 0.5) / (2 · 0.5) = 1.5), adaptive
  accuracy ≥ sync's − 1 point at equal epochs;
* slowdown [1, 1]: adaptive samples/s ≥ 0.95 × sync's.

    python benchmarks/bench_scheduler.py                       # the defaults below
    python benchmarks/bench_scheduler.py --epochs 2 --seeds 1  # smoke test
    python benchmarks/bench_scheduler.py --devices cuda:0,cuda:1 --threads 0 --backbone resnet18 --image-size 224
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
THROUGHPUT_TARGET = {"slowed": 1.35, "even": 0.95}
ACCURACY_TOLERANCE = 1.0


def run(strategy: str, slowdown: str, seed: int, args: argparse.Namespace, run_dir: Path) -> dict:
    overrides = [f"trainer={strategy}", f"trainer.devices=[{args.devices}]", f"epochs={args.epochs}",
                 f"backbone={args.backbone}", f"model={args.model}", f"dataset.image_size={args.image_size}",
                 f"batch_size={args.batch}", "log.progress_bar=false", f"log.attention_every={args.epochs + 1}",
                 f"hydra.run.dir={run_dir}", f"seed={seed}"]
    if args.threads > 0:
        overrides.append(f"trainer.cpu_threads={args.threads}")
    if slowdown:
        overrides.append(f"trainer.slowdown=[{slowdown}]")
    if strategy == "adaptive":
        overrides.append(f"trainer.merge_interval={args.merge_interval}")
    if strategy == "local_sgd":
        overrides.append(f"trainer.average_every={args.average_every}")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=args.timeout)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{strategy} (slowdown [{slowdown}], seed {seed}) failed:\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    samples = int(metrics["train_samples"]) * int(metrics["epochs"])
    return {"wall_s": float(metrics["wall_time_s"]), "samples": samples, "process_s": elapsed,
            "accuracy": float(metrics["accuracy"]), "log": done.stdout + done.stderr,
            "updates": [w["updates"] for w in metrics["scheduler"]["workers"]],
            "worker_samples": [w["samples"] for w in metrics["scheduler"]["workers"]]}


def aggregate(results: list[dict]) -> dict:
    wall = sum(r["wall_s"] for r in results)
    accuracies = [r["accuracy"] for r in results]
    return {"wall_s": wall, "speed": sum(r["samples"] for r in results) / wall,
            "acc": statistics.mean(accuracies), "acc_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
            "accs": accuracies}


def report(label: str, key: str, slowdown: str, results: dict[str, list[dict]], args: argparse.Namespace) -> list[str]:
    """Print one scenario's table; return its verdict lines."""
    rows = {name: aggregate(results[name]) for name in STRATEGIES}
    base = rows["sync"]
    print(f"\n{label}: slowdown [{slowdown or '1.0,1.0'}]"
          f"{' (SIMULATED)' if slowdown and set(slowdown.split(',')) != {'1.0'} else ''}, {len(args.seed_list)} seed(s) "
          f"{args.seed_list}")
    print("| strategy | wall s | samples/s | accuracy % (mean ± std) | samples/s ÷ sync | accuracy − sync |")
    print("|---|---|---|---|---|---|")
    for name in STRATEGIES:
        row = rows[name]
        title = {"local_sgd": f"local_sgd (H = {args.average_every})",
                 "adaptive": f"adaptive (M = {args.merge_interval})"}.get(name, name)
        print(f"| {title} | {row['wall_s']:.1f} | {row['speed']:.1f} | {row['acc']:.2f} ± {row['acc_std']:.2f} | "
              f"{row['speed'] / base['speed']:.2f} | {row['acc'] - base['acc']:+.2f} |")
    print("  per-seed accuracy: " + "; ".join(f"{name} " + ", ".join(f"{a:.2f}" for a in rows[name]["accs"])
                                             for name in STRATEGIES))
    for name in ("sync", "adaptive"):
        updates = [sum(r["updates"][w] for r in results[name]) for w in range(len(results[name][0]["updates"]))]
        samples = [sum(r["worker_samples"][w] for r in results[name]) for w in range(len(updates))]
        print(f"  {name}: updates per worker {updates}, samples per worker {samples} (all seeds)")
    merges = [line for line in results["adaptive"][-1]["log"].splitlines() if "merge " in line and "w0:" in line]
    if merges:
        print("  adaptive, last merge of the last run: " + merges[-1].split(" - ", 1)[-1])
    ratio = rows["adaptive"]["speed"] / base["speed"]
    target = THROUGHPUT_TARGET[key]
    verdicts = [f"[{slowdown or '1.0,1.0'}] adaptive throughput = {ratio:.2f} x sync (target >= {target:.2f}"
                f"{', ideal 1.50' if key == 'slowed' else ''}): {'MET' if ratio >= target else 'MISSED'}"]
    if key == "slowed":
        diff = rows["adaptive"]["acc"] - base["acc"]
        verdicts.append(f"[{slowdown}] adaptive accuracy - sync = {diff:+.2f} points over {len(args.seed_list)} seeds "
                        f"(target >= -{ACCURACY_TOLERANCE:.1f}): {'MET' if diff >= -ACCURACY_TOLERANCE else 'MISSED'}")
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="cpu,cpu")
    parser.add_argument("--threads", type=int, default=1, help="trainer.cpu_threads per CPU worker; 0: default")
    parser.add_argument("--slowdown", default="1.0,2.0", help="simulated slowdown of the heterogeneous scenario")
    parser.add_argument("--even-slowdown", default="1.0,1.0", help="the identical-workers scenario; '' to skip")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..n-1 of the slowed scenario")
    parser.add_argument("--even-seeds", type=int, default=1, help="seeds of the identical-workers scenario")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--merge-interval", type=int, default=105)
    parser.add_argument("--average-every", type=int, default=4)
    parser.add_argument("--backbone", default="test_resnet")
    parser.add_argument("--model", default="baseline")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()

    scenarios = [("slowed", "heterogeneous", args.slowdown, args.seeds)]
    if args.even_slowdown:
        scenarios.append(("even", "identical", args.even_slowdown, args.even_seeds))
    print(f"devices [{args.devices}], {args.threads or 'default'} thread(s) per CPU worker, {args.epochs} epochs, "
          f"batch {args.batch}, {args.model}/{args.backbone} at {args.image_size} px", flush=True)
    started = time.perf_counter()
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench_scheduler_") as tmp:
        for key, label, slowdown, seeds in scenarios:
            results: dict[str, list[dict]] = {name: [] for name in STRATEGIES}
            for seed in range(seeds):
                for name in STRATEGIES:
                    result = run(name, slowdown, seed, args, Path(tmp) / f"{key}_{name}_{seed}")
                    results[name].append(result)
                    print(f"  [{slowdown}] {name:<9} seed {seed}: {result['wall_s']:.1f} s training, "
                          f"{result['samples'] / result['wall_s']:.1f} samples/s, {result['accuracy']:.2f} % "
                          f"({result['process_s']:.0f} s process)", flush=True)
            args.seed_list = list(range(seeds))
            verdicts += report(label, key, slowdown, results, args)
    print("\nverdicts:")
    for line in verdicts:
        print("  " + line)
    print(f"(benchmark took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
