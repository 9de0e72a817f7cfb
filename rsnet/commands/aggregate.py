"""Protocol tables (``rsnet-aggregate folders=multirun/``): mean ± std of OA, AA and kappa over the seeds of runs that
are one experiment but for the seed (every setting compared but :data:`IGNORED_SETTINGS`)."""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import hydra
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rsnet.cli import check_no_bare_words, counted, user_errors
from rsnet.commands import hydra_config_path
from rsnet.commands.overrides import check_overrides


PROTOCOL_KEYS = ("train_ratio", "val_ratio", "image_size", "pretrained", "epochs")
CONFIG_RECORD = Path(".hydra") / "config.yaml"
# Not what a run measures: the seed, where and how it was started, logging, and speed or hardware choices that give
# the same numbers up to float rounding (the number of workers changes training: compared from metrics.json).
IGNORED_SETTINGS = ("seed", "run_dir", "resume", "overwrite", "log.*", "eval_batch_size", "prefetch", "channels_last",
                    "compile", "deterministic", "dataset.cache", "dataset.cache_dir", "dataset.max_pixels",
                    "trainer.devices", "trainer.cpu_threads", "trainer.backend", "trainer.timeout_s",
                    "trainer.log_intervals", "trainer.probe_timeout_s")
# Settings added after runs were made, with the value a run that lacks them had: such a run is compared as having it.
ADDED_SETTINGS = {"model.options.main_pool": "avg", "model.options.main_heads": [], "eval_amp": "none"}
# Shown in the table's own columns (from metrics.json).
COLUMN_SETTINGS = ("dataset.name", "dataset.train_ratio", "dataset.val_ratio", "dataset.image_size",
                   "backbone.pretrained", "epochs", "model.arch", "backbone.name", "trainer.name")
# Facts of metrics.json compared besides the columns (images: train + val + test, the same at any train ratio;
# data: the dataset part of the run's folder name, which tells image folders and band choices apart).
RECORDED_FACTS = ("trainer", "data", "classes", "images", "workers", "eval_every")
NUMBER = (int, float)
SUMMARY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "dataset": str, "model": str, "backbone": str, "seed": int, "epochs": int, "epochs_planned": int,
    "reported_head": str, "oa": dict, "accuracy": NUMBER, "average_accuracy": NUMBER, "kappa": NUMBER,
    "wall_time_s": NUMBER}
Setting = tuple[str, str]  # a dotted setting name and its value as text


class Group(NamedTuple):
    """What a row's runs share: everything but the seed."""
    dataset: str
    protocol: tuple[Any, ...]  # the values of PROTOCOL_KEYS
    model: str
    backbone: str
    settings: tuple[Setting, ...]  # every other compared setting, sorted by name


@dataclass(frozen=True)
class Run:
    """A finished run: its metrics.json and what it records."""
    path: Path
    summary: dict[str, Any]


def run_protocol(run: dict[str, Any]) -> tuple[Any, ...]:
    """The protocol values of a run (``?`` where an older metrics.json did not record them)."""
    recorded = run.get("protocol", {})
    return tuple(recorded.get(key, run.get(key, "?")) for key in PROTOCOL_KEYS)


def setting_text(value: Any) -> str:
    """A setting's value as text: a string as it is, anything else as JSON (``null``, ``[1.0, 2.0]``)."""
    return value if isinstance(value, str) else json.dumps(value)


