"""A run's per-epoch history outside TensorBoard, rewritten beside metrics.json after every evaluation:
``history.csv`` (one row per evaluated epoch, nested figures as ``oa/main``-style columns) and ``curves.png``
(accuracy, then the training loss, against the epoch)."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from rsnet.files import atomic_write
from rsnet.viz.line_plot import draw_line_plot

ACCURACY_CURVES = {"test_accuracy": "test (reported head)", "val_accuracy": "validation",
                   "train/oa_main": "training (main branch)"}
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


def write_history(run_dir: Path, history: Sequence[Mapping[str, Any]]) -> None:
    """``history.csv`` and ``curves.png`` in ``run_dir`` from the run's history (metrics.json's ``history``)."""
    rows = [flat_record(record) for record in history]
    if not rows:
        return
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with atomic_write(run_dir / "history.csv", "w") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with atomic_write(run_dir / "curves.png") as handle:
        curves_image(rows).save(handle, format="PNG")


def curves_image(rows: Sequence[Mapping[str, Any]]) -> Image.Image:
    """Accuracy (test, validation, training) against the epoch, with the training loss below where recorded."""
    def curve(key: str) -> list[tuple[float, float]]:
        return [(float(row["epoch"]), float(row[key])) for row in rows if row.get(key) is not None]

    curves = {name: curve(key) for key, name in ACCURACY_CURVES.items()}
    accuracy = {name: [points] for name, points in curves.items() if points}
    panels = [draw_line_plot(accuracy, "accuracy per epoch", "epoch", "accuracy (%)")]
    loss = curve(LOSS_CURVE)
    if loss:
        panels.append(draw_line_plot({"training loss (all terms)": [loss]}, "training loss per epoch", "epoch",
                                     "loss"))
    image = Image.new("RGB", (panels[0].width, sum(panel.height for panel in panels)), "white")
    for index, panel in enumerate(panels):
        image.paste(panel, (0, index * panels[0].height))
    return image
