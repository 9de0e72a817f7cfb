"""The epoch's end off the training path (``log.background_writes``): the writer thread keeps order and its first
error, the snapshot is detached from the live tensors, and a run keeps every guarantee of a synchronous one — a
SIGKILL mid-write leaves the previous last.pt, which resumes; a full disk stops the run in one line no later than
the next epoch's end; the run's end waits for the writes; both settings write the same files."""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import HANG_S, REPO, run_train, training_config, wait_for, write_checkpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rsnet.checkpoint import DIGEST_KEY, FILE_DIGEST_KEY, load_checkpoint
from rsnet.engine.background_writer import BackgroundWriter
from rsnet.engine.snapshot import host_snapshot
from rsnet.integrity import content_digest

TINY = ["backbone=test_resnet", "dataset.image_size=32", "batch_size=32", "log.progress_bar=false",
        "trainer.devices=[cpu]", "model=baseline"]


# --------------------------------------------------------------------------------------------- the writer


class _LazyWriter(BackgroundWriter):
    """A background writer whose jobs start only once its caller waits for them (:meth:`wait`, or :meth:`close` at
    the end): as late as a writer may run them, so whatever the caller reads before it waits finds none of them done
    (a slow disk without a time in it: the order of events is fixed, however busy the machine). Its thread keeps the
    test's CPU priority (the production writer's lowest one would wait for every busy process of the machine)."""

    def __init__(self, background: bool = True) -> None:
        super().__init__(background, lowest_priority=False)
        self.waited = threading.Event()

    def submit(self, job: Any) -> None:
        if not self.background:
            super().submit(job)
            return
        super().submit(lambda: (self.waited.wait(), job()))

    def wait(self) -> None:
        self.waited.set()
        try:
            super().wait()
        finally:
            self.waited.clear()  # the jobs submitted from now on wait for the next wait


def test_jobs_run_in_order_off_the_callers_thread_and_wait_returns_when_all_ran() -> None:
    ran: list[tuple[int, str]] = []
    with _LazyWriter() as writer:
        for number in range(5):
            writer.submit(lambda number=number: ran.append((number, threading.current_thread().name)))
        assert ran == []  # submitted, not run on the caller's thread
        writer.wait()  # the jobs could start only now: all five ran before it returned
        assert [number for number, _ in ran] == list(range(5))
        assert {name for _, name in ran} == {"rsnet-writer"}


