"""history.csv and curves.png: a run's per-epoch figures for readers without TensorBoard."""

from __future__ import annotations

import csv
from pathlib import Path

from PIL import Image

from rsnet.engine.run_history import flat_record, write_history

HISTORY = [
    {"epoch": 1, "wall_time_s": 3.5, "test_accuracy": 40.0, "oa": {"main": 38.0, "ensemble": 40.0},
     "train/loss/total": 2.5, "train/oa_main": 30.0, "val_accuracy": 41.0},
    {"epoch": 2, "wall_time_s": 7.0, "test_accuracy": 55.0, "oa": {"main": 52.0, "ensemble": 55.0},
     "train/loss/total": 1.5, "train/oa_main": 50.0, "val_accuracy": 56.0},
]


def test_nested_figures_become_slash_columns() -> None:
    assert flat_record({"epoch": 1, "oa": {"main": 2.0, "aux": {"a": 3}}}) == {"epoch": 1, "oa/main": 2.0,
                                                                                "oa/aux/a": 3}


def test_history_csv_has_a_row_per_epoch_and_curves_show_accuracy_and_loss(tmp_path: Path) -> None:
    write_history(tmp_path, HISTORY)
    with (tmp_path / "history.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["epoch", "wall_time_s", "test_accuracy", "oa/main", "oa/ensemble", "train/loss/total",
                             "train/oa_main", "val_accuracy"]
    assert [row["val_accuracy"] for row in rows] == ["41.0", "56.0"] and rows[1]["oa/main"] == "52.0"
    curves = Image.open(tmp_path / "curves.png").convert("RGB")
    assert curves.size == (900, 1160)  # two panels: accuracy, then the loss
    colours = {curves.getpixel((x, y)) for x in range(0, 900, 3) for y in range(0, 1160, 3)}
    assert {(31, 119, 180), (214, 39, 40), (44, 160, 44)} <= colours  # test, validation and training curves drawn


def test_without_loss_or_validation_one_panel_and_no_empty_column(tmp_path: Path) -> None:
    write_history(tmp_path, [{"epoch": 1, "test_accuracy": 40.0}, {"epoch": 2, "test_accuracy": 50.0}])
    assert (tmp_path / "history.csv").read_text() == "epoch,test_accuracy\n1,40.0\n2,50.0\n"
    assert Image.open(tmp_path / "curves.png").size == (900, 580)
