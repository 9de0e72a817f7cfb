"""history.csv, the curves and the confusion matrix: a run's per-epoch figures for readers without TensorBoard."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rsnet.engine.run_history import curves_figure, flat_record, write_history

HISTORY = [
    {"epoch": 1, "wall_time_s": 3.5, "test_accuracy": 40.0, "oa": {"main": 38.0, "ensemble": 40.0},
     "train/loss/total": 2.5, "train/oa_main": 30.0, "val_accuracy": 41.0},
    {"epoch": 2, "wall_time_s": 7.0, "test_accuracy": 55.0, "oa": {"main": 52.0, "ensemble": 55.0},
     "train/loss/total": 1.5, "train/oa_main": 50.0, "val_accuracy": 56.0},
]


def summary(history: list[dict], reported_head: str = "ensemble") -> dict:
    """A run summary (metrics.json) with ``history``, three classes."""
    return {"dataset": "aid", "model": "esd_mbenet", "backbone": "resnet18", "reported_head": reported_head,
            "confusion_matrix": [[4, 1, 0], [0, 5, 0], [2, 0, 3]], "history": history}


def test_nested_figures_become_slash_columns() -> None:
    assert flat_record({"epoch": 1, "oa": {"main": 2.0, "aux": {"a": 3}}}) == {"epoch": 1, "oa/main": 2.0,
                                                                                "oa/aux/a": 3}


def test_history_csv_has_a_row_per_epoch_and_curves_show_accuracy_and_loss(tmp_path: Path) -> None:
    write_history(tmp_path, summary(HISTORY), ["forest", "river", "beach"])
    with (tmp_path / "history.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["epoch", "wall_time_s", "test_accuracy", "oa/main", "oa/ensemble", "train/loss/total",
                             "train/oa_main", "val_accuracy"]
    assert [row["val_accuracy"] for row in rows] == ["41.0", "56.0"] and rows[1]["oa/main"] == "52.0"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["confusion.png", "curves.png", "history.csv"]
    curves = Image.open(tmp_path / "curves.png")
    assert curves.mode == "RGB" and curves.size == (1160, 460)  # two panels: accuracy, then the loss
    colours = {tuple(pixel) for pixel in np.asarray(curves).reshape(-1, 3)}
    assert {(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)} <= colours  # four accuracy curves
    assert Image.open(tmp_path / "confusion.png").size[0] > 300


def test_the_curves_name_the_run_and_the_reported_head() -> None:
    figure = curves_figure([flat_record(record) for record in HISTORY], "aid: esd_mbenet on resnet18", "ensemble")
    accuracy, loss = figure.axes
    assert figure.get_suptitle() == "aid: esd_mbenet on resnet18"
    assert [text.get_text() for text in accuracy.get_legend().get_texts()] == [
        "test, ensemble (reported)", "test, main branch", "validation, ensemble", "training, main branch"]
    assert [text.get_text() for text in loss.get_legend().get_texts()] == ["training loss"]
    main = curves_figure([flat_record(record) for record in HISTORY], "aid: baseline on resnet18", "main")
    assert [text.get_text() for text in main.axes[0].get_legend().get_texts()][:2] == [
        "test, main branch (reported)", "validation, main branch"]


@pytest.mark.parametrize("figure_format, written", [("pdf", {"curves.pdf", "confusion.pdf"}),
                                                    ("both", {"curves.png", "curves.pdf", "confusion.png",
                                                              "confusion.pdf"})])
def test_log_figure_format_writes_pdf_for_a_paper(tmp_path: Path, figure_format: str, written: set[str]) -> None:
    write_history(tmp_path, summary(HISTORY), ["forest", "river", "beach"], figure_format)
    assert {path.name for path in tmp_path.iterdir()} == written | {"history.csv"}  # no temporary file left
    for name in written:
        head = (tmp_path / name).read_bytes()[:8]
        assert head.startswith(b"%PDF-") if name.endswith(".pdf") else head == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match=r"^log.figure_format='svg': use png \(the default\), pdf"):
        write_history(tmp_path, summary(HISTORY), ["forest", "river", "beach"], "svg")


def test_without_loss_or_validation_one_panel_and_no_empty_column(tmp_path: Path) -> None:
    write_history(tmp_path, summary([{"epoch": 1, "test_accuracy": 40.0}, {"epoch": 2, "test_accuracy": 50.0}],
                                    "main"), ["forest", "river", "beach"])
    assert (tmp_path / "history.csv").read_text() == "epoch,test_accuracy\n1,40.0\n2,50.0\n"
    assert Image.open(tmp_path / "curves.png").size == (600, 460)