def test_the_first_error_is_kept_later_jobs_dropped_and_raised_by_wait_on_the_callers_thread() -> None:
    ran: list[int] = []
    writer = BackgroundWriter()
    writer.submit(lambda: ran.append(1))
    writer.submit(lambda: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    writer.submit(lambda: ran.append(3))
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    with pytest.raises(OSError, match="No space left"):  # kept: the run's end raises it too
        writer.close()
    assert ran == [1]


def test_leaving_on_an_error_waits_for_the_writes_and_the_error_in_flight_wins() -> None:
    ran: list[int] = []
    interrupt = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as caught:
        with _LazyWriter() as writer:
            writer.submit(lambda: ran.append(1))  # runs only once the way out waits for it
            raise interrupt
    assert caught.value is interrupt and ran == [1]


def test_without_background_a_job_runs_at_once_and_its_error_raises_there() -> None:
    writer = BackgroundWriter(background=False)
    ran: list[str] = []
    writer.submit(lambda: ran.append(threading.current_thread().name))
    assert ran == [threading.current_thread().name]
    with pytest.raises(ValueError, match="now"):
        writer.submit(lambda: (_ for _ in ()).throw(ValueError("now")))


def test_the_snapshot_is_a_detached_deep_copy_with_the_same_layout() -> None:
    weight = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    tree = {"model_state": {"w": weight}, "history": [{"epoch": 1}], "pair": (weight, 2.0)}
    kept = host_snapshot(tree)
    weight.add_(1.0)
    tree["history"].append({"epoch": 2})
    assert not torch.equal(kept["model_state"]["w"], weight) and torch.equal(kept["model_state"]["w"] + 1, weight)
    assert kept["model_state"]["w"].stride() == weight.stride()  # channels_last kept
    assert kept["pair"][0] is kept["model_state"]["w"]  # one tensor, one copy
    assert kept["history"] == [{"epoch": 1}]


def test_a_divergence_names_the_checkpoint_the_writer_was_still_writing(tmp_path: Path) -> None:
    """The loss may turn NaN while the previous epoch's last.pt is still being written: the message names the
    epoch that is on disk once the writes are done, not the one before it."""
    from rsnet.engine.epoch_loop import NonFiniteLossError, _last_good_checkpoint
    from rsnet.engine.trainer import _divergence_naming_the_written_checkpoint

    last = tmp_path / "checkpoints" / "last.pt"
    write_checkpoint(last, epoch=1)
    writer = _LazyWriter()
    writer.submit(lambda: write_checkpoint(last, epoch=2))  # written only once the writer is waited for
    with pytest.raises(NonFiniteLossError) as caught:
        with _divergence_naming_the_written_checkpoint(writer, tmp_path):
            raise NonFiniteLossError("the loss became NaN at epoch 3; the run stops. "
                                     f"{_last_good_checkpoint(tmp_path)} Try a lower optimizer.lr or max_grad_norm=5")
    assert str(caught.value) == (f"the loss became NaN at epoch 3; the run stops. Its last good checkpoint is {last} "
                                 "(after epoch 2). Try a lower optimizer.lr or max_grad_norm=5")


# --------------------------------------------------------------------------------------------- runs


_KILLED_CHILD = """
import io, sys, threading
sys.path.insert(0, {tests!r})
import torch
from helpers import run_train

real_save = torch.save


def slow_save(obj, handle, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("epoch") == 2:  # epoch 2's last.pt: half its bytes, then a stall to the kill
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        handle.flush()
        open({marker!r}, "w").close()
        threading.Event().wait()  # never set: the write never ends
    real_save(obj, handle, *args, **kwargs)


torch.save = slow_save
sys.exit(run_train({run_dir!r}, *{args!r}))
"""


@pytest.mark.slow
def test_a_kill_mid_write_leaves_the_previous_last_pt_which_resumes(tmp_path: Path) -> None:
    run_dir, marker = tmp_path / "run", tmp_path / "writing"
    child = _KILLED_CHILD.format(tests=str(REPO / "tests"), marker=str(marker), run_dir=str(run_dir),
                                 args=[*TINY, "epochs=3"])
    process = subprocess.Popen([sys.executable, "-c", child], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: marker.exists() or process.poll() is not None, "epoch 2's checkpoint write starting")
        assert marker.exists(), process.communicate()[0]  # else the child ended first: its output
        half_written = list((run_dir / "checkpoints").glob(".last.pt.*.tmp"))
        assert len(half_written) == 1 and half_written[0].stat().st_size > 0
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=HANG_S)
    last = run_dir / "checkpoints" / "last.pt"
    assert load_checkpoint(last)["epoch"] == 1  # verified (SHA-256): the previous epoch's, complete
    assert json.loads((run_dir / "metrics.json").read_text())["epochs"] == 1
    assert half_written[0].exists()  # what the kill left
    assert run_train(run_dir, *TINY, "epochs=2", "resume=true") == 0
    assert load_checkpoint(last)["epoch"] == 2
    assert [row["epoch"] for row in json.loads((run_dir / "metrics.json").read_text())["history"]] == [1, 2]
    assert not half_written[0].exists() and not list(run_dir.rglob(".*.tmp"))  # cleaned when the run dir was taken


@pytest.mark.slow
@pytest.mark.parametrize("background, stopped_after", [("true", 3), ("false", 2)])
def test_a_full_disk_in_a_write_stops_the_run_in_one_line_by_the_next_epochs_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture, background: str,
        stopped_after: int) -> None:
    """Epoch 2's last.pt meets a full disk: written in the background during epoch 3, the run stops at epoch 3's end
    (at epoch 2's when written on the training path), with the one line of a full disk; epoch 1's files stay."""
    import rsnet.engine.trainer as trainer

    real_save, real_epoch = torch.save, trainer.train_one_epoch
    trained: list[int] = []

    def full_disk_at_epoch_2(obj: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(obj, dict) and obj.get("epoch") == 2:
            raise OSError(28, "No space left on device")
        real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk_at_epoch_2)
    monkeypatch.setattr(trainer, "BackgroundWriter", functools.partial(BackgroundWriter, lowest_priority=False))
    monkeypatch.setattr(trainer, "train_one_epoch", lambda ctx, config, epoch, *rest, **options: (
        trained.append(epoch + 1), real_epoch(ctx, config, epoch, *rest, **options))[1])
    run_dir = tmp_path / "run"
    capfd.readouterr()
    assert run_train(run_dir, *TINY, "epochs=5", f"log.background_writes={background}") == 1
    err = capfd.readouterr().err
    last = run_dir / "checkpoints" / "last.pt"
    assert err.strip().splitlines()[-1] == (f"error: no space left on device while writing {last}; free space on that "
                                            "file system or write elsewhere (its previous version, if any, is intact)")
    assert "Traceback" not in err, err
    assert trained == list(range(1, stopped_after + 1))
    assert load_checkpoint(last)["epoch"] == 1
    assert json.loads((run_dir / "metrics.json").read_text())["epochs"] == 1
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


