"""Messages that GDAL (through rasterio's logger) and the native libraries under it (libtiff: straight onto the
process's stderr) print while rsnet writes a file whose outcome it checks and reports itself: held back, logged at
debug level, and handed to the caller to explain a failure."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gdal_reason", "held_messages", "this_threads_gdal_messages"]

log = logging.getLogger(__name__)


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
    """Inside, GDAL's messages of this thread (through rasterio's logger) and what libtiff writes straight onto file
    descriptor 2 (e.g. ``_tiffSeekProc: No space left on device.``, which bypasses GDAL's error handler) are
    collected in the list yielded instead of printed, for a short write whose result the caller verifies; they are
    logged at debug level when the block ends."""
    messages: list[str] = []
    try:
        with _native_stderr(messages), this_threads_gdal_messages() as said:
            try:
                yield messages
            finally:
                messages.extend(said)
    finally:
        for message in messages:
            log.debug("GDAL: %s", message)


class _PerThread(logging.Handler):
    """On the ``rasterio`` logger while any thread collects: a record of a collecting thread goes to its list
    (INFO and up: GDAL's errors and warnings), any other record on to the root logger's handlers as before."""

    def __init__(self, passthrough_level: int) -> None:
        super().__init__(logging.DEBUG)
        self.lists: dict[int, list[str]] = {}
        self.passthrough_level = passthrough_level

    def emit(self, record: logging.LogRecord) -> None:
        messages = self.lists.get(record.thread)
        if messages is not None:
            if record.levelno >= logging.INFO:
                messages.append(record.getMessage())
        elif record.levelno >= self.passthrough_level:
            logging.getLogger().handle(record)


_collecting = threading.Lock()
_handler: _PerThread | None = None
_saved: tuple[bool, int] = (True, logging.NOTSET)


@contextmanager
def this_threads_gdal_messages() -> Iterator[list[str]]:
    """Inside, the messages GDAL reports through rasterio on this thread (a read's "libjpeg: Premature end of JPEG
    file", …) are collected in the list yielded, not logged; other threads' records are logged as before."""
    global _handler, _saved
    logger, ident, messages = logging.getLogger("rasterio"), threading.get_ident(), []
    with _collecting:
        if _handler is None:
            _saved = (logger.propagate, logger.level)
            _handler = _PerThread(logger.getEffectiveLevel())
            logger.addHandler(_handler)
            logger.propagate = False
            logger.setLevel(logging.INFO)
        _handler.lists[ident] = messages
    try:
        yield messages
    finally:
        with _collecting:
            del _handler.lists[ident]
            if not _handler.lists:
                logger.removeHandler(_handler)
                logger.propagate, logger.level = _saved
                _handler = None


def gdal_reason(messages: list[str]) -> str | None:
    """The first GDAL message of ``messages`` as GDAL worded it (rasterio wraps it in "GDAL signalled an error:
    err_no=…, msg='…'"), or None."""
    if not messages:
        return None
    quoted = messages[0].partition("msg=")[2].strip()
    return quoted[1:-1] if len(quoted) > 1 and quoted[0] == quoted[-1] and quoted[0] in "'\"" else messages[0]
