"""One run at a time in a run directory: advisory ``filelock`` locks, one for the run (rank 0's under torchrun) and one
per worker, which the operating system releases however their holder exits."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from rsnet.engine.config_checks import ConfigError
from rsnet.files import remove_stale_temporaries

log = logging.getLogger(__name__)

LOCK_NAME = ".rsnet.lock"
OWNER_NAME = ".rsnet.pid"  # the pid of the process that holds LOCK_NAME, for the refusal's message
WORKER_LOCK_GLOB = ".rsnet.worker-*.lock"  # one per live worker; a new run needs every one of them free


@contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for the duration of the block, or refuse (ConfigError) while another process holds it or
    workers of an earlier run are still alive in it."""
    run_dir = Path(run_dir)
    lock = FileLock(run_dir / LOCK_NAME, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = _read_owner(run_dir) or "another process"
        raise ConfigError(f"{run_dir} is in use by a run that is still alive (pid {holder}); wait for it to "
                          "finish, stop it, or choose another hydra.run.dir") from None
    try:
        _check_no_workers_left(run_dir)
        (run_dir / OWNER_NAME).write_text(str(os.getpid()))
        if stale := remove_stale_temporaries(run_dir):
            log.info("%s: removed %d temporary file(s) a killed writer left (%s)", run_dir, len(stale),
                     ", ".join(str(path.relative_to(run_dir)) for path in stale))
        yield
    finally:
        lock.release()


def _read_owner(run_dir: Path) -> str:
    """The pid the run dir's holder wrote, or an empty string."""
    try:
        return (run_dir / OWNER_NAME).read_text().strip()
    except OSError:
        return ""


def _check_no_workers_left(run_dir: Path) -> None:
    """Refuse while a worker of an earlier run still holds its lock (a killed launcher's lock is released
    before its workers end); remove the locks of workers that have ended."""
    for path in sorted(run_dir.glob(WORKER_LOCK_GLOB)):
        lock = FileLock(path, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise ConfigError(f"{run_dir} is still in use by workers of an earlier run that are ending; wait a few "
                              "seconds and start again, or choose another hydra.run.dir") from None
        lock.release()
        path.unlink(missing_ok=True)


@contextmanager
def share_run_dir(run_dir: Path) -> Iterator[None]:
    """Held by each worker for its whole run (released by the operating system when it ends): :func:`hold_run_dir`
    refuses a new run until the last is gone."""
    path = Path(run_dir) / f".rsnet.worker-{os.getpid()}.lock"
    try:
        with FileLock(path):
            yield
    finally:  # a worker that stops on an error leaves no lock file either
        path.unlink(missing_ok=True)