def flat_settings(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted names and their values (``{"model.loss.alpha": 1.0, ...}``)."""
    if not isinstance(node, dict) or not node:
        return {prefix.removesuffix("."): node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(flat_settings(value, f"{prefix}{key}."))
    return flat


def is_one_of(name: str, settings: tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``settings``, ``log.*`` standing for every setting below ``log``."""
    return any(name == setting or setting.endswith(".*") and name.startswith(setting[:-1]) for setting in settings)


def summary_problems(summary: Any) -> list[str]:
    """Why a metrics.json document is not rsnet-train's run summary (nothing when it is)."""
    if not isinstance(summary, dict):
        return [f"a JSON {type(summary).__name__}, not an object"]
    missing = [field for field in SUMMARY_FIELDS if field not in summary]
    wrong = [field for field, kind in SUMMARY_FIELDS.items() if field in summary
             and (not isinstance(summary[field], kind) or isinstance(summary[field], bool))]
    if "oa" in summary and isinstance(summary["oa"], dict) and not isinstance(summary["oa"].get("main"), NUMBER):
        wrong.append("oa.main")
    wrong += [field for field in ("protocol", "scheduler", "per_class_accuracy")
              if field in summary and not isinstance(summary[field], dict)]
    problems = [f"no {', '.join(missing)}"] if missing else []
    return problems + ([f"{', '.join(wrong)} of the wrong type"] if wrong else [])


def recorded_facts(summary: dict[str, Any]) -> dict[str, Any]:
    """The facts of RECORDED_FACTS that a run summary holds."""
    recorded = summary.get("protocol", {})
    facts = {"trainer": summary.get("trainer"), "data": recorded.get("data"), "eval_every": recorded.get("eval_every")}
    if isinstance(summary.get("per_class_accuracy"), dict):
        facts["classes"] = list(summary["per_class_accuracy"])
    if all(isinstance(summary.get(f"{part}_samples"), int) for part in ("train", "val", "test")):
        facts["images"] = sum(summary[f"{part}_samples"] for part in ("train", "val", "test"))
    if isinstance(summary.get("scheduler", {}).get("workers"), list):
        facts["workers"] = len(summary["scheduler"]["workers"])
    return {name: value for name, value in facts.items() if value is not None}


def compared_settings(summary: dict[str, Any], config: dict[str, Any] | None, path: Path) -> tuple[Setting, ...]:
    """Every setting a run is compared by besides the columns: its recorded config (``config``; None where the run
    has no .hydra/config.yaml) but IGNORED_SETTINGS, and its facts of RECORDED_FACTS. A run that records neither
    its config nor its data (a metrics.json of an rsnet before ``protocol.data``) is compared by its folder: it is
    a row of its own, never averaged with a run on data that may be other."""
    recorded = ({CONFIG_RECORD.as_posix(): "missing"} if config is None else
                {name: value for name, value in flat_settings(config).items()
                 if not is_one_of(name, IGNORED_SETTINGS + COLUMN_SETTINGS)})
    if config is not None:
        for name, value in ADDED_SETTINGS.items():
            recorded.setdefault(name, value)
    recorded.update(recorded_facts(summary))
    if config is None and "data" not in recorded:
        recorded["run"] = str(path.parent)
    return tuple(sorted((name, setting_text(value)) for name, value in recorded.items()))


class Skipped(Exception):
    """A metrics.json left out, and why."""


def read_run(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A metrics.json's run summary and the config recorded beside it (None where there is none); Skipped when
    either cannot be read or the summary is not rsnet-train's."""
    try:
        summary = json.loads(path.read_bytes())
    except ValueError as error:
        raise Skipped(f"not valid JSON ({error}); copy the run again or remove the file") from None
    except OSError as error:
        raise Skipped(f"cannot be read ({error.strerror})") from None
    if problems := summary_problems(summary):
        raise Skipped(f"not a metrics.json of rsnet-train ({'; '.join(problems)}); move it out of the folders")
    config_path = path.parent / CONFIG_RECORD
    if not config_path.exists():
        return summary, None
    try:
        config = OmegaConf.to_container(OmegaConf.load(config_path), resolve=False)
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as error:
        raise Skipped(f"its {config_path} cannot be read ({' '.join(str(error).split())})") from None
    if not isinstance(config, dict):
        raise Skipped(f"its {config_path} is not a mapping of settings")
    return summary, config


def collect(folders: list[Path]) -> dict[Group, list[Run]]:
    """Group every finished run's metrics.json below ``folders`` by everything but the seed (:class:`Group`); each
    file left out (unfinished, unreadable, not rsnet-train's) is named on stderr with why."""
    groups: dict[Group, list[Run]] = defaultdict(list)
    unrecorded: list[Path] = []
    for folder in folders:
        if not folder.exists():
            raise FileNotFoundError(f"{folder} does not exist; pass run or multirun folders")
        for path in sorted(folder.rglob("metrics.json")):
            try:
                summary, config = read_run(path)
            except Skipped as why:
                print(f"skipping {path}: {why}", file=sys.stderr)
                continue
            if summary["epochs"] != summary["epochs_planned"]:
                print(f"skipping unfinished run {path} ({summary['epochs']}/{summary['epochs_planned']} epochs)",
                      file=sys.stderr)
                continue
            if config is None:
                unrecorded.append(path)
            group = Group(summary["dataset"], run_protocol(summary), summary["model"], summary["backbone"],
                          compared_settings(summary, config, path))
            groups[group].append(Run(path, summary))
    if unrecorded:
        more = len(unrecorded) - 3
        named = ", ".join(map(str, unrecorded[:3])) + (f" and {more} more" if more > 0 else "")
        print(f"note: {counted(len(unrecorded), 'run')} {'has' if len(unrecorded) == 1 else 'have'} no "
              f"{CONFIG_RECORD.as_posix()} ({named}): grouped by what metrics.json records only, apart from the runs "
              "that have one (a metrics.json without protocol.data, the data it ran on: a row of its own)",
              file=sys.stderr)
    return groups


def scope(group: Group, name: str) -> str | None:
    """What a setting is compared among: a config group's setting (``model.loss.alpha``) among the runs of the same
    choice of that group (the same model), any other setting among all runs (None)."""
    prefix, dot, _ = name.partition(".")
    choices = {"dataset": group.dataset, "model": group.model, "backbone": group.backbone,
               "trainer": dict(group.settings).get("trainer", "")}
    return choices.get(prefix) if dot else None


def differing_settings(groups: Iterable[Group]) -> set[tuple[str, str | None]]:
    """The (setting, scope) pairs whose value is not the same in every group of that scope: a setting that a group
    with a recorded config lacks counts as a value; what a group without one lacks is unknown, not different."""
    names = {name for group in groups for name, _ in group.settings}
    values: dict[tuple[str, str | None], set[str | None]] = defaultdict(set)
    for group in groups:
        settings = dict(group.settings)
        for name in settings if CONFIG_RECORD.as_posix() in settings else names:
            values[(name, scope(group, name))].add(settings.get(name))
    return {pair for pair, seen in values.items() if len(seen) > 1}


def shown_value(name: str, value: str) -> str:
    """A setting's value as a table shows it: a class list as its count and first names."""
    if name != "classes":
        return value
    classes = json.loads(value)
    return f"{len(classes)} ({', '.join(classes[:3])}{', …' if len(classes) > 3 else ''})"


def distinguishing(group: Group, differing: set[tuple[str, str | None]], method: bool | None = None) -> str:
    """``name=value, ...`` of the group's settings that differ between groups; ``method``: only the model's and
    backbone's (True) or only the others (False)."""
    return ", ".join(f"{name}={shown_value(name, value)}" for name, value in group.settings
                     if (name, scope(group, name)) in differing
                     and (method is None or method == is_one_of(name, ("model.*", "backbone.*"))))


def repeated_seeds(runs: list[Run]) -> dict[int, list[Path]]:
    """The seeds that more than one of ``runs`` has, with their files."""
    counts = Counter(run.summary["seed"] for run in runs)
    return {seed: [run.path for run in runs if run.summary["seed"] == seed] for seed, count in counts.items()
            if count > 1}


def refuse_repeated_seeds(groups: dict[Group, list[Run]],
                          differing: set[tuple[str, str | None]]) -> dict[Group, list[Run]]:
    """``groups`` but those in which a seed occurs twice (one draw counted twice is not a repeat), each named on
    stderr with the files of its repeated seeds."""
    kept = {}
    for group, runs in groups.items():
        if not (repeated := repeated_seeds(runs)):
            kept[group] = runs
            continue
        row = ", ".join(filter(None, [group.dataset, group.model, group.backbone, distinguishing(group, differing)]))
        seeds = "; ".join(f"seed {seed} in {len(paths)} runs ({', '.join(map(str, paths))})"
                          for seed, paths in sorted(repeated.items()))
        print(f"refusing the row {row}: {seeds}: the same seed twice is one draw counted twice, not a repeat; "
              "move all but one out of the folders", file=sys.stderr)
    return kept


def mean_std(values: list[float], digits: int = 2) -> str:
    """``mean ± std`` (sample std); a single run's value alone (it has no spread to show)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(groups: dict[Group, list[Run]], differing: set[tuple[str, str | None]] | None = None) -> str:
    """A Markdown table, one row per group: main-branch OA, reported OA, AA and kappa, mean ± std over the seeds, and
    the group's settings that differ from other rows' (``differing``); then which settings were compared."""
    differing = differing_settings(groups) if differing is None else differing
    lines = ["| dataset | train ratio | val ratio | px | weights | epochs | model | backbone | seeds "
             "| main-branch OA (%) | reported OA (%) | AA (%) | kappa | wall time (s) | other settings |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for group in sorted(groups, key=str):
        summaries = [run.summary for run in sorted(groups[group], key=lambda run: run.summary["seed"])]
        seeds = ",".join(str(summary["seed"]) for summary in summaries)
        lines.append(
            f"| {group.dataset} | {' | '.join(map(str, group.protocol))} | {group.model} | {group.backbone} "
            f"| {seeds} | {mean_std([s['oa']['main'] for s in summaries])} "
            f"| {mean_std([s['accuracy'] for s in summaries])} ({summaries[0]['reported_head']}) "
            f"| {mean_std([s['average_accuracy'] for s in summaries])} "
            f"| {mean_std([s['kappa'] for s in summaries], 4)} "
            f"| {statistics.mean(s['wall_time_s'] for s in summaries):.0f} "
            f"| {distinguishing(group, differing) or '-'} |")
    names = sorted({name for name, _ in differing})
    lines += ["", f"compared: every setting of {CONFIG_RECORD.as_posix()} but {', '.join(IGNORED_SETTINGS)}, and "
              f"metrics.json's dataset, protocol, model, backbone, {', '.join(RECORDED_FACTS)}; a row's runs differ "
              "only in the seed",
              f"rows differ in: {', '.join(names) if names else 'only the columns above'}"]
    return "\n".join(lines)


def papers_table(groups: dict[Group, list[Run]], differing: set[tuple[str, str | None]] | None = None) -> str:
    """The papers' layout, one table per dataset and other differing settings, a row per method and head, a column per
    training ratio, OA mean ± std over the seeds in each cell."""
    differing = differing_settings(groups) if differing is None else differing
    tables: dict[tuple[str, tuple[Any, ...], str], dict[tuple[str, str, str], dict[tuple[Any, ...], list[Run]]]]
    tables = defaultdict(lambda: defaultdict(dict))
    for group in sorted(groups, key=str):
        setting = (group.dataset, group.protocol[2:], distinguishing(group, differing, method=False))
        method = (group.model, group.backbone, distinguishing(group, differing, method=True))
        tables[setting][method][group.protocol[:2]] = groups[group]
    texts = []
    for (dataset, (size, weights, epochs), others), methods in tables.items():
        ratios = sorted({ratio for cells in methods.values() for ratio in cells}, key=str)
        header = [f"train {train:.0%}" + (f" (val {val:.0%} of it)" if val else "") if isinstance(train, float)
                  else f"train {train}" for train, val in ratios]
        trained = counted(epochs, "epoch") if isinstance(epochs, int) else f"{epochs} epochs"
        lines = [f"{dataset}, {size} px, {weights}, {trained}{', ' + others if others else ''}: overall accuracy "
                 "(%), mean ± std over seeds (one seed: its value)",
                 "", f"| method | {' | '.join(header)} |", "|---" * (len(header) + 1) + "|"]
        for (model, backbone, own), cells in sorted(methods.items()):
            for head in ["main"] if model == "baseline" else ["main", "reported"]:
                values = [[run.summary["oa"]["main"] if head == "main" else run.summary["accuracy"]
                           for run in cells.get(ratio, [])] for ratio in ratios]
                row = [f"{mean_std(v)} (n={len(v)})" if v else "-" for v in values]
                name = f"{model} ({backbone}{', ' + own if own else ''})" + (
                    "" if model == "baseline" else " main branch" if head == "main" else " ensemble")
                lines.append(f"| {name} | {' | '.join(row)} |")
        texts.append("\n".join(lines))
    return "\n\n".join(texts)


def report(folders: list[Path]) -> str:
    """Both tables for the finished runs below ``folders``; rows with a seed twice are refused (named on stderr)."""
    groups = collect(folders)
    differing = differing_settings(groups)
    if not (kept := refuse_repeated_seeds(groups, differing)):
        left_out = sum(1 for folder in folders for _ in folder.rglob("metrics.json"))
        raise ValueError(f"no finished run (metrics.json) below {', '.join(map(str, folders))}"
                         + (f" ({counted(left_out, 'file')} left out, named above)" if left_out else ""))
    return f"{table(kept, differing)}\n\n{papers_table(kept, differing)}"


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
