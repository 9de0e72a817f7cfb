"""Protocol table: mean ± std of overall accuracy over repeated seeds (``rsnet-aggregate``; in a checkout also
``python scripts/aggregate.py``; its setting is in conf/aggregate.yaml).

    rsnet-train -m model=baseline,esd_mbenet,mgml_fenet seed=0,1,2      # or python scripts/train.py -m ...
    rsnet-aggregate folders=multirun/                                   # every metrics.json below the folder(s)
    rsnet-aggregate folders=[multirun/a,outputs/aid]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, ListConfig

from rsnet.cli import check_no_bare_words, user_errors
from rsnet.commands import hydra_config_path


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


def folder_list(folders: Any) -> list[Path]:
    """``folders=`` as paths: one folder, or a list of them."""
    items = list(folders) if isinstance(folders, (list, tuple, ListConfig)) else [folders]
    if not items:
        raise ValueError("folders=[] names no folder; pass folders=<run or multirun folder> or folders=[a,b]")
    return [Path(str(item)) for item in items]


@hydra.main(config_path=hydra_config_path(), config_name="aggregate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Print the table for the given folders."""
    with user_errors():
        folders = folder_list(cfg.folders)
        groups = collect(folders)
        if not groups:
            raise ValueError(f"no finished run (metrics.json) below {', '.join(map(str, folders))}")
        print(table(groups))


def run() -> None:
    """The ``rsnet-aggregate`` command (and scripts/aggregate.py)."""
    with user_errors():
        check_no_bare_words(sys.argv[1:], "folders")
    main()


if __name__ == "__main__":
    run()