@pytest.fixture(scope="module")
def two_epoch_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[Path, dict[str, Any]]]:
    """A 2-epoch run (``TINY``) of each setting of log.background_writes (True, False): its run dir and what train()
    returned. The background run's writer is a :class:`_LazyWriter`: each epoch's writes run only when the training
    thread waits for them (the next epoch's end, or the run's end), after the next epoch has changed the live model."""
    from rsnet.engine import trainer

    runs = {}
    for background in (True, False):
        run_dir = tmp_path_factory.mktemp("runs") / f"background_{background}"
        config = {**training_config(*TINY, "epochs=2", f"log.background_writes={str(background).lower()}"),
                  "run_dir": str(run_dir)}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(trainer, "BackgroundWriter", _LazyWriter)
            runs[background] = (run_dir, trainer.train(config))
    return runs


@pytest.mark.slow
def test_the_runs_end_waits_for_the_last_epochs_writes(two_epoch_runs: dict[bool, tuple[Path, dict[str, Any]]]
                                                       ) -> None:
    """The last epoch's writes start only when the run's end waits for them (:class:`_LazyWriter`): when train()
    returns, last.pt, metrics.json and history.csv hold that epoch all the same, and train() returns metrics.json's
    document."""
    run_dir, summary = two_epoch_runs[True]
    assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["epoch"] == 2
    assert json.loads((run_dir / "metrics.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["epochs"] == 2 and [row["epoch"] for row in summary["history"]] == [1, 2]
    assert (run_dir / "history.csv").read_text().splitlines()[-1].startswith("2,")


@pytest.mark.slow
def test_resume_from_a_background_written_run_trains_as_from_a_synchronous_one(
        two_epoch_runs: dict[bool, tuple[Path, dict[str, Any]]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rsnet.engine import trainer

    monkeypatch.setattr(trainer, "BackgroundWriter", _LazyWriter)
    results = {}
    for background in ("true", "false"):
        run_dir = tmp_path / background  # a copy: the module's runs stay as they ended
        shutil.copytree(two_epoch_runs[background == "true"][0], run_dir)
        assert run_train(run_dir, *TINY, "epochs=3", "resume=true", f"log.background_writes={background}") == 0
        results[background] = (load_checkpoint(run_dir / "checkpoints" / "last.pt"),
                               json.loads((run_dir / "metrics.json").read_text()))
    (background_last, background_metrics), (sync_last, sync_metrics) = results["true"], results["false"]
    assert background_last["epoch"] == sync_last["epoch"] == 3
    assert background_last["model_state"].keys() == sync_last["model_state"].keys()
    assert all(torch.equal(background_last["model_state"][key], sync_last["model_state"][key])
               for key in sync_last["model_state"])
    assert [(row["epoch"], row["test_accuracy"]) for row in background_metrics["history"]] == \
        [(row["epoch"], row["test_accuracy"]) for row in sync_metrics["history"]]


class _HeldWriter(BackgroundWriter):
    """A background writer whose jobs start once ``go`` is set (by the test, once it has changed the live state)."""

    def __init__(self, go: threading.Event) -> None:
        super().__init__(background=True, lowest_priority=False)  # the test's priority, as _LazyWriter's
        self.go = go

    def submit(self, job: Any) -> None:
        super().submit(lambda: (self.go.wait(), job()))


def _both_settings_epoch_end(ctx: Any, config: dict[str, Any], folder: Path) -> dict[str, Path]:
    """One worker: the same epoch's end (same model, optimizer, strategy, state, evaluation) written by each setting
    into a folder of its own; the background writer starts only once the live model, optimizer state, run state and
    metrics have changed after ``finish_epoch`` returned (as the next epoch changes them)."""
    from rsnet.engine.epoch_end import RunState, evaluate_epoch, finish_epoch
    from rsnet.engine.trainer import load_data
    from rsnet.models import build_model
    from rsnet.parallel import build_strategy
    from rsnet.viz.tensorboard import TensorBoardLogger, pick_attention_images

    data = load_data(ctx, {**config, "run_dir": str(folder)}, folder)
    torch.manual_seed(0)
    model = build_model("esd_mbenet", "test_resnet", len(data.class_names))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(data.train.get_batch([0, 1, 2, 3])[0]).prediction_logits.sum().backward()
    optimizer.step()  # momentum buffers in the payload
    strategy = build_strategy(config["trainer"], ctx, model, len(data.train), config["batch_size"], 0)
    evaluation = evaluate_epoch(ctx, config, data, model, 1)
    attention_ids = pick_attention_images(data.test.labels, 2)  # one page of overlays per head (each page costs)
    run_dirs = {}
    for background in (False, True):
        run_dir = run_dirs[background] = folder / f"background_{background}"
        run_config = {**copy.deepcopy(config), "run_dir": str(run_dir)}
        state, scalars = RunState(epoch=1, wall_time_s=1.5), {"train/loss/total": 0.5}
        go = threading.Event()
        with TensorBoardLogger(run_dir / "tensorboard") as tb, \
                (_HeldWriter(go) if background else BackgroundWriter(background=False)) as writer:
            finish_epoch(run_config, data, model, optimizer, strategy, scalars, state, tb,
                         attention_ids, evaluation, writer)
            if background:  # what the next epoch changes while the writer works
                with torch.no_grad():
                    for parameter in model.parameters():
                        parameter.add_(1.0)
                        optimizer.state[parameter]["momentum_buffer"].add_(1.0)
                state.history.append({"epoch": 2})
                evaluation.test["accuracy"] = -1.0
                scalars["train/loss/total"] = 9.0
                go.set()
    return run_dirs


def _without_digests(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's contents: every tensor and value, without the digests of them and of the file."""
    return {key: value for key, value in checkpoint.items() if key not in (DIGEST_KEY, FILE_DIGEST_KEY)}


def _tensorboard(run_dir: Path) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for events in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0})
        accumulator.Reload()
        found.update({tag: [event.value for event in accumulator.Scalars(tag)]
                      for tag in accumulator.Tags()["scalars"]})
        found.update({tag: len(accumulator.Images(tag)) for tag in accumulator.Tags()["images"]})
    return found


@pytest.mark.slow
def test_both_settings_write_the_same_files(tmp_path: Path) -> None:
    from rsnet.parallel import launch

    config = training_config(*TINY, "model=esd_mbenet", "epochs=1", "dataset.val_ratio=0.25")
    run_dirs = launch(_both_settings_epoch_end, ["cpu"], config, tmp_path)
    sync, background = run_dirs[False], run_dirs[True]
    for name in ("last.pt", "best.pt"):
        sync_checkpoint = load_checkpoint(sync / "checkpoints" / name)
        background_checkpoint = load_checkpoint(background / "checkpoints" / name)
        assert background_checkpoint["config"].pop("run_dir") == str(background)
        assert sync_checkpoint["config"].pop("run_dir") == str(sync)  # the one difference: where each was written
        assert content_digest(_without_digests(background_checkpoint)) == \
            content_digest(_without_digests(sync_checkpoint))
    for name in ("metrics.json", "history.csv"):
        assert (background / name).read_bytes() == (sync / name).read_bytes(), name
    tags = _tensorboard(sync)
    assert "attention/cam_main" in tags and "test/kappa" in tags and "hparam/accuracy" in tags, sorted(tags)
    assert _tensorboard(background) == tags
    assert sorted(path.name for path in (background / "tensorboard").iterdir() if path.is_dir()) == \
        sorted(path.name for path in (sync / "tensorboard").iterdir() if path.is_dir())  # the projector's


def test_auto_writes_in_the_background_where_the_primary_trains_on_a_gpu() -> None:
    """log.background_writes=auto: on a GPU (idle host cores), not on a CPU (the writes would take the training's
    cores); true and false as they say; anything else is refused naming the setting."""
    from rsnet.engine.background_writer import writes_in_background

    assert (writes_in_background("auto", torch.device("cuda:0"))
            and not writes_in_background("auto", torch.device("cpu")))
    assert writes_in_background(True, torch.device("cpu")) and not writes_in_background(False, torch.device("cuda:0"))
    with pytest.raises(ValueError, match=r"log.background_writes='yes': use auto \(in the background"):
        writes_in_background("yes", torch.device("cpu"))
