"""rsnet-aggregate's grouping and tables on hand-made metrics.json files (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rsnet.commands.aggregate import collect, papers_table, report, table


def write_run(folder: Path, *, seed: int, train_ratio: float, accuracy: float, model: str = "esd_mbenet",
              epochs: int = 30, protocol: bool = True) -> None:
    run = {"dataset": "aid", "model": model, "backbone": "resnet18", "seed": seed, "epochs": epochs,
           "epochs_planned": epochs, "oa": {"main": accuracy - 1.0, "ensemble": accuracy}, "accuracy": accuracy,
           "reported_head": "ensemble", "average_accuracy": accuracy - 0.5, "kappa": accuracy / 100.0,
           "wall_time_s": 10.0}
    if protocol:
        run["protocol"] = {"dataset": "aid", "data": "aid", "train_ratio": train_ratio, "val_ratio": 0.0,
                           "image_size": 64, "pretrained": "scratch", "epochs": epochs, "eval_every": 1,
                           "selection": "last epoch"}
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(run))


def test_runs_of_two_train_ratios_are_never_averaged(tmp_path: Path) -> None:
    for seed, accuracy in ((0, 80.0), (1, 82.0)):
        write_run(tmp_path / f"r0.2/seed{seed}", seed=seed, train_ratio=0.2, accuracy=accuracy)
    write_run(tmp_path / "r0.5/seed0", seed=0, train_ratio=0.5, accuracy=90.0)
    groups = collect([tmp_path])
    assert sorted(len(runs) for runs in groups.values()) == [1, 2]
    text = table(groups)
    assert "| aid | 0.2 | 0.0 | 64 | scratch | 30 | esd_mbenet | resnet18 | 0,1 | 80.00 ± 1.41 " \
           "| 81.00 ± 1.41 (ensemble) | 80.50 ± 1.41 | 0.8100 ± 0.0141 | 10 |" in text
    # one seed: its value, not "89.00 ± 0.00"
    assert "| aid | 0.5 | 0.0 | 64 | scratch | 30 | esd_mbenet | resnet18 | 0 | 89.00 | 90.00 (ensemble) |" in text


def test_papers_layout_has_a_column_per_ratio_and_a_row_per_head(tmp_path: Path) -> None:
    write_run(tmp_path / "a", seed=0, train_ratio=0.2, accuracy=80.0)
    write_run(tmp_path / "b", seed=0, train_ratio=0.5, accuracy=90.0)
    write_run(tmp_path / "c", seed=0, train_ratio=0.5, accuracy=85.0, model="baseline")
    lines = papers_table(collect([tmp_path])).splitlines()
    assert lines[0] == ("aid, 64 px, scratch, 30 epochs: overall accuracy (%), mean ± std over seeds "
                        "(one seed: its value)")
    assert lines[2] == "| method | train 20% | train 50% |"
    assert "| baseline (resnet18) | - | 84.00 (n=1) |" in lines
    assert "| esd_mbenet (resnet18) main branch | 79.00 (n=1) | 89.00 (n=1) |" in lines
    assert "| esd_mbenet (resnet18) ensemble | 80.00 (n=1) | 90.00 (n=1) |" in lines


def test_other_epochs_make_another_table_and_older_files_group_apart(tmp_path: Path) -> None:
    write_run(tmp_path / "a", seed=0, train_ratio=0.5, accuracy=80.0)
    write_run(tmp_path / "b", seed=0, train_ratio=0.5, accuracy=70.0, epochs=1)
    write_run(tmp_path / "old", seed=0, train_ratio=0.5, accuracy=60.0, protocol=False)
    text = report([tmp_path])
    assert text.count("overall accuracy (%), mean ± std over seeds") == 3
    assert "| aid | ? | ? | ? | ? | 30 | esd_mbenet |" in text  # an older metrics.json: unknown protocol
    assert "aid, 64 px, scratch, 1 epoch: overall" in text and "1 epochs" not in text


def test_unfinished_runs_are_skipped_and_nothing_left_is_an_error(tmp_path: Path) -> None:
    write_run(tmp_path / "a", seed=0, train_ratio=0.5, accuracy=80.0)
    path = tmp_path / "a" / "metrics.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "epochs": 3}))
    with pytest.raises(ValueError, match="no finished run"):
        report([tmp_path])


def test_a_run_from_before_a_setting_was_added_is_averaged_with_runs_that_record_its_old_value(tmp_path: Path) -> None:
    """model.options.main_pool came after runs were made: a run without it pooled as ``avg`` does, so it joins the
    row of new runs recording ``avg`` and not that of ``grid2``."""
    for seed, pool in ((0, None), (1, "avg"), (2, "grid2")):
        folder = tmp_path / f"seed{seed}"
        write_run(folder, seed=seed, train_ratio=0.5, accuracy=70.0 + seed)
        options = "" if pool is None else f"  options:\n    main_pool: {pool}\n"
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "config.yaml").write_text(f"model:\n  arch: esd_mbenet\n{options}")
    groups = collect([tmp_path])
    assert sorted(sorted(run.summary["seed"] for run in runs) for runs in groups.values()) == [[0, 1], [2]]
