"""One run at a time in a run directory: an advisory lock that dies with the process holding it, and a shared lock
that every worker of the run holds until it is gone."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rsnet.engine.config_checks import ConfigError

LOCK_NAME = ".rsnet.lock"
WORKERS_LOCK_NAME = ".rsnet.workers.lock"  # shared by the run's workers; a new run needs it free


@contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for the duration of the block, or refuse (ConfigError) while another process holds it.

    The lock is ``flock`` on ``<run_dir>/.rsnet.lock``: the operating system releases it when the holder exits,
    however it exits, so a crashed or killed run never leaves the directory locked. (flock is advisory and may
    not reach across machines on network file systems; under torchrun only rank 0 takes it.)
    """
    path = Path(run_dir) / LOCK_NAME
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise ConfigError(f"{run_dir} is in use by a run that is still alive (pid {holder}); wait for it to "
                              "finish, stop it, or choose another hydra.run.dir") from None
        _check_no_workers_left(Path(run_dir))
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_no_workers_left(run_dir: Path) -> None:
    """Refuse while workers of an earlier run still hold the workers' lock (their launcher is gone, they are not
    yet: a killed launcher's lock is released before its workers end)."""
    path = run_dir / WORKERS_LOCK_NAME
    if not path.is_file():
        return
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{run_dir} is still in use by workers of an earlier run that are ending; wait a few "
                              "seconds and start again, or choose another hydra.run.dir") from None
        fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def share_run_dir(run_dir: Path) -> Iterator[None]:
    """Held by each worker for its whole run (``flock`` LOCK_SH on ``<run_dir>/.rsnet.workers.lock``, released by
    the operating system when the worker ends): :func:`hold_run_dir` refuses a new run until the last is gone."""
    with open(Path(run_dir) / WORKERS_LOCK_NAME, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
