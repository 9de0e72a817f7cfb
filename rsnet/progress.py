"""Progress bars beside which the console's log lines stay whole: while a bar is drawn, tqdm's
``logging_redirect_tqdm`` routes the root logger's console handlers (stdout, stderr) through ``tqdm.write`` (the bar
is cleared, the line written with the handler's formatter and filters, the bar redrawn), on a terminal and in a file
alike; log files are left alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


@contextmanager
def progress_bar(**options: Any) -> Iterator[tqdm]:
    """A tqdm bar (``options`` as tqdm's) that closes with the block, with the console's log lines above it."""
    with tqdm(**options) as bar, nullcontext() if bar.disable else logging_redirect_tqdm():
        yield bar
