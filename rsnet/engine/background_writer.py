"""The primary's writes of an epoch's end (checkpoints, metrics.json, TensorBoard, history and figures), run in order
on one thread of their own while the next epoch trains (``log.background_writes``)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)

Job = Callable[[], None]


class BackgroundWriter:
    """Runs submitted jobs in submission order on one writer thread; ``background=False`` runs each at once on the
    caller's thread, as a run did before (an error raises there and then).

    The first error a job raises is kept and every later job is dropped (the run is stopping); :meth:`wait` raises it
    on the caller's thread. Leaving the ``with`` block waits for every job, on every path out of it."""

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job: Job) -> None:
        """Run ``job`` after the jobs submitted before it (at once without a background thread)."""
        if not self.background:
            job()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rsnet-writer", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def wait(self) -> None:
        """Block until every job submitted so far has run; raise the first error one of them raised."""
        if self._thread is not None:
            self._jobs.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """:meth:`wait`, then end the writer thread (a later :meth:`submit` starts another)."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread.join()
                self._thread = None

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                if self._error is None:
                    job()
            except BaseException as error:  # noqa: BLE001 - kept, and raised on the training thread by wait()
                self._error = error
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

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
