"""rsnet-aggregate averages only runs that are one experiment but for the seed, refuses a seed seen twice in a row,
and names every metrics.json it skips (hand-made run folders: metrics.json and .hydra/config.yaml, no training)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, training_config
from omegaconf import OmegaConf

from rsnet.commands.aggregate import collect, report
from rsnet.run_folders import dataset_folder

CLASSES = ["forest", "river", "beach"]


@functools.cache
def base_config() -> str:
    """rsnet-train's composed settings for an image folder, as a run records them (JSON text, to copy)."""
    return json.dumps(training_config("dataset=image_folder", "dataset.root=/data/scenes", "dataset.image_size=64",
                                      "backbone=test_resnet", "epochs=2"))


def write_run(folder: Path, *, seed: int = 0, accuracy: float = 80.0, classes: list[str] = CLASSES,
              settings: dict[str, object] | None = None, record_config: bool = True) -> Path:
    """A finished run in ``folder``: metrics.json as rsnet-train writes it and, unless ``record_config`` is false,
    .hydra/config.yaml with the dotted ``settings`` set (``seed`` too)."""
    config = OmegaConf.create(json.loads(base_config()))
    for key, value in {**(settings or {}), "seed": seed}.items():
        OmegaConf.update(config, key, value, merge=False, force_add=True)
    per_class = {name: accuracy for name in classes}
    train_per_class = round(10 * config.dataset.train_ratio)  # of 10 images a class
    run = {"dataset": config.dataset.name, "model": config.model.arch, "backbone": config.backbone.name,
           "trainer": config.trainer.name, "seed": seed,
           "protocol": {"dataset": config.dataset.name,
                        "data": dataset_folder(config.dataset.name, config.dataset.root, config.dataset.get("bands")),
                        "train_ratio": config.dataset.train_ratio,
                        "val_ratio": config.dataset.val_ratio, "image_size": config.dataset.image_size,
                        "pretrained": "scratch", "epochs": config.epochs, "eval_every": config.eval_every,
                        "selection": "last epoch"},
           "epochs": config.epochs, "epochs_planned": config.epochs, "train_samples": train_per_class * len(classes),
           "val_samples": 0, "test_samples": (10 - train_per_class) * len(classes), "wall_time_s": 10.0,
           "reported_head": "ensemble",
           "oa": {"main": accuracy - 1.0, "ensemble": accuracy}, "accuracy": accuracy, "kappa": accuracy / 100.0,
           "average_accuracy": accuracy, "per_class_accuracy": per_class,
           "scheduler": {"strategy": config.trainer.name, "workers": [{"rank": 0, "device": "cpu"}]}}
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(run))
    if record_config:
        (folder / ".hydra").mkdir()
        OmegaConf.save(config, folder / ".hydra" / "config.yaml")
    return folder / "metrics.json"


def table_rows(text: str) -> list[str]:
    """The rows of the first (per-group) table of a report."""
    first_table = text.split("\n\n")[0].splitlines()
    return [line for line in first_table[2:] if line.startswith("| ")]


