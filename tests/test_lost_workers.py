"""Devices that come and go: a run goes on without a lost worker from its last merge's commit (commit.pt), at most
``trainer.max_restarts`` times; a worker's own error still stops it; ``resume=true`` takes the newest commit point.
The losses are real: a worker kills itself with SIGKILL at a set point (``trainer.lose_worker``)."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import run_train

import rsnet.engine.membership as membership
from rsnet.engine import trainer
from rsnet.engine.epoch_end import TORCHRUN_JOB_KEY
from rsnet.checkpoint import load_checkpoint, save_checkpoint
from rsnet.engine.config_checks import check_run_dir
from rsnet.engine.merge_commit import POSITION_KEY, resume_point
from rsnet.parallel.launcher import WorkerError
from rsnet.parallel.strategies import simulated_loss

SMALL = ["backbone=test_resnet", "model=baseline", "dataset.image_size=32", "batch_size=32", "log.progress_bar=false",
         "log.attention_every=100", "trainer.cpu_threads=1", "trainer.merge_rounds=1", "trainer.merge_rounds_max=null",
         "trainer.merge_cost_max=0", "trainer.leave_out=false", "epochs=3"]
TRAIN_SAMPLES = 210  # ucmerced-mini's training split


def _config(tmp_path: Path, max_restarts: int = 3) -> dict[str, Any]:
    return {"run_dir": str(tmp_path), "trainer": {"max_restarts": max_restarts, "lose_worker": [1, 2, 2]}}


def _lost(rank: int, device: str = "cpu") -> WorkerError:
    return WorkerError(rank, device, "killed by signal SIGKILL", lost=True)


class _Launches:
    """A stand-in for ``launch``: raises the given errors in turn, then returns; records each launch's arguments."""

    def __init__(self, *errors: WorkerError) -> None:
        self.errors, self.calls = list(errors), []

    def __call__(self, worker_fn: Any, devices: list[str], config: dict, resume_from: str | None,
                 change: dict | None, **options: Any) -> str:
        self.calls.append({"devices": devices, "config": config, "resume_from": resume_from, "change": change,
                           **options})
        if self.errors:
            raise self.errors.pop(0)
        return "done"


_PAYLOAD = {"model_config": {}, "model_state": {}, "class_names": [], "image_size": 32, "mean": [0.0], "std": [1.0]}


def _commit(path: Path, epoch: int, position: int = 0) -> None:
    payload = {**_PAYLOAD, "epoch": epoch}
    save_checkpoint(path, {**payload, POSITION_KEY: position} if position else payload)


