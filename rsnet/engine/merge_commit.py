"""The run's commit point within an epoch: after every merge the primary keeps the merged model, its optimizer and
where the epoch stands in host memory, writes them to ``checkpoints/commit.pt`` every :data:`WRITE_EVERY_S` and on its
way out of a launch (a peer lost, the agent's SIGTERM), so that a run that lost a worker (or was stopped) goes on from
the last merge instead of the last epoch (docs/scheduler.md, "Devices that come and go")."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsnet.checkpoint import load_checkpoint, run_checkpoint_path, save_checkpoint
from rsnet.engine.background_writer import BackgroundWriter
from rsnet.engine.snapshot import host_snapshot

COMMIT_NAME = "commit.pt"
POSITION_KEY = "position"  # a commit's samples of its epoch merged (the first positions of the epoch's permutation)


# A commit is kept in memory after every merge and written at most this often while the run goes well (a write of a
# ResNet-18's model and optimizer, 90 MB with their SHA-256, every merge cost a CPU-only run 8 % of its wall time).
WRITE_EVERY_S = 30.0


class MergeCommits:
    """The primary's commits: after a merge the state is copied off the live tensors and kept (:meth:`offer`); the
    newest is written (atomically, on a writer thread of its own, beside the training) when the last write is
    :data:`WRITE_EVERY_S` old, and at once by :meth:`flush` on the way out of a launch. A worker lost while the primary
    lives loses at most the merge interval in flight; the primary's own loss, at most ``write_every_s`` of work. A
    failed write stops the run at the next merge; :meth:`cost` says what the commits took."""

    def __init__(self, run_dir: Path, write_every_s: float = WRITE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = run_checkpoint_path(run_dir, COMMIT_NAME)
        self.writer = BackgroundWriter(background=True, lowest_priority=False)  # a starved write would hold a merge
        self.write_every_s, self.clock = write_every_s, clock
        self.latest: dict[str, Any] | None = None  # the newest commit, copied off the live tensors
        self.kept = self.written = 0  # commits kept, and the number of the newest written
        self.last_write = -float("inf")  # when the last write started (``clock``)
        self.copy_s = self.write_s = 0.0  # training time the copies took; the writes' time

    def offer(self, payload: Callable[[], dict[str, Any]]) -> None:
        """Keep ``payload()`` (a checkpoint's contents with :data:`POSITION_KEY`) as the newest commit; write it when
        the last write is :data:`WRITE_EVERY_S` old and done."""
        self.writer.raise_if_failed()
        started = time.perf_counter()
        self.latest = host_snapshot(payload())
        self.kept += 1
        self.copy_s += time.perf_counter() - started
        if not self.writer.busy and self.clock() - self.last_write >= self.write_every_s:
            self.last_write = self.clock()
            kept, number = self.latest, self.kept
            self.writer.submit(lambda: self._write(kept, number))

    def flush(self) -> None:
        """Write the newest commit now if it is not on disk yet: the way out of a launch (a peer lost, a signal)."""
        self.writer.wait()
        if self.latest is not None and self.written < self.kept:
            self._write(self.latest, self.kept)

    def _write(self, payload: dict[str, Any], number: int) -> None:
        started = time.perf_counter()
        save_checkpoint(self.path, payload)
        self.written = number
        self.write_s += time.perf_counter() - started

    def cost(self) -> str:
        """The commits' cost for the log: how many were kept and written, the training time the copies took."""
        return (f"{self.kept} merge commits kept, the newest written every {self.write_every_s:g} s ({self.path}): "
                f"copies {self.copy_s:.2f} s of the primary's training time; the writes took {self.write_s:.2f} s "
                "beside the training")

    def close(self) -> None:
        """Wait for the write in flight (raising its error) and end the writer thread."""
        self.writer.close()


def resume_point(run_dir: Path) -> Path | None:
    """What a run in ``run_dir`` goes on from: its ``commit.pt`` where that was written within the epoch after
    ``last.pt``'s (or where there is no last.pt), else ``last.pt``; None where it has neither."""
    last, commit = run_checkpoint_path(run_dir), run_checkpoint_path(run_dir, COMMIT_NAME)
    if not commit.is_file():
        return last if last.is_file() else None
    if not last.is_file():
        return commit
    epoch_of = lambda path: int(load_checkpoint(path, mmap=True)["epoch"])  # noqa: E731 - the tensors stay on disk
    return commit if epoch_of(commit) >= epoch_of(last) else last


def committed_position(checkpoint: dict[str, Any]) -> int:
    """The samples of the checkpoint's epoch already merged into it: 0 for an epoch's end (``last.pt``)."""
    return int(checkpoint.get(POSITION_KEY, 0))
