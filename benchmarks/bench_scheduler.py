"""Time-to-accuracy of the parallel strategies on real data (aid-dev), with SIMULATED heterogeneous workers.

Runs ``scripts/train.py`` as a user would, once per scenario x strategy x seed, on the AID development subset
(30 classes x 60 real images): 64 px, train ratio 0.5 with a validation split of 20 % carved from the training
part (the test set is never used for a decision), ResNet-18 from scratch, batch 32, CPU workers with one torch
thread each, validation and test evaluated every epoch. Seeds are paired (every strategy of a seed gets the
same split and initial weights) and interleaved (seed 0 of every scenario and strategy, then seed 1, ...).

Strategies: ``sync`` (DDP), ``local_sgd``, ``adaptive``, ``static`` (batch sizes fixed from the speeds measured
in the first epoch), and three ablations of adaptive: ``adaptive-fixed`` (no batch adaptation: the equal split
throughout, ``trainer.warmup_intervals`` beyond the run), ``adaptive-by-samples`` (merge weights by samples,
not updates) and ``adaptive-multiple-4`` (batch sizes in multiples of 4 instead of 8: finer sizes where the
equal share B / W is small). Scenarios: worker speed ratios 1:1, 1:1.5, 1:2, 1:4 (two workers) and 1:1:2
(three workers; on a 2-core machine three workers share two cores). A ratio 1:s slows the last worker by s (it sleeps
(s - 1) x its own compute time after every step).

Per run, from metrics.json: the validation and test accuracy of every epoch against training wall time (the
time spent in training steps and merges, evaluation excluded). Per scenario and seed: target = 95 % of sync's
final validation accuracy; time to target (first epoch at or above it); validation and test accuracy at a
fixed budget (the shortest run of the scenario and seed); final test accuracy; samples/s; update balance (the
fewest over the most optimizer updates among workers). The report gives mean +- std over seeds and, per seed
paired, the ratio to sync (time to target: sync's / the strategy's, > 1 is faster), then the issue's targets
as verdict lines (printed, not asserted). Every finished run is appended to ``--results`` (JSON lines), so an
interrupted study continues where it stopped and ``--report-only`` rebuilds the tables; ``--plot`` draws
validation accuracy vs wall time (every seed's curve) for one scenario.

    python benchmarks/bench_scheduler.py --quick                   # 1:2 and 1:1, sync vs adaptive, 1 seed, 4 epochs
    python benchmarks/bench_scheduler.py --scenarios 1:2 1:1 --strategies sync adaptive static --seeds 3
    python benchmarks/bench_scheduler.py --report-only --results study.jsonl --plot curves.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from line_plot import line_plot

REPO = Path(__file__).resolve().parents[1]
AID_DEV = REPO.parent / "shared" / "data" / "aid-dev" / "AID"
STRATEGIES = {  # name -> train.py overrides
    "sync": ["trainer=sync"],
    "local_sgd": ["trainer=local_sgd"],
    "adaptive": ["trainer=adaptive"],
    "static": ["trainer=static"],
    "adaptive-fixed": ["trainer=adaptive", "trainer.warmup_intervals=1000000"],
    "adaptive-by-samples": ["trainer=adaptive", "trainer.merge_weight=samples"],
    "adaptive-multiple-4": ["trainer=adaptive", "trainer.batch_multiple=4"],
}
SCENARIOS = {"1:1": [1.0, 1.0], "1:1.5": [1.0, 1.5], "1:2": [1.0, 2.0], "1:4": [1.0, 4.0], "1:1:2": [1.0, 1.0, 2.0]}
TARGET_FRACTION = 0.95


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=AID_DEV, help="aid-dev's AID folder")
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--strategies", nargs="+", choices=list(STRATEGIES), default=list(STRATEGIES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--results", type=Path, default=REPO / "outputs" / "bench_scheduler.jsonl",
                        help="JSON lines, one per finished run; runs already in it are not run again")
    parser.add_argument("--plot", type=Path, default=None, help="PNG: validation accuracy vs wall time")
    parser.add_argument("--plot-scenario", default="1:2")
    parser.add_argument("--report-only", action="store_true", help="tables from --results, no training")
    parser.add_argument("--quick", action="store_true", help="1:2 and 1:1, sync and adaptive, 1 seed, 4 epochs")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    args = parser.parse_args()
    if args.quick:
        args.scenarios, args.strategies, args.seeds, args.epochs = ["1:2", "1:1"], ["sync", "adaptive"], 1, 4
    if "sync" not in args.strategies:
        parser.error("--strategies must include sync: every ratio and target is relative to it")
    return args


def run_key(scenario: str, strategy: str, seed: int, args: argparse.Namespace) -> str:
    return f"{scenario}|{strategy}|seed{seed}|{args.epochs}ep|{args.image_size}px|b{args.batch}"


def train(scenario: str, strategy: str, seed: int, args: argparse.Namespace) -> dict:
    """One training run; returns its record (the curve and the scheduler's per-worker figures)."""
    slowdown = SCENARIOS[scenario]
    with tempfile.TemporaryDirectory(prefix="rsnet-bench-sched-") as tmp:
        overrides = [*STRATEGIES[strategy], f"trainer.devices=[{','.join(['cpu'] * len(slowdown))}]",
                     "trainer.cpu_threads=1", f"trainer.slowdown=[{','.join(map(str, slowdown))}]",
                     "dataset=aid", f"dataset.root={args.root}", f"dataset.image_size={args.image_size}",
                     "dataset.train_ratio=0.5", "dataset.val_ratio=0.2", "backbone=resnet18", "model=baseline",
                     f"epochs={args.epochs}", "eval_every=1", f"batch_size={args.batch}", f"seed={seed}",
                     "log.progress_bar=false", f"log.attention_every={args.epochs + 1}", f"hydra.run.dir={tmp}"]
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *overrides], cwd=REPO,
                              capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0:
            raise SystemExit(f"{strategy} at {scenario}, seed {seed} failed:\n{done.stderr[-3000:]}")
        metrics = json.loads((Path(tmp) / "metrics.json").read_text())
    curve = [(h["wall_time_s"], h["val_accuracy"], h["test_accuracy"]) for h in metrics["history"]]
    workers = metrics["scheduler"]["workers"]
    return {"key": run_key(scenario, strategy, seed, args), "scenario": scenario, "strategy": strategy,
            "seed": seed, "curve": curve, "train_samples": metrics["train_samples"], "epochs": metrics["epochs"],
            "updates": [w["updates"] for w in workers], "worker_samples": [w["samples"] for w in workers]}