def test_a_lost_worker_is_left_out_and_the_run_launched_again_from_the_commit(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _commit(tmp_path / "checkpoints" / "last.pt", epoch=1)
    _commit(tmp_path / "checkpoints" / "commit.pt", epoch=1, position=96)
    launches = _Launches(_lost(1, "cuda:0"), _lost(0))
    monkeypatch.setattr(membership, "launch", launches)
    result = membership.launch_through_losses(print, ["cpu", "cuda:0", "cpu"], _config(tmp_path), None,
                                              {"slowdown": [1.0, 2.0, 3.0], "timeout_s": 60.0})
    assert result == "done"
    assert [call["devices"] for call in launches.calls] == [["cpu", "cuda:0", "cpu"], ["cpu", "cpu"], ["cpu"]]
    assert [call["slowdown"] for call in launches.calls] == [[1.0, 2.0, 3.0], [1.0, 3.0], [3.0]]  # it goes with it
    assert launches.calls[1]["resume_from"] == str(tmp_path / "checkpoints" / "commit.pt")
    assert launches.calls[0]["config"]["trainer"]["lose_worker"] == [1, 2, 2]
    assert launches.calls[1]["config"]["trainer"]["lose_worker"] is None  # the simulated loss happened once
    change = launches.calls[1]["change"]
    assert change["lost"] == "worker rank 1 (cuda:0)" and change["cause"] == "killed by signal SIGKILL"
    assert (change["epoch"], change["position"], change["devices"]) == (1, 96, ["cpu", "cpu"])
    assert change["resumed_from"] == "commit.pt (epoch 2, 96 samples merged)"


def test_beyond_max_restarts_or_an_error_of_its_own_the_run_stops(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(membership, "launch", _Launches(_lost(2), _lost(1)))
    with pytest.raises(WorkerError) as caught:
        membership.launch_through_losses(print, ["cpu"] * 3, _config(tmp_path, max_restarts=1), None, {})
    assert str(caught.value) == ("worker rank 1 (cpu) failed: killed by signal SIGKILL (trainer.max_restarts=1: the "
                                 "run had gone on without 1 lost worker(s) already)")
    own_error = WorkerError(1, "cpu", "ValueError: bad band", "Traceback ...", cause=ValueError("bad band"))
    launches = _Launches(own_error)
    monkeypatch.setattr(membership, "launch", launches)
    with pytest.raises(WorkerError) as caught:
        membership.launch_through_losses(print, ["cpu"] * 3, _config(tmp_path), None, {})
    assert caught.value is own_error and len(launches.calls) == 1  # it would fail again: no second launch
    launches = _Launches(_lost(0))
    monkeypatch.setattr(membership, "launch", launches)
    with pytest.raises(WorkerError):
        membership.launch_through_losses(print, ["cpu"], _config(tmp_path), None, {})  # the last worker
    assert len(launches.calls) == 1


def test_resume_goes_on_from_the_newest_commit_point(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    assert resume_point(tmp_path) is None
    _commit(checkpoints / "commit.pt", epoch=0, position=48)  # killed within the first epoch
    assert check_run_dir(tmp_path, resume=True, overwrite=False) == checkpoints / "commit.pt"
    _commit(checkpoints / "last.pt", epoch=1)  # the first epoch ended after it
    assert resume_point(tmp_path) == checkpoints / "last.pt"
    _commit(checkpoints / "commit.pt", epoch=1, position=48)  # a merge of the second epoch
    assert check_run_dir(tmp_path, resume=True, overwrite=False) == checkpoints / "commit.pt"


@pytest.mark.slow
@pytest.mark.parametrize("devices, lost", [("[cpu,cpu,cpu]", 1), ("[cpu,cpu]", 0)])
def test_a_run_goes_on_without_a_worker_killed_mid_epoch(tmp_path: Path, capfd: pytest.CaptureFixture,
                                                         caplog: pytest.LogCaptureFixture, devices: str,
                                                         lost: int) -> None:
    """A worker SIGKILLs itself in epoch 2 with a batch of the third interval claimed: the run finishes its epochs
    with no action, from the newest commit (the primary writes it on its way out); every epoch trains its 210 samples
    once (the resumed one: the commit's and the survivors'). Losing rank 0 of two (the primary: its newest commit is
    lost with it) leaves one worker, which goes on alone."""
    status = run_train(tmp_path / "run", *SMALL, f"trainer.devices={devices}", f"trainer.lose_worker=[{lost},2,3]")
    out, err = capfd.readouterr()
    assert status == 0, err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["epochs"] == 3
    [change] = metrics["membership_changes"]
    workers = devices.count("cpu")
    assert change["lost"] == f"worker rank {lost} (cpu)" and change["cause"] == "killed by signal SIGKILL"
    batch = max(32, 16 * workers)  # B: an interval's samples (merge_rounds=1)
    # a survivor primary writes its newest commit on its way out: the second interval's; a lost primary's newest
    # written one may be older than last.pt (written every 30 s), and the run goes on from last.pt then
    assert change["epoch"] == 1 and change["position"] in ((batch, 2 * batch) if lost else (0, batch, 2 * batch))
    assert change["devices"] == ["cpu"] * (workers - 1) and change["restart_s"] >= 0
    assert [row["train/samples"] for row in metrics["history"]] == [TRAIN_SAMPLES] * 3
    assert len(metrics["scheduler"]["workers"]) == workers - 1
    assert (f"worker rank {lost} (cpu) is lost (killed by signal SIGKILL); the run goes on with {workers - 1} "
            f"worker(s) on {['cpu'] * (workers - 1)} from {change['resumed_from']} (lost worker 1 of "
            "trainer.max_restarts=3)") in caplog.text  # the launcher's line
    assert not (tmp_path / "run" / "checkpoints" / "commit.pt").exists()  # a finished run keeps its last.pt only


@pytest.mark.slow
def test_with_max_restarts_0_a_lost_worker_stops_the_run_saying_how_to_go_on(tmp_path: Path,
                                                                             capfd: pytest.CaptureFixture,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # the workers log at the launcher's level: "resumed from ..." is an INFO line
    status = run_train(tmp_path / "run", *SMALL, "trainer.devices=[cpu,cpu]", "trainer.lose_worker=[1,2,2]",
                       "trainer.max_restarts=0")
    _, err = capfd.readouterr()
    assert status == 1
    assert ("error: the run stopped: worker rank 1 (cpu) failed: killed by signal SIGKILL (trainer.max_restarts=0: "
            "a lost worker stops the run)") in err
    commit = tmp_path / "run" / "checkpoints" / "commit.pt"
    assert f"{commit} holds epoch 2 of 3 up to its last merge (32 samples); continue with" in err
    status = run_train(tmp_path / "run", *SMALL, "trainer.devices=[cpu,cpu]", "resume=true")
    _, err = capfd.readouterr()
    assert status == 0, err
    assert f"resumed from {commit}: epoch 2, 32 of its 210 samples merged" in err
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["history"]
    assert [row["train/samples"] for row in history] == [TRAIN_SAMPLES] * 3


def test_a_commit_is_kept_after_every_merge_and_written_every_so_often_and_on_the_way_out(tmp_path: Path) -> None:
    """Commits at t = 0, 10 and 40 s with a write every 30 s: the first and the third are written as they come, the
    second only kept; one more at t = 50 is written by flush(), as on the way out of a launch."""
    from rsnet.checkpoint import load_checkpoint
    from rsnet.engine.merge_commit import MergeCommits

    now = [0.0]
    commits = MergeCommits(tmp_path, write_every_s=30.0, clock=lambda: now[0])
    on_disk = []
    for at, position in ((0.0, 48), (10.0, 96), (40.0, 144), (50.0, 192)):
        now[0] = at
        commits.offer(lambda: {**_PAYLOAD, "epoch": 1, POSITION_KEY: position})
        commits.writer.wait()  # the write of this offer, if any, is done
        on_disk.append(load_checkpoint(commits.path, mmap=True)[POSITION_KEY])
    assert on_disk == [48, 48, 144, 144] and (commits.kept, commits.written) == (4, 3)
    commits.flush()
    assert load_checkpoint(commits.path, mmap=True)[POSITION_KEY] == 192 and commits.written == 4
    commits.close()


class _Shares:
    """A strategy's claims with each (epoch, interval)'s share of batches given: none where faster workers took all."""

    def __init__(self, rank: int, shares: dict[tuple[int, int], int]) -> None:
        self.cfg, self.rank, self.epoch = {"lose_worker": [1, 2, 2]}, rank, 0
        self.ctx = type("Ctx", (), {"device": "cpu"})
        self.shares = shares

    def claims(self, interval: int):
        yield from range(self.shares.get((self.epoch, interval), 1))


class _Losing(simulated_loss.SimulatedLoss, _Shares):
    pass


class _Killed(Exception):
    pass


@pytest.mark.parametrize("rank", [0, 1])
def test_a_simulated_loss_comes_in_its_interval_even_with_no_batch_claimed(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture,
                                                                          rank: int) -> None:
    """lose_worker=[1, 2, 2]: worker 1 is left no batch in epoch 2's interval 2 (the others were faster), so it dies
    at that interval's end, not never nor later; worker 0 is never killed."""
    def kill(pid: int, sig: int) -> None:
        raise _Killed(sig)

    monkeypatch.setattr(simulated_loss.os, "kill", kill)
    monkeypatch.setattr(simulated_loss.logging, "shutdown", lambda: None)
    strategy = _Losing(rank, {(1, 1): 0})
    claimed = []
    with pytest.raises(_Killed) if rank == 1 else contextlib.nullcontext():
        for epoch in range(3):
            strategy.epoch = epoch
            for interval in range(3):
                claimed.extend((epoch, interval) for _ in strategy.claims(interval))
    dying = [record.getMessage() for record in caplog.records if "SIMULATED loss" in record.getMessage()]
    assert dying == (["worker 1 (cpu): SIMULATED loss (trainer.lose_worker): it kills itself (SIGKILL) in epoch 2, "
                      "interval 2, with no batch claimed"] if rank == 1 else [])
    assert claimed == ([(0, 0), (0, 1), (0, 2), (1, 0)] if rank == 1 else
                       [(e, i) for e in range(3) for i in range(3) if (e, i) != (1, 1)])


def test_a_torchrun_restart_goes_on_only_from_its_own_jobs_point_and_refuses_a_damaged_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker torchrun started again goes on from the run dir's commit point of its own job (another job's is no
    restart of it), and, as a resume, refuses a point whose contents no longer match their SHA-256."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "job-a"}.items():
        monkeypatch.setenv(key, value)
    commit = tmp_path / "checkpoints" / "commit.pt"
    save_checkpoint(commit, {**_PAYLOAD, "epoch": 1, POSITION_KEY: 64, TORCHRUN_JOB_KEY: "job-b"})
    assert trainer._this_torchrun_jobs_point(tmp_path) is None
    save_checkpoint(commit, {**_PAYLOAD, "epoch": 1, POSITION_KEY: 64, TORCHRUN_JOB_KEY: "job-a"})
    assert trainer._this_torchrun_jobs_point(tmp_path) == commit
    damaged = load_checkpoint(commit, mmap=True)
    damaged[POSITION_KEY] = 96  # changed after the digest was written: what a flipped bit does to the contents
    torch.save(damaged, commit)
    with pytest.raises(ValueError, match=f"^{commit} is damaged: its contents do not match the SHA-256"):
        trainer._this_torchrun_jobs_point(tmp_path)
