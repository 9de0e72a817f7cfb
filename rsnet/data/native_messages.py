"""Messages that GDAL (through rasterio's logger) and the native libraries under it (libtiff: straight onto the
process's stderr) print while rsnet writes a file whose outcome it checks and reports itself: held back, logged at
debug level, and handed to the caller to explain a failure."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["held_messages"]

log = logging.getLogger(__name__)


class _Collect(logging.Handler):
    """A logging handler that appends each record's message to a list."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:  # rasterio logs GDAL's errors at INFO, its own chatter at DEBUG
            self.messages.append(record.getMessage())


@contextmanager
def _rasterio_log(messages: list[str]) -> Iterator[None]:
    """Inside, rasterio's log records (GDAL's errors and warnings among them) go to ``messages`` only."""
    logger = logging.getLogger("rasterio")
    handler, propagate, level = _Collect(messages), logger.propagate, logger.level
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate, logger.level = propagate, level


@contextmanager
def _native_stderr(messages: list[str]) -> Iterator[None]:
    """Inside, what native code writes on file descriptor 2 goes to ``messages`` (one entry per line)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            messages.extend(line for line in sink.read().decode(errors="replace").splitlines() if line.strip())


@contextmanager
def held_messages() -> Iterator[list[str]]:
    """Inside, GDAL's and libtiff's messages are collected in the list yielded instead of printed (for a short,
    single-threaded write whose result the caller verifies); they are logged at debug level when the block ends."""
    messages: list[str] = []
    try:
        with _native_stderr(messages), _rasterio_log(messages):
            yield messages
    finally:
        for message in messages:
            log.debug("GDAL: %s", message)
