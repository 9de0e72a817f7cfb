"""Results you can trust: an extra of the epoch's end (pictures, projector, TensorBoard, figures) never costs the
checkpoint or the metrics; a run with several workers logs to its train.log as a run with one does; Ctrl-C in
export, evaluate and predict is one line and exit status 130, as in training."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import compose_command, run_train, write_checkpoint
from omegaconf import DictConfig
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import rsnet.engine.epoch_end
import rsnet.export
import rsnet.inference
import rsnet.model_loading
from rsnet.commands import evaluate, export, predict, train
from rsnet.parallel.launcher import WorkerError
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
    """An error in the attention pictures, the TensorBoard images or the figures (a bad class name, a full disk,
    matplotlib) is one warning each: the checkpoint and metrics are saved and the run goes on."""
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


def test_two_workers_log_the_primarys_lines_to_train_log(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """With two workers train.log holds the primary's epoch lines beside the launcher's. The run goes through the
    adaptive scheduler, the simulated slowdown said as such, its decisions in TensorBoard. (In this process, with
    train.log opened as Hydra opens it for the command line: the workers append to the launcher's log files.)"""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log_file = logging.FileHandler(run_dir / "train.log")
    root = logging.getLogger()
    level = root.level
    root.addHandler(log_file)
    root.setLevel(logging.INFO)  # Hydra's job logging
    try:
        status = run_train(run_dir, *TINY, "trainer=adaptive", "trainer.devices=[cpu,cpu]", "trainer.cpu_threads=1",
                           "trainer.slowdown=[1.0,1.5]", "trainer.merge_rounds=2")
    finally:
        root.removeHandler(log_file)
        root.setLevel(level)
        log_file.close()
    stderr = capfd.readouterr().err
    assert status == 0, stderr
    logged = (run_dir / "train.log").read_text()
    assert "launched 2 workers" in logged
    assert "[worker 0] - epoch 1/1: test accuracy" in logged, logged
    assert "[worker 1]" not in logged, logged  # the primary's lines only (worker 1 warns of its slowdown)
    assert "SIMULATED" in stderr
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["trainer"] == "adaptive" and len(metrics["scheduler"]["workers"]) == 2
    tags = set()
    for events in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert {"scheduler/b/0", "scheduler/b/1", "scheduler/p/0", "scheduler/idle/1"} <= tags, tags


def test_a_failed_worker_is_named_in_train_log(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The launcher's line naming the failed worker goes to train.log as well as to the console."""
    log_file = logging.FileHandler(tmp_path / "train.log")  # as Hydra sets up the launching process's log file
    logging.getLogger().addHandler(log_file)
    error = WorkerError(1, "cpu", "killed by signal SIGKILL", others="worker rank 0 (cpu): DistBackendError: peer")
    try:
        with pytest.raises(SystemExit) as stop:
            train.report_worker_error(error)
    finally:
        logging.getLogger().removeHandler(log_file)
        log_file.close()
    assert stop.value.code == 1
    assert capsys.readouterr().err.startswith("error: the run stopped: worker rank 1 (cpu) failed: killed by signal")
    logged = (tmp_path / "train.log").read_text()
    assert "the run stopped: worker rank 1 (cpu) failed: killed by signal SIGKILL" in logged, logged
    assert "worker rank 0 (cpu): DistBackendError: peer" in logged, logged


@pytest.mark.parametrize("saved", [True, False])
def test_a_killed_worker_says_how_to_resume(tmp_path: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch, saved: bool) -> None:
    """After the line naming the killed worker: what the run dir keeps and the command that continues the run (or
    that nothing can be resumed)."""
    if saved:
        write_checkpoint(tmp_path / "checkpoints" / "last.pt", epoch=2)
    monkeypatch.setattr("sys.argv", ["scripts/train.py", "model=baseline", "epochs=5"])
    error = WorkerError(1, "cpu", "killed by signal SIGKILL", others="worker rank 0 (cpu): DistBackendError: peer")
    with pytest.raises(SystemExit) as stop:
        train.report_worker_error(error, {"run_dir": str(tmp_path), "epochs": 5})
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the run stopped: worker rank 1 (cpu) failed: killed by signal SIGKILL")
    if saved:
        assert err.rstrip().endswith(f"{tmp_path / 'checkpoints' / 'last.pt'} holds epoch 2 of 5; continue with\n"
                                     f"  {train.interpreter()} scripts/train.py model=baseline epochs=5 "
                                     f"hydra.run.dir={tmp_path} resume=true"), err
    else:
        assert err.rstrip().endswith("no checkpoint was written before it stopped: nothing to resume"), err


def test_an_extra_lets_a_stopping_worker_stop(caplog: pytest.LogCaptureFixture) -> None:
    """The agent's SIGTERM to the workers of a run whose peer died arrives as a SignalException: it ends the worker,
    it is not the extra's failure (the run used to log "the history.csv and figures failed (SignalException)")."""
    from torch.distributed.elastic.multiprocessing import SignalException

    def stopped() -> None:
        raise SignalException("Process 7 got signal: 15", sigval=15)

    with caplog.at_level(logging.WARNING), pytest.raises(SignalException):
        rsnet.engine.epoch_end.run_extra("history.csv and figures", 3, stopped)
    assert caplog.messages == []


def _exit_status(main: Callable[[DictConfig], None], cfg: DictConfig) -> int | str | None:
    """The exit status of the command ``main`` run on ``cfg`` (0 when it returns); a KeyboardInterrupt that escapes
    it (a traceback for the user) fails the test instead of ending the test session."""
    try:
        main(cfg)
    except SystemExit as stop:
        return stop.code
    except KeyboardInterrupt:
        pytest.fail(f"{main.__module__}: KeyboardInterrupt escaped (the user sees its traceback)")
    return 0


def test_ctrl_c_in_export_evaluate_and_predict_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """Ctrl-C in export, evaluate or predict is one line and exit 130, as in training: no traceback."""
    ctrl_c = _raises(KeyboardInterrupt())
    monkeypatch.setattr(rsnet.export, "export_checkpoint", ctrl_c)
    monkeypatch.setattr(rsnet.model_loading, "load_model", ctrl_c)
    monkeypatch.setattr(rsnet.inference, "list_images", ctrl_c)
    commands = [(export.main, compose_command("export", "checkpoint=run", "progress_bar=false")),
                (evaluate.main, compose_command("evaluate", "checkpoint=run", "device=cpu")),
                (predict.main, compose_command("predict", "checkpoint=run", "images=scenes"))]
    for main, cfg in commands:
        assert _exit_status(main, cfg) == 130
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("interrupted: "), err
        assert lines[0].endswith(" stopped before it finished; no file it writes is left half-written"), err

