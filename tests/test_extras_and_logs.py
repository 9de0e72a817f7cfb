"""Results you can trust: an extra of the epoch's end (pictures, projector, TensorBoard, figures) never costs the
checkpoint or the metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import run_train

import rsnet.engine.epoch_end
from rsnet.viz.tensorboard import TensorBoardLogger

TINY = ["backbone=test_resnet", "dataset.image_size=32", "batch_size=32", "log.progress_bar=false", "model=baseline",
        "epochs=1", "log.attention_every=1"]

KEPT = "; the checkpoint and metrics are saved, the run goes on"

pytestmark = pytest.mark.slow


def _raises(error: BaseException) -> Callable[..., None]:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    return fail


def test_an_extra_that_fails_costs_no_checkpoint_and_no_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """Was: the attention pictures, the TensorBoard images and the figures ran before the checkpoint was saved, so
    an error in any of them (a bad class name, a full disk, matplotlib) stopped the run without its checkpoint."""
    monkeypatch.setattr(rsnet.engine.epoch_end, "log_what_the_model_sees", _raises(ValueError("bad class name 'a\tb'")))
    monkeypatch.setattr(rsnet.engine.epoch_end, "write_history", _raises(RuntimeError("matplotlib:\nno renderer")))
    monkeypatch.setattr(TensorBoardLogger, "confusion_matrix", _raises(OSError(28, "No space left on device")))
    run_dir = tmp_path / "run"
    caplog.set_level(logging.WARNING, logger="rsnet")
    status = run_train(run_dir, *TINY, "trainer.devices=[cpu]", "dataset.val_ratio=0.25")
    assert status == 0
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / "checkpoints" / "best.pt").is_file()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["selected_epoch"] == 1
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    for extra, error in (("attention maps and embedding projector", "ValueError: bad class name 'a\tb'"),
                         ("history.csv and figures", "RuntimeError: matplotlib: no renderer"),
                         ("TensorBoard scalars and confusion matrix", "OSError: [Errno 28] No space left on device")):
        line = next((message for message in warnings if extra in message), None)
        assert line is not None, (extra, warnings)
        assert error in line and "\n" not in line, line
        assert line.startswith(f"epoch 1: the {extra} failed (") and line.endswith(KEPT), line

