"""The run's commit point within an epoch: after a merge the primary has the merged model, its optimizer and where the
epoch stands written to ``checkpoints/commit.pt``, so that a run that lost a worker (or was stopped) goes on from the
last merge instead of the last epoch (docs/scheduler.md, "Devices that come and go")."""

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


class MergeCommits:
    """The primary's writes of ``commit.pt``, on a writer thread of their own (atomic): after a merge the state is
    copied off the live tensors and written while training goes on; the next merge waits for that write, so that a
    run loses at most one merge interval. A failed write stops the run at the next merge; :meth:`cost` says what the
    commits took."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_checkpoint_path(run_dir, COMMIT_NAME)
        self.writer = BackgroundWriter(background=True, lowest_priority=False)  # a starved write would hold a merge
        self.written = 0
        self.copy_s = self.waited_s = self.write_s = 0.0  # training time the copies and waits took; the writes' time

    def offer(self, payload: Callable[[], dict[str, Any]]) -> None:
        """Commit ``payload()`` (a checkpoint's contents with :data:`POSITION_KEY`) once the previous commit is
        written."""
        started = time.perf_counter()
        self.writer.wait()
        copied = time.perf_counter()
        kept = host_snapshot(payload())
        self.waited_s += copied - started
        self.copy_s += time.perf_counter() - copied
        self.written += 1
        self.writer.submit(lambda: self._write(kept))

    def _write(self, payload: dict[str, Any]) -> None:
        started = time.perf_counter()
        save_checkpoint(self.path, payload)
        self.write_s += time.perf_counter() - started

    def cost(self) -> str:
        """The commits' cost for the log: how many, the training time their copies and waits took, the writes'."""
        return (f"{self.written} merge commits ({self.path}): {self.copy_s + self.waited_s:.2f} s of the primary's "
                f"training time (copies {self.copy_s:.2f} s, waits for a write {self.waited_s:.2f} s); the writes "
                f"took {self.write_s:.2f} s beside the training")

    def close(self) -> None:
        """Wait for the commit in flight (raising its error) and end the writer thread."""
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