def load_results(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def samples_per_s(record: dict) -> float:
    """A run's training samples per second of training wall time."""
    return record["train_samples"] * record["epochs"] / record["curve"][-1][0]


def run_metrics(record: dict, target: float, budget: float) -> dict:
    """One run's figures given its scenario's target validation accuracy and wall-clock budget."""
    curve = record["curve"]
    reached = next((wall for wall, val, _ in curve if val >= target), None)
    within = [point for point in curve if point[0] <= budget + 1e-6] or curve[:1]
    wall = curve[-1][0]
    updates = record["updates"]
    return {"time_to_target": reached, "val_at_budget": within[-1][1], "test_at_budget": within[-1][2],
            "final_test": curve[-1][2], "samples_per_s": samples_per_s(record),
            "balance": min(updates) / max(updates) if max(updates) else 0.0, "wall": wall}


def _mean_std(values: list[float]) -> str:
    if not values:
        return "n/a"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {std:.2f}"


def scenario_table(scenario: str, results: dict[str, dict], args: argparse.Namespace) -> tuple[list[str], dict]:
    """The scenario's Markdown table and, per strategy, the per-seed figures and ratios to sync."""
    per: dict[str, list[dict]] = {name: [] for name in args.strategies}
    for seed in range(args.seeds):
        records = {name: results.get(run_key(scenario, name, seed, args)) for name in args.strategies}
        if any(r is None for r in records.values()):
            continue  # a seed is compared only once every strategy has run it
        sync = records["sync"]
        target = TARGET_FRACTION * sync["curve"][-1][1]
        budget = min(r["curve"][-1][0] for r in records.values())
        base = run_metrics(sync, target, budget)
        for name, record in records.items():
            m = run_metrics(record, target, budget)
            m["speedup"] = (base["time_to_target"] / m["time_to_target"]
                            if m["time_to_target"] and base["time_to_target"] else None)
            m["throughput_ratio"] = m["samples_per_s"] / base["samples_per_s"]
            m["test_diff"] = m["final_test"] - base["final_test"]
            per[name].append(m)
    seeds = len(per["sync"])
    lines = [f"### {scenario} ({seeds} paired seed{'s' if seeds != 1 else ''}, {args.epochs} epochs)", "",
             "| strategy | time to target s | × sync (time to target) | val @ budget | test @ budget | final test | "
             "Δ test vs sync | samples/s | × sync (samples/s) | update balance |", "|---" * 10 + "|"]
    for name, rows in per.items():
        reached = [m["time_to_target"] for m in rows if m["time_to_target"] is not None]
        speedups = [m["speedup"] for m in rows if m["speedup"] is not None]
        missed = len(rows) - len(reached)
        lines.append(
            f"| {name} | {_mean_std(reached)}{f' ({missed} missed)' if missed else ''} | {_mean_std(speedups)} | "
            f"{_mean_std([m['val_at_budget'] for m in rows])} | {_mean_std([m['test_at_budget'] for m in rows])} | "
            f"{_mean_std([m['final_test'] for m in rows])} | {_mean_std([m['test_diff'] for m in rows])} | "
            f"{_mean_std([m['samples_per_s'] for m in rows])} | {_mean_std([m['throughput_ratio'] for m in rows])} | "
            f"{_mean_std([m['balance'] for m in rows])} |")
    return lines, per


def verdicts(per_scenario: dict[str, dict]) -> list[str]:
    """The issue's targets, judged on the means over seeds (printed, not asserted)."""
    lines = []

    def mean(scenario: str, strategy: str, key: str) -> float | None:
        values = [m[key] for m in per_scenario.get(scenario, {}).get(strategy, []) if m[key] is not None]
        return statistics.mean(values) if values else None

    def missed(scenario: str) -> str:
        """A seed in which adaptive never reached the target fails the verdict (its speedup is left out of the mean)."""
        rows = per_scenario.get(scenario, {}).get("adaptive", [])
        count = sum(m["time_to_target"] is None for m in rows)
        return f", target missed in {count} of {len(rows)} seeds" if count else ""

    def times(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "n/a"

    speedup, diff = mean("1:2", "adaptive", "speedup"), mean("1:2", "adaptive", "test_diff")
    if diff is not None:
        ok = speedup is not None and speedup >= 1.3 and diff >= -1.0 and not missed("1:2")
        lines.append(f"1:2: adaptive reaches the target {times(speedup)} faster than sync (target >= 1.3x), final test "
                     f"{diff:+.2f} points vs sync (target >= -1){missed('1:2')}: {'MET' if ok else 'NOT MET'}")
    speedup, ratio = mean("1:1", "adaptive", "speedup"), mean("1:1", "adaptive", "throughput_ratio")
    if ratio is not None:
        ok = speedup is not None and speedup >= 0.95 and ratio >= 0.95 and not missed("1:1")
        lines.append(f"1:1: adaptive time to target {times(speedup)} sync's speed, samples/s {ratio:.2f}x sync's "
                     f"(target: within 5 %){missed('1:1')}: {'MET' if ok else 'NOT MET'}")
    return lines


def plot(results: dict[str, dict], args: argparse.Namespace) -> None:
    series = {name: [[(w, v) for w, v, _ in r["curve"]] for r in results.values()
                     if r["strategy"] == name and r["scenario"] == args.plot_scenario
                     and r["key"] == run_key(r["scenario"], name, r["seed"], args)]
              for name in args.strategies}
    series = {name: curves for name, curves in series.items() if curves}
    line_plot(series, args.plot, f"aid-dev, 64 px, ResNet-18, workers {args.plot_scenario} (SIMULATED): "
              "validation accuracy vs training wall time, every seed", "training wall time (s)",
              "validation accuracy (%)")
    print(f"plot: {args.plot}")


def main() -> None:
    args = parse_args()
    results = load_results(args.results)
    if not args.report_only:
        if not args.root.is_dir():
            raise SystemExit(f"skipped: the AID development subset is not at '{args.root}' (pass --root DIR)")
        args.results.parent.mkdir(parents=True, exist_ok=True)
        if results:
            print(f"{args.results}: {len(results)} finished runs are reused, not rerun (delete the file to start "
                  "afresh, e.g. after a code change)", flush=True)
        for seed in range(args.seeds):
            for scenario in args.scenarios:
                for strategy in args.strategies:
                    key = run_key(scenario, strategy, seed, args)
                    if key in results:
                        continue
                    record = train(scenario, strategy, seed, args)
                    results[key] = record
                    with args.results.open("a") as out:
                        out.write(json.dumps(record) + "\n")
                    print(f"done: {key}: final val {record['curve'][-1][1]:.2f} %, "
                          f"wall {record['curve'][-1][0]:.0f} s", flush=True)
    per_scenario = {}
    for scenario in args.scenarios:
        lines, per_scenario[scenario] = scenario_table(scenario, results, args)
        print("\n".join(lines) + "\n")
    for line in verdicts(per_scenario):
        print(line)
    if args.plot:
        plot(results, args)


if __name__ == "__main__":
    main()
