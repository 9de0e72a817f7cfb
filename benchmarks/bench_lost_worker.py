"""A run that loses a worker: three CPU workers, one of them killed (SIGKILL) in epoch 2 of 6, against the same run
undisturbed and against the two surviving devices alone, on real data (aid-dev).

Each run is ``scripts/train.py`` as a user starts it: aid-dev at 64 px, train ratio 0.5, ResNet-18 (or timm's
``test_resnet``) from scratch, batch 32, ``trainer=adaptive`` with one torch thread per CPU worker, evaluated after the
last epoch. The loss is ``trainer.lose_worker=[1, 2, K]``: worker 1 kills itself with a batch of epoch 2's K-th merge
interval claimed, as ``kill -9`` would; the run goes on by itself from its last merge's commit. The arms of a seed run
one after another (three workers, two workers, three losing one), seed after seed, so that the machine's load drifts
alike over all of them.

Per run: the wall time of the whole command (start-up, restart and evaluation included), the final test accuracy,
and for the disturbed run what its metrics.json records of the change (where it went on from, seconds from the loss
to the state loaded again). The report: mean ± std per arm and model, the disturbed run's time over the two survivors'
undisturbed time per seed (target ≤ 1.15), and whether its accuracy lies within the undisturbed runs' spread.

    python benchmarks/bench_lost_worker.py                                  # both models, 3 seeds
    python benchmarks/bench_lost_worker.py --models test_resnet --seeds 1   # a quick look
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
AID_DEV = REPO.parent / "shared" / "data" / "aid-dev" / "AID"
ARMS = {  # name -> (devices, extra overrides)
    "3 workers": ("[cpu,cpu,cpu]", []),
    "2 workers (the survivors alone)": ("[cpu,cpu]", []),
    "3 workers, worker 1 killed in epoch 2": ("[cpu,cpu,cpu]", ["trainer.lose_worker=[1,2,{interval}]"]),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["test_resnet", "resnet18"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--interval", type=int, default=3, help="the merge interval of epoch 2 the loss happens in")
    parser.add_argument("--root", type=Path, default=AID_DEV)
    parser.add_argument("--results", type=Path, default=None, help="append each run's record here (JSON lines)")
    parser.add_argument("--timeout", type=float, default=1800.0)
    return parser.parse_args()


def overrides(model: str, arm: str, seed: int, run_dir: Path, args: argparse.Namespace) -> list[str]:
    devices, extra = ARMS[arm]
    return ["trainer=adaptive", f"trainer.devices={devices}", "trainer.cpu_threads=1", "dataset=aid",
            f"dataset.root={args.root}", "dataset.image_size=64", "dataset.train_ratio=0.5", f"backbone={model}",
            "model=baseline", f"epochs={args.epochs}", f"eval_every={args.epochs}", "batch_size=32", f"seed={seed}",
            "log.progress_bar=false", f"log.attention_every={args.epochs + 1}", f"hydra.run.dir={run_dir}",
            *(override.format(interval=args.interval) for override in extra)]


def run(model: str, arm: str, seed: int, args: argparse.Namespace) -> dict:
    """One training run: its wall time, final test accuracy and recorded membership changes."""
    with tempfile.TemporaryDirectory(prefix="rsnet-lost-") as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"),
                               *overrides(model, arm, seed, run_dir, args)], cwd=REPO, capture_output=True, text=True,
                              timeout=args.timeout)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"{model} / {arm} / seed {seed} failed:\n{done.stderr[-3000:]}")
        metrics = json.loads((run_dir / "metrics.json").read_text())
    return {"model": model, "arm": arm, "seed": seed, "wall_s": round(wall, 2), "accuracy": metrics["accuracy"],
            "train_wall_s": metrics["wall_time_s"], "changes": metrics.get("membership_changes", []),
            "samples": [row["train/samples"] for row in metrics["history"]]}


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def report(records: list[dict], models: list[str]) -> None:
    for model in models:
        mine = [r for r in records if r["model"] == model]
        print(f"\n## {model} (aid-dev, 64 px, {len({r['seed'] for r in mine})} seed(s))\n")
        print("| arm | wall s | final test OA % | samples per epoch |\n|---|---|---|---|")
        for arm in ARMS:
            rows = [r for r in mine if r["arm"] == arm]
            samples = sorted({s for r in rows for s in r["samples"]})
            print(f"| {arm} | {spread([r['wall_s'] for r in rows])} | {spread([r['accuracy'] for r in rows])} | "
                  f"{samples} |")
        whole, survivors, killed = (sorted((r for r in mine if r["arm"] == arm), key=lambda r: r["seed"])
                                    for arm in ARMS)
        ratios = [k["wall_s"] / s["wall_s"] for k, s in zip(killed, survivors)]
        print(f"\nkilled run / the survivors alone, per seed: {', '.join(f'{x:.3f}' for x in ratios)} "
              f"(target <= 1.15: {'met' if max(ratios) <= 1.15 else 'NOT met'})")
        for record in killed:
            for change in record["changes"]:
                print(f"seed {record['seed']}: {change['lost']} lost ({change['cause']}); went on from "
                      f"{change['resumed_from']}; {change['restart_s']} s from the loss to the state loaded again")
        undisturbed = [r["accuracy"] for r in whole + survivors]
        low, high = min(undisturbed), max(undisturbed)
        inside = all(low <= r["accuracy"] <= high for r in killed)
        print(f"killed runs' OA {[r['accuracy'] for r in killed]} within the undisturbed runs' range "
              f"[{low:.2f}, {high:.2f}]: {'yes' if inside else 'no'}")


def main() -> None:
    args = parse_args()
    records = []
    for seed in range(args.seeds):
        for model in args.models:
            for arm in ARMS:
                record = run(model, arm, seed, args)
                records.append(record)
                print(json.dumps(record), flush=True)
                if args.results:
                    with args.results.open("a") as handle:
                        handle.write(json.dumps(record) + "\n")
    report(records, args.models)


if __name__ == "__main__":
    main()