def aggregate_command(*folders: Path) -> subprocess.CompletedProcess:
    """scripts/aggregate.py as a user runs it."""
    argument = f"folders={folders[0]}" if len(folders) == 1 else f"folders=[{','.join(map(str, folders))}]"
    return subprocess.run([sys.executable, str(REPO / "scripts" / "aggregate.py"), argument], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_runs_of_different_image_folders_are_never_averaged_as_seeds(tmp_path: Path) -> None:
    for index, classes in enumerate((["a", "b", "c"], ["d", "e", "f"], ["a", "b", "c", "d"])):
        write_run(tmp_path / f"folder{index}/seed0", accuracy=40.0 + 10 * index, classes=classes,
                  settings={"dataset.root": f"/data/folder{index}"})
    text = report([tmp_path])
    rows = table_rows(text)
    assert len(rows) == 3 and all(" | 0 | " in row for row in rows)  # one seed each, never "0,0,0"
    assert "±" not in "\n".join(rows)
    assert any("dataset.root=/data/folder2" in row and "classes=4 (a, b, c, …)" in row for row in rows)


def test_the_same_root_with_other_classes_is_another_dataset(tmp_path: Path) -> None:
    write_run(tmp_path / "before/seed0", seed=0, classes=["a", "b", "c"])
    write_run(tmp_path / "after/seed1", seed=1, classes=["a", "b", "c", "d"])
    assert sorted(len(runs) for runs in collect([tmp_path]).values()) == [1, 1]


def test_runs_of_other_train_ratios_share_a_papers_table(tmp_path: Path) -> None:
    for ratio in (0.2, 0.5):
        write_run(tmp_path / f"r{ratio}/seed0", accuracy=100 * ratio, settings={"dataset.train_ratio": ratio})
    text = report([tmp_path])
    assert "| method | train 20% | train 50% |" in text and "rows differ in: only the columns above" in text


def test_a_setting_that_differs_splits_the_row_and_is_named(tmp_path: Path) -> None:
    for batch_size in (1, 32, 1000):
        for seed in (0, 1):
            write_run(tmp_path / f"b{batch_size}/seed{seed}", seed=seed, accuracy=50.0 + batch_size / 100 + seed,
                      settings={"batch_size": batch_size})
    text = report([tmp_path])
    rows = table_rows(text)
    assert len(rows) == 3 and all(" | 0,1 | " in row for row in rows)
    assert any(row.endswith("| batch_size=1000 |") for row in rows)
    assert "rows differ in: batch_size" in text
    assert "compared: every setting of .hydra/config.yaml but" in text
    assert ", batch_size=32: overall accuracy (%)" in text  # the papers' layout: a table per batch size


def test_settings_that_are_not_the_experiment_do_not_split_a_row(tmp_path: Path) -> None:
    write_run(tmp_path / "a/seed0", seed=0, accuracy=80.0,
              settings={"run_dir": "/out/a", "log.progress_bar": True, "trainer.cpu_threads": 2, "prefetch": True})
    write_run(tmp_path / "b/seed1", seed=1, accuracy=82.0,
              settings={"run_dir": "/out/b", "log.progress_bar": False, "trainer.cpu_threads": 8, "prefetch": False})
    rows = table_rows(report([tmp_path]))
    assert len(rows) == 1 and " | 0,1 | " in rows[0] and "81.00 ± 1.41 (ensemble)" in rows[0]


def test_a_model_setting_splits_rows_of_that_model_only(tmp_path: Path) -> None:
    write_run(tmp_path / "t3/seed0", settings={"model.loss.temperature": 3.0})
    write_run(tmp_path / "t4/seed0", settings={"model.loss.temperature": 4.0})
    write_run(tmp_path / "base/seed0", settings={"model": {"arch": "baseline", "options": {"drop_rate": 0.0}}})
    text = report([tmp_path])
    assert "| baseline (test_resnet) | 79.00 (n=1) |" in text  # one table: baseline's settings are its own
    assert "| esd_mbenet (test_resnet, model.loss.temperature=4.0) main branch | 79.00 (n=1) |" in text


def test_the_same_seed_twice_is_refused_and_both_files_are_named(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    first = write_run(tmp_path / "a/seed0", seed=0, accuracy=80.0)
    again = write_run(tmp_path / "copy/seed0", seed=0, accuracy=70.0)
    write_run(tmp_path / "a/seed1", seed=1, accuracy=90.0)
    write_run(tmp_path / "other/seed0", seed=0, accuracy=60.0, settings={"batch_size": 8})
    text = report([tmp_path])
    refused = [line for line in capsys.readouterr().err.splitlines() if "seed 0" in line]
    assert len(refused) == 1 and str(first) in refused[0] and str(again) in refused[0]
    rows = table_rows(text)
    assert len(rows) == 1 and "| batch_size=8 |" in rows[0]  # the refused row is left out, never averaged


def test_a_truncated_or_foreign_metrics_json_is_named_and_the_rest_aggregated(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "good/seed0")
    truncated = write_run(tmp_path / "cut/seed1", seed=1)
    truncated.write_text(truncated.read_text()[:40])
    foreign = tmp_path / "other_tool" / "metrics.json"
    foreign.parent.mkdir()
    foreign.write_text(json.dumps({"loss": 0.1}))
    rows = table_rows(report([tmp_path]))
    assert len(rows) == 1 and " | 0 | " in rows[0]
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith(f"skipping {truncated}: not valid JSON") for line in err)
    assert any(line.startswith(f"skipping {foreign}: not a metrics.json of rsnet-train") and "seed" in line
               for line in err)


def test_a_broken_config_record_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "good/seed0")
    broken = write_run(tmp_path / "broken/seed1", seed=1)
    (broken.parent / ".hydra" / "config.yaml").write_text("batch_size: [32\n")
    rows = table_rows(report([tmp_path]))
    assert len(rows) == 1 and " | 0 | " in rows[0]
    assert any(line.startswith(f"skipping {broken}: its {broken.parent / '.hydra' / 'config.yaml'} cannot be read")
               for line in capsys.readouterr().err.splitlines())


def test_runs_without_a_config_record_group_apart_and_are_said(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "recorded/seed0")
    write_run(tmp_path / "bare/seed1", seed=1, record_config=False)
    rows = table_rows(report([tmp_path]))
    assert len(rows) == 2 and any(row.endswith("| .hydra/config.yaml=missing |") for row in rows)
    assert "1 run has no .hydra/config.yaml" in capsys.readouterr().err


def test_only_bad_files_is_one_line_naming_them_and_exit_2(tmp_path: Path) -> None:
    truncated = write_run(tmp_path / "cut/seed0")
    truncated.write_text(truncated.read_text()[:40])
    foreign = tmp_path / "other_tool" / "metrics.json"
    foreign.parent.mkdir()
    foreign.write_text("[1, 2]")
    result = aggregate_command(tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert "Traceback" not in result.stderr and len(lines) == 3
    assert lines[0].startswith(f"skipping {truncated}: not valid JSON (Unterminated string")
    assert lines[1].startswith(f"skipping {foreign}: not a metrics.json of rsnet-train")
    assert lines[2] == f"error: no finished run (metrics.json) below {tmp_path} (2 files left out, named above)"


def test_bare_runs_on_two_image_folders_are_two_rows(tmp_path: Path) -> None:
    for seed, root in enumerate(("/data/forests", "/data/cities")):
        write_run(tmp_path / f"{Path(root).name}/seed{seed}", seed=seed, record_config=False,
                  settings={"dataset.name": "image_folder", "dataset.root": root})
    rows = table_rows(report([tmp_path]))
    assert len(rows) == 2 and all(" | 0 | " in row or " | 1 | " in row for row in rows)
    assert any("data=image_folder-forests-" in row for row in rows)


def test_bare_runs_that_do_not_record_their_data_are_never_averaged(tmp_path: Path) -> None:
    for seed in (0, 1):
        path = write_run(tmp_path / f"run{seed}/seed{seed}", seed=seed, record_config=False)
        summary = json.loads(path.read_text())
        del summary["protocol"]["data"]  # a metrics.json of an rsnet before protocol.data
        path.write_text(json.dumps(summary))
    rows = table_rows(report([tmp_path]))
    assert len(rows) == 2 and any(f"run={tmp_path / 'run0' / 'seed0'}" in row for row in rows)
