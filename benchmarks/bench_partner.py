"""A partner never slows the fastest device: whole training runs of the fast worker alone against the same run with a
SIMULATED slow partner beside it, start-up included.

Runs ``scripts/train.py`` as a user would (a fresh process each time, the bundled UC-Merced sample, timm's
``test_resnet`` at 32 px, the baseline model, ``--epochs`` epochs, evaluated every epoch): ``trainer.devices=[cpu]``
(the fast worker alone) and ``trainer.devices=[cpu,cpu] trainer.slowdown=[1,S]`` (the pair, the partner S times
slower), alternating which goes first in each of ``--rounds`` rounds. Prints each run's wall time (the whole
process), its training time (metrics.json's ``wall_time_s``), the final test accuracy and what the scheduler did
with the partner, then per round the pair / alone ratio of the wall times and their median and range (target:
<= 1.10). ``--before DIR``: a checkout of another commit (``git worktree add DIR <commit>``) whose two runs are
interleaved with this one's in every round, its ratios printed beside.

    python benchmarks/bench_partner.py                          # 12 epochs, a 300x partner, 3 rounds
    python benchmarks/bench_partner.py --epochs 4 --rounds 1 --slowdown 300
    python benchmarks/bench_partner.py --before /tmp/rsnet-before  # this checkout against an earlier commit
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(checkout: Path, folder: Path, name: str, devices: str, slowdown: str | None, args: argparse.Namespace) -> dict:
    """One training run of ``checkout`` in a fresh process; its wall time, training time, accuracy and the partner's
    fate."""
    run_dir = folder / name
    command = [sys.executable, str(checkout / "scripts" / "train.py"), f"backbone={args.backbone}",
               f"dataset.image_size={args.size}", f"epochs={args.epochs}", f"model={args.model}",
               "log.progress_bar=false", "overwrite=true", f"trainer.devices={devices}", f"run_dir={run_dir}"]
    if slowdown:
        command.append(f"trainer.slowdown={slowdown}")
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    workers = metrics["scheduler"].get("workers", [])
    partner = "" if len(workers) < 2 else (
        "left out" if not workers[1]["active"] else f"trained {workers[1]['samples']:.0f} samples")
    return {"wall_s": wall, "train_s": metrics["wall_time_s"], "accuracy": metrics["accuracy"], "partner": partner}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--slowdown", type=float, default=300.0, help="the partner's SIMULATED slowdown")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backbone", default="test_resnet")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--model", default="baseline")
    parser.add_argument("--before", type=Path, help="a checkout of another commit, its runs interleaved with these")
    args = parser.parse_args()
    checkouts = {"": REPO, **({"before ": args.before.resolve()} if args.before else {})}
    print(f"# The fast worker alone vs beside a {args.slowdown:g}x slower partner ({args.backbone}, {args.size} px, "
          f"{args.model}, {args.epochs} epochs, whole runs of scripts/train.py, {args.rounds} interleaved rounds)\n")
    print("| round | run | wall s | training s | test OA % | partner |\n|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {label: [] for label in checkouts}
    with tempfile.TemporaryDirectory(prefix="rsnet-bench-partner-") as folder:
        for round_ in range(args.rounds):
            order = ["alone", "pair"] if round_ % 2 == 0 else ["pair", "alone"]
            results = {}
            for label, checkout in checkouts.items():
                for name in order:
                    devices, slowdown = ("[cpu]", None) if name == "alone" else ("[cpu,cpu]",
                                                                                f"[1.0,{args.slowdown}]")
                    results[label + name] = result = run(checkout, Path(folder), f"{label.strip()}{name}{round_}",
                                                         devices, slowdown, args)
                    print(f"| {round_ + 1} | {label}{name} | {result['wall_s']:.1f} | {result['train_s']:.1f} | "
                          f"{result['accuracy']:.2f} | {result['partner']} |", flush=True)
                ratios[label].append(results[label + "pair"]["wall_s"] / results[label + "alone"]["wall_s"])
    print()
    for label, found in ratios.items():
        print(f"{label or 'this checkout: '}pair / alone, whole runs: {', '.join(f'{r:.3f}' for r in found)}; median "
              f"{statistics.median(found):.3f} (range {min(found):.3f}-{max(found):.3f}; target <= 1.10)")


if __name__ == "__main__":
    main()
