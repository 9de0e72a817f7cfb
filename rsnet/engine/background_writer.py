"""The primary's writes of an epoch's end (checkpoints, metrics.json, TensorBoard, history and figures), run in order
on one thread of their own while the next epoch trains (``log.background_writes``)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

import torch

log = logging.getLogger(__name__)

Job = Callable[[], None]


def check_background_writes(value: object) -> None:
    """``log.background_writes`` must be auto, true or false; ValueError naming the setting otherwise."""
    if value != "auto" and not isinstance(value, bool):
        raise ValueError(f"log.background_writes={value!r}: use auto (in the background where the primary worker "
                         "trains on a GPU), true or false")


def writes_in_background(setting: str | bool, device: torch.device) -> bool:
    """Whether the epoch's end is written in the background for ``log.background_writes`` on the primary's
    ``device``: auto = on a GPU, whose host cores the training leaves mostly idle; on a CPU the writes would take
    cores from the training's threads (a 2-core machine trained test_resnet 1.4x slower while they ran)."""
    check_background_writes(setting)
    return device.type == "cuda" if setting == "auto" else bool(setting)


class BackgroundWriter:
    """Runs submitted jobs in submission order on one writer thread (a one-worker ``ThreadPoolExecutor``);
    ``background=False`` runs each at once on the caller's thread, as a run did before (an error raises there and then).

    The first error a job raises is kept and every later job is dropped (the run is stopping); :meth:`wait` raises it
    on the caller's thread. Leaving the ``with`` block waits for every job, on every path out of it.
    ``lowest_priority``: the writer thread takes the lowest CPU priority (:func:`_writer_thread`), so that it yields
    to training; False keeps the caller's (on a machine whose other busy processes would otherwise starve it)."""

    def __init__(self, background: bool = True, lowest_priority: bool = True) -> None:
        self.background = background
        self.lowest_priority = lowest_priority
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None
        self._error: BaseException | None = None

    def submit(self, job: Job) -> None:
        """Run ``job`` after the jobs submitted before it (at once without a background thread)."""
        if not self.background:
            job()
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, initializer=_writer_thread, initargs=(self.lowest_priority,))
        self._last = self._pool.submit(self._run, job)

    @property
    def busy(self) -> bool:
        """Whether a job submitted earlier has not finished yet."""
        return self._last is not None and not self._last.done()

    def wait(self) -> None:
        """Block until every job submitted so far has run; raise the first error one of them raised."""
        if self._last is not None:
            self._last.result()  # one thread, in order: the last job done is every job done
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """Raise the first error a job has raised so far, without waiting (the training loop asks after each step:
        a failed write stops the run within the epoch that follows it, not at that epoch's end)."""
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """:meth:`wait`, then end the writer thread (a later :meth:`submit` starts another)."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = self._last = None

    def _run(self, job: Job) -> None:
        try:
            if self._error is None:
                job()
        except BaseException as error:  # noqa: BLE001 - kept, and raised on the training thread by wait()
            self._error = error

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        try:  # an error is on its way out: the writes still finish, and the error in flight is the one reported
            self.close()
        except Exception as error:  # noqa: BLE001 - the writer's own error, second to the one in flight
            if error is not exc:
                log.warning("a background write failed as well: %s: %s", type(error).__name__, error)


def _writer_thread(lowest_priority: bool) -> None:
    """The writer thread's start: named ``rsnet-writer``; with ``lowest_priority`` the lowest CPU priority (Linux: a
    thread's own nice value): on a machine whose cores the training's threads keep busy (a CPU worker), the writes
    take what training leaves instead of stalling it."""
    threading.current_thread().name = "rsnet-writer"
    if lowest_priority and hasattr(os, "setpriority") and sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:  # not permitted here: the writes run at the training's priority
            pass
