"""A run that goes on when a worker is lost: the survivors start again, through torch's elastic agent and its
rendezvous, from the run's last commit point (the last merge's ``commit.pt``, else ``last.pt``), at most
``trainer.max_restarts`` times (docs/scheduler.md, "Devices that come and go")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsnet.checkpoint import load_checkpoint
from rsnet.engine.merge_commit import committed_position, resume_point
from rsnet.parallel import launch
from rsnet.parallel.launcher import WorkerError

log = logging.getLogger("rsnet.engine.trainer")


def launch_through_losses(worker_fn: Callable[..., Any], devices: list[str], config: dict[str, Any],
                          resume_from: str | None, options: dict[str, Any]) -> Any:
    """``launch(worker_fn, devices, config, resume_from, change, **options)``; where a worker is lost
    (:attr:`WorkerError.lost`) and another device is left, launch again without it from the run's resume point,
    ``change`` saying what happened. A worker that raised an error of its own, a lost worker beyond
    ``trainer.max_restarts`` or the last one stops the run with its :class:`WorkerError`."""
    max_restarts = int(config["trainer"]["max_restarts"])
    run_dir = Path(config["run_dir"])
    change: dict[str, Any] | None = None
    taken = 0
    while True:
        try:
            return launch(worker_fn, devices, config, resume_from, change, **options)
        except WorkerError as error:
            if not error.lost or len(devices) == 1:
                raise
            if taken >= max_restarts:
                limit = (f"the run had gone on without {taken} lost worker(s) already" if taken else
                         "a lost worker stops the run")
                raise WorkerError(error.rank, error.device, f"{error.reason} (trainer.max_restarts={max_restarts}: "
                                  f"{limit})", error.details, error.others, error.cause, lost=True) from None
            lost_at = time.time()
            taken += 1
            devices, options = _without(error.rank, devices, options)
            config = {**config, "trainer": {**config["trainer"], "lose_worker": None}}  # a simulated loss happened
            point = resume_point(run_dir)
            resume_from = str(point) if point else None
            change = _change(error, point, devices, lost_at)
            log.warning("worker rank %d (%s) is lost (%s); the run goes on with %d worker(s) on %s from %s "
                        "(lost worker %d of trainer.max_restarts=%d)", error.rank, error.device, error.reason,
                        len(devices), devices, change["resumed_from"], taken, max_restarts)


def _without(rank: int, devices: list[str], options: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The devices and launch options without worker ``rank`` (its simulated slowdown goes with it)."""
    slowdown = options.get("slowdown")
    if isinstance(slowdown, (list, tuple)):
        options = {**options, "slowdown": [factor for index, factor in enumerate(slowdown) if index != rank]}
    return [device for index, device in enumerate(devices) if index != rank], options


def _change(error: WorkerError, point: Path | None, devices: list[str], lost_at: float) -> dict[str, Any]:
    """The record of a lost worker, as the run's history keeps it (``membership_changes`` in metrics.json)."""
    if point is None:
        where, epoch, position = "the start (nothing was committed yet)", 0, 0
    else:
        saved = load_checkpoint(point, mmap=True)
        epoch, position = int(saved["epoch"]), committed_position(saved)
        where = f"{point.name} (epoch {epoch + 1}, {position} samples merged)" if position else \
            f"{point.name} (after epoch {epoch})"
    return {"lost": f"worker rank {error.rank} ({error.device})", "cause": error.reason, "resumed_from": where,
            "epoch": epoch, "position": position, "devices": list(devices), "lost_at": lost_at}
