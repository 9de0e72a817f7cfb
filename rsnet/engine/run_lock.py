"""One run at a time in a run directory: an advisory lock that dies with the process holding it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rsnet.engine.config_checks import ConfigError

LOCK_NAME = ".rsnet.lock"


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
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
