"""A run's history and figures outside TensorBoard, rewritten beside metrics.json after every evaluation:
``history.csv``, ``curves.<png|pdf>`` and ``confusion.<png|pdf>`` (docs/usage.md, docs/tensorboard.md)."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsnet.files import atomic_write
from rsnet.viz.figures import confusion_figure, line_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LOSS_CURVE = "train/loss/total"


def flat_record(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """One history record with nested figures as ``parent/child`` keys, in their order."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, Mapping):
            flat.update(flat_record(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def head_name(head: str) -> str:
    """A head as the figures name it: ``main branch``, ``ensemble``, ``aux1`` ..."""
    return "main branch" if head == "main" else head


def write_history(run_dir: Path, summary: Mapping[str, Any], class_names: Sequence[str],
                  figure_format: str = "png") -> None:
    """``history.csv``, the curves and the confusion matrix in ``run_dir`` from the run summary (metrics.json)."""
    rows = [flat_record(record) for record in summary["history"]]
    if not rows:
        return
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with atomic_write(run_dir / "history.csv", "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    run = f"{summary['dataset']}: {summary['model']} on {summary['backbone']}"
    save_figure(curves_figure(rows, run, summary["reported_head"]), run_dir / "curves", figure_format)
    epoch = summary.get("selected_epoch", summary["history"][-1]["epoch"])
    save_figure(confusion_figure(summary["confusion_matrix"], class_names,
                                 f"{run}\ntest split, {head_name(summary['reported_head'])}, epoch {epoch}"),
                run_dir / "confusion", figure_format)


def curves_figure(rows: Sequence[Mapping[str, Any]], run: str, reported_head: str) -> Figure:
    """Test accuracy of the reported head (and of the main branch when another head is reported), validation and
    training accuracy against the epoch, with the training loss beside them where recorded."""
    def curve(key: str) -> list[tuple[float, float]]:
        return [(float(row["epoch"]), float(row[key])) for row in rows if row.get(key) is not None]

    reported = head_name(reported_head)
    names = {"test_accuracy": f"test, {reported} (reported)", "oa/main": "test, main branch",
             "val_accuracy": f"validation, {reported}", "train/oa_main": "training, main branch"}
    if reported_head == "main":
        del names["oa/main"]
    accuracy = {name: [points] for name, points in ((name, curve(key)) for key, name in names.items()) if points}
    panels = [("accuracy (%)", accuracy)]
    loss = curve(LOSS_CURVE)
    if loss:
        panels.append(("training loss (all terms)", {"training loss": [loss]}))
    return line_figure(panels, run, "epoch")
