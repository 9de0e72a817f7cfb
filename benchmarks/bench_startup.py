"""How long a command takes to answer when it does no work: ``--help`` of each command, and a setting it refuses.

Each case is a fresh interpreter (``scripts/<command>.py`` as a user runs it), ``--repeats`` interleaved rounds;
prints the median and range of the wall time per case, beside ``python -c "import torch"`` (what the training
code alone costs to import) and a bare ``python -c pass``. The target for --help and a refused setting is
< 1.5 s on a quiet machine.

    python benchmarks/bench_startup.py
    python benchmarks/bench_startup.py --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "python -c pass": ["-c", "pass"],
    'python -c "import torch"': ["-c", "import torch"],
    "train.py --help": [str(REPO / "scripts" / "train.py"), "--help"],
    "train.py epoch=3 (refused)": [str(REPO / "scripts" / "train.py"), "epoch=3"],
    "train.py model=foo (refused)": [str(REPO / "scripts" / "train.py"), "model=foo"],
    "predict.py --help": [str(REPO / "scripts" / "predict.py"), "--help"],
    "predict.py topk=0 images=. (refused)": [str(REPO / "scripts" / "predict.py"), "checkpoint=none", "images=.",
                                               "topk=0"],
    "evaluate.py --help": [str(REPO / "scripts" / "evaluate.py"), "--help"],
    "export_main_branch.py --help": [str(REPO / "scripts" / "export_main_branch.py"), "--help"],
    "aggregate.py --help": [str(REPO / "scripts" / "aggregate.py"), "--help"],
}


def wall_time(args: list[str]) -> float:
    """Seconds for one fresh interpreter to run ``args`` (output discarded)."""
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, timeout=300)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # interleaved: a noisy minute hits every case alike
        for name, case in CASES.items():
            times[name].append(wall_time(case))
    print(f"| case | median s | range s ({args.repeats} runs) |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}–{max(values):.2f} |")


if __name__ == "__main__":
    main()
