"""Progress bars beside which the console's log lines stay whole: while a bar is drawn, every console log line goes
through ``tqdm.write`` (the bar is cleared, the line written, the bar redrawn), on a terminal and in a file alike."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import IO, Any

from tqdm import tqdm


class _AboveTheBars:
    """A console stream whose writes go through ``tqdm.write``: a line never lands in the middle of a live bar."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        tqdm.write(text, file=self.stream, end="")

    def flush(self) -> None:
        self.stream.flush()


def _console_handlers() -> list[logging.StreamHandler]:
    """The root logger's handlers that write to the console (stdout or stderr; a log file is left alone)."""
    consoles = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    return [handler for handler in logging.getLogger().handlers
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and id(handler.stream) in consoles]


def _swap_stream(handler: logging.StreamHandler, stream: Any) -> Any:
    """Give ``handler`` another stream (under its lock, without flushing), returning the one it had."""
    handler.acquire()
    try:
        previous, handler.stream = handler.stream, stream
    finally:
        handler.release()
    return previous


@contextmanager
def log_above_bars() -> Iterator[None]:
    """Route the console's log lines through ``tqdm.write`` until the block ends (log files are left as they are)."""
    routed = [(handler, _swap_stream(handler, _AboveTheBars(handler.stream))) for handler in _console_handlers()]
    try:
        yield
    finally:
        for handler, stream in routed:
            _swap_stream(handler, stream)


@contextmanager
def progress_bar(**options: Any) -> Iterator[tqdm]:
    """A tqdm bar (``options`` as tqdm's) that closes with the block, with the console's log lines above it."""
    with tqdm(**options) as bar, nullcontext() if bar.disable else log_above_bars():
        yield bar
