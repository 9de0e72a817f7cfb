"""Shared behaviour of the command-line scripts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rsnet.data.errors import CorruptImageError
from rsnet.files import DiskFullError, check_writable_dir

# Errors caused by the user's input or files: one line, exit status 2.
USER_ERRORS = (ValueError, FileNotFoundError, CorruptImageError)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn errors caused by the user's input into one clear line and exit status 2 (no traceback); a full
    disk into one line naming the file and exit status 1."""
    try:
        yield
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except DiskFullError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


class RunDirCheck(Callback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): refuse a run dir that cannot be written, in one
    line, before Hydra creates it and sets up its log file there (which would fail with a traceback)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        with user_errors():
            check_writable_dir(Path(config.hydra.run.dir), "hydra.run.dir")
