"""Protocol tables: mean ± std of overall accuracy, AA and kappa over repeated seeds, grouped by protocol
(``rsnet-aggregate folders=multirun/``; in a checkout also ``python scripts/aggregate.py``).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig

from rsnet.cli import check_no_bare_words, counted, user_errors
from rsnet.commands import hydra_config_path
from rsnet.commands.overrides import check_overrides


PROTOCOL_KEYS = ("train_ratio", "val_ratio", "image_size", "pretrained", "epochs")
Group = tuple[str, tuple[Any, ...], str, str]  # dataset, protocol values (PROTOCOL_KEYS), model, backbone


def run_protocol(run: dict[str, Any]) -> tuple[Any, ...]:
    """The protocol values of a run (``?`` where an older metrics.json did not record them)."""
    recorded = run.get("protocol", {})
    return tuple(recorded.get(key, run.get(key, "?")) for key in PROTOCOL_KEYS)


def collect(folders: list[Path]) -> dict[Group, list[dict[str, Any]]]:
    """Group every finished run's metrics.json below ``folders`` by dataset, protocol, model and backbone:
    runs that differ in train ratio, validation ratio, image size, weights or epochs are never averaged."""
    groups: dict[Group, list[dict[str, Any]]] = defaultdict(list)
    for folder in folders:
        if not folder.exists():
            raise FileNotFoundError(f"{folder} does not exist; pass run or multirun folders")
        for path in sorted(folder.rglob("metrics.json")):
            run = json.loads(path.read_text())
            if run.get("epochs") != run.get("epochs_planned"):
                print(f"skipping unfinished run {path} ({run.get('epochs')}/{run.get('epochs_planned')} epochs)",
                      file=sys.stderr)
                continue
            groups[(run["dataset"], run_protocol(run), run["model"], run["backbone"])].append(run)
    return groups


def mean_std(values: list[float], digits: int = 2) -> str:
    """``mean ± std`` (sample std); a single run's value alone (it has no spread to show)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(groups: dict[Group, list[dict[str, Any]]]) -> str:
    """A Markdown table, one row per group: main-branch OA, reported (ensemble) OA, average accuracy (AA) and
    kappa of the reported head, mean ± std over the seeds."""
    lines = ["| dataset | train ratio | val ratio | px | weights | epochs | model | backbone | seeds "
             "| main-branch OA (%) | reported OA (%) | AA (%) | kappa | wall time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (dataset, protocol, model, backbone), runs in sorted(groups.items(), key=lambda item: str(item[0])):
        seeds = ",".join(str(run["seed"]) for run in runs)
        lines.append(
            f"| {dataset} | {' | '.join(map(str, protocol))} | {model} | {backbone} | {seeds} "
            f"| {mean_std([r['oa']['main'] for r in runs])} "
            f"| {mean_std([r['accuracy'] for r in runs])} ({runs[0]['reported_head']}) "
            f"| {mean_std([r['average_accuracy'] for r in runs])} | {mean_std([r['kappa'] for r in runs], 4)} "
            f"| {statistics.mean(r['wall_time_s'] for r in runs):.0f} |")
    return "\n".join(lines)


def papers_table(groups: dict[Group, list[dict[str, Any]]]) -> str:
    """The papers' layout, one table per dataset (and image size, weights, epochs): a row per method (model,
    backbone, head), a column per training ratio, OA mean ± std over the seeds in each cell."""
    tables = []
    settings = sorted({(dataset, protocol[2:]) for dataset, protocol, _, _ in groups}, key=str)
    for dataset, rest in settings:
        chosen = {key: runs for key, runs in groups.items() if key[0] == dataset and key[1][2:] == rest}
        ratios = sorted({key[1][:2] for key in chosen}, key=str)
        header = [f"train {train:.0%}" + (f" (val {val:.0%} of it)" if val else "") if isinstance(train, float)
                  else f"train {train}" for train, val in ratios]
        size, weights, epochs = rest
        trained = counted(epochs, "epoch") if isinstance(epochs, int) else f"{epochs} epochs"
        lines = [f"{dataset}, {size} px, {weights}, {trained}: overall accuracy (%), mean ± std over seeds "
                 "(one seed: its value)",
                 "", f"| method | {' | '.join(header)} |", "|---" * (len(header) + 1) + "|"]
        methods = sorted({(model, backbone) for _, _, model, backbone in chosen})
        for model, backbone in methods:
            heads = ["main"] if model == "baseline" else ["main", "reported"]
            for head in heads:
                cells = []
                for ratio in ratios:
                    runs = chosen.get((dataset, (*ratio, *rest), model, backbone), [])
                    values = [r["oa"]["main"] if head == "main" else r["accuracy"] for r in runs]
                    cells.append(f"{mean_std(values)} (n={len(values)})" if values else "-")
                name = f"{model} ({backbone})" + ("" if model == "baseline" else
                                                  " main branch" if head == "main" else " ensemble")
                lines.append(f"| {name} | {' | '.join(cells)} |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def report(folders: list[Path]) -> str:
    """Both tables for the finished runs below ``folders``."""
    groups = collect(folders)
    if not groups:
        raise ValueError(f"no finished run (metrics.json) below {', '.join(map(str, folders))}")
    return f"{table(groups)}\n\n{papers_table(groups)}"


class SweepTable(Callback):
    """Hydra callback of ``rsnet-train -m``: print the protocol tables of the sweep's runs when it ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        folder = Path(config.hydra.sweep.dir)
        try:
            print(f"\nrsnet-aggregate folders={folder}\n{report([folder])}")
        except ValueError as error:  # every job failed: Hydra has reported them
            print(f"no table: {error}", file=sys.stderr)


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
        print(report(folder_list(cfg.folders)))


def run() -> None:
    """The ``rsnet-aggregate`` command (and scripts/aggregate.py)."""
    with user_errors():
        check_no_bare_words(sys.argv[1:], "folders")
        check_overrides("aggregate", sys.argv[1:], sys.argv[0])
    main()


if __name__ == "__main__":
    run()
