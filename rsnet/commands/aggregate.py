"""Protocol table: mean ± std of overall accuracy over repeated seeds.

    rsnet-train -m model=baseline,esd_mbenet,mgml_fenet seed=0,1,2      # or python scripts/train.py -m ...
    rsnet-aggregate multirun/            # every metrics.json below the given folders
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def collect(folders: list[Path]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Group every run's metrics.json below ``folders`` by (dataset, model, backbone)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for folder in folders:
        if not folder.exists():
            raise FileNotFoundError(f"{folder} does not exist; pass run or multirun folders")
        for path in sorted(folder.rglob("metrics.json")):
            run = json.loads(path.read_text())
            if run.get("epochs") != run.get("epochs_planned"):
                print(f"skipping unfinished run {path} ({run.get('epochs')}/{run.get('epochs_planned')} epochs)",
                      file=sys.stderr)
                continue
            groups[(run["dataset"], run["model"], run["backbone"])].append(run)
    return groups


def mean_std(values: list[float]) -> str:
    """``mean ± std`` (sample std; 0 for a single run)."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {spread:.2f}"


def table(groups: dict[tuple[str, str, str], list[dict[str, Any]]]) -> str:
    """A Markdown table: main-branch OA, reported (ensemble) OA and kappa over the seeds of every group."""
    lines = ["| dataset | model | backbone | seeds | main-branch OA (%) | reported OA (%) | kappa | wall time (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for (dataset, model, backbone), runs in sorted(groups.items()):
        seeds = ",".join(str(run["seed"]) for run in runs)
        lines.append(
            f"| {dataset} | {model} | {backbone} | {seeds} | {mean_std([r['oa']['main'] for r in runs])} "
            f"| {mean_std([r['accuracy'] for r in runs])} ({runs[0]['reported_head']}) "
            f"| {mean_std([r['kappa'] for r in runs])} | {statistics.mean(r['wall_time_s'] for r in runs):.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the table for the given folders."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="run or multirun folders holding metrics.json files")
    args = parser.parse_args(argv)
    try:
        groups = collect(args.folders)
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
    if not groups:
        sys.exit(f"error: no finished run (metrics.json) below {', '.join(map(str, args.folders))}")
    print(table(groups))


if __name__ == "__main__":
    main()
