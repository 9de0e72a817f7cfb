"""The parent's watch over spawned workers: collect their results, or find the worker that failed first.

Each worker also stamps its slot of a shared clock table from a heartbeat thread, so the parent finds a
worker that stopped running (SIGSTOP, Ctrl-Z, a hang that holds the interpreter) and names it.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5  # a spawned worker's heartbeat thread stamps the shared clock table this often
_STALE_S = 3.0  # a worker silent this long while another one failed is the one that stopped
_ROOT_CAUSE_GRACE_S = 1.0  # after the first failure, how long the others may still report theirs
_COMM_ERROR_HINTS = ("DistBackendError", "Connection closed", "Connection reset", "timed out", "Timeout",
                     "Broken pipe", "DistNetworkError", "DistStoreError", "peer")


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """End this worker the moment its launching process ``parent`` ends, however it ends (``kill -9`` too): on
    Linux the kernel sends SIGKILL (``prctl(PR_SET_PDEATHSIG)``), so an orphan never writes into a run that is
    no longer locked; elsewhere :func:`beat` notices within ``HEARTBEAT_S``. A parent that ended before the signal
    was armed is caught by the check that follows. (The kernel sends it when the parent *thread* that started the
    worker ends: :func:`rsnet.parallel.launch` blocks in that thread for the whole run.)"""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the heartbeat's watch remains
            pass
    if os.getppid() != parent:
        os._exit(1)


def beat(clocks: Any, rank: int, parent: int | None = None) -> None:
    """Stamp ``rank``'s slot of the shared clock table until the process ends (a worker's daemon thread). Where the
    launching process ``parent`` is gone (killed: it could not stop its workers), the worker ends itself instead
    of waiting in a collective for the others until the timeout."""
    while True:
        if parent is not None and os.getppid() != parent:
            log.error("worker %d: its launching process %d is gone; stopping", rank, parent)
            os._exit(1)
        clocks[rank] = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of this machine
        time.sleep(HEARTBEAT_S)


@dataclass
class Heartbeats:
    """The parent's view of the clock table (0.0 in a slot until that worker's first beat)."""

    clocks: Any
    started: float
    timeout_s: float

    def stopped_for(self, rank: int, others_failed: bool) -> float | None:
        """Seconds ``rank`` has been silent if that means it stopped, else None: silent for ``timeout_s`` (the
        run would stop then anyway), or, once another worker failed, for a few seconds. A worker that never beat
        is still starting (imports, CUDA init), so it is blamed only once another failed and ``timeout_s`` has
        passed."""
        last = self.clocks[rank]
        silent = time.monotonic() - (last or self.started)
        if last:
            limit = min(_STALE_S, self.timeout_s) if others_failed else self.timeout_s
        else:
            limit = self.timeout_s if others_failed else float("inf")
        return silent if silent >= limit else None


class WorkerError(RuntimeError):
    """A worker process failed; ``rank`` and ``device`` name it, ``details`` has its traceback if any and
    ``cause`` the exception it raised (when it could be sent back; None if it died or hung)."""

    def __init__(self, rank: int, device: str, reason: str, details: str = "", others: str = "",
                 cause: BaseException | None = None) -> None:
        self.rank, self.device, self.reason, self.details, self.cause = rank, device, reason, details, cause
        message = f"worker rank {rank} ({device}) failed: {reason}"
        if details:
            message += f"\n--- traceback of worker {rank} ---\n{details.rstrip()}"
        if others:
            message += f"\n--- other workers ---\n{others.rstrip()}"
        super().__init__(message)


@dataclass
class _Failure:
    rank: int
    reason: str
    details: str
    at: float
    priority: int  # -1: stopped beating; 0: died without a word (killed, os._exit, segfault); 1: raised;
    # 2: raised a comm error (a symptom of another worker's failure)
    cause: BaseException | None = None


class WorkerWatch:
    """The parent's watch over its spawned workers: results and failures so far, the pipes and processes still
    open. :meth:`run` waits for every worker."""

    def __init__(self, processes: list[Any], readers: list[mpc.Connection], devices: list[str],
                 heartbeats: Heartbeats) -> None:
        self.processes, self.readers, self.devices, self.heartbeats = processes, readers, devices, heartbeats
        self.world = len(processes)
        self.results: dict[int, Any] = {}
        self.failures: list[_Failure] = []
        self.open_readers = {readers[rank]: rank for rank in range(self.world)}
        self.alive = {processes[rank].sentinel: rank for rank in range(self.world)}
        self.first_failure_at: float | None = None

    def run(self) -> Any:
        """Rank 0's result once every worker sent its own; on the first failure give the others a moment to
        report theirs, then raise :class:`WorkerError` naming the root cause."""
        while len(self.results) < self.world and not self._grace_over():
            wait_s = 1.0 if self.first_failure_at is None else _ROOT_CAUSE_GRACE_S
            ready = mpc.wait(list(self.open_readers) + list(self.alive), timeout=wait_s)
            log.debug("watch: %d ready, failures %s", len(ready), [(f.rank, f.reason[:40]) for f in self.failures])
            for item in ready:
                if item in self.open_readers:
                    self._receive(item)
                elif item in self.alive:
                    self._exited(item)
            self._check_heartbeats()
            if self.failures and self.first_failure_at is None:
                self.first_failure_at = time.monotonic()
            if not self.alive and not self.open_readers and len(self.results) < self.world and not self.failures:
                missing = [r for r in range(self.world) if r not in self.results]
                self.failures.append(_Failure(missing[0], "exited without a result", "", time.monotonic(), 0))
        if self.failures:
            raise self._error()
        return self.results.get(0)

    def _grace_over(self) -> bool:
        return self.first_failure_at is not None and time.monotonic() - self.first_failure_at > _ROOT_CAUSE_GRACE_S

    def _receive(self, reader: mpc.Connection) -> None:
        """A worker's message: its result, or its error."""
        rank = self.open_readers.pop(reader)
        try:
            message = pickle.loads(reader.recv_bytes())
        except (EOFError, OSError):
            # The worker closed its end without a word: it died (or is dying) without a result.
            self.processes[rank].join(0.5)
            if not self.processes[rank].is_alive():
                self.alive.pop(self.processes[rank].sentinel, None)
                self._record_death(rank, self.processes[rank].exitcode)
            return
        except Exception as error:  # noqa: BLE001 - e.g. a result that cannot be unpickled here
            message = ("error", f"result could not be received: {type(error).__name__}: {error}",
                       traceback.format_exc())
        if message[0] == "ok":
            self.results[rank] = message[1]
            return
        comm = any(hint in message[1] for hint in _COMM_ERROR_HINTS)
        cause = message[3] if len(message) > 3 else None
        self.failures.append(_Failure(rank, message[1], message[2], time.monotonic(), 2 if comm else 1, cause))

    def _exited(self, sentinel: Any) -> None:
        """A worker process ended; unless its result or error is still on the way, it died."""
        rank = self.alive.pop(sentinel)
        self.processes[rank].join(0.1)
        code = self.processes[rank].exitcode
        if rank in self.results:
            return
        reader = self.readers[rank]
        if reader in self.open_readers and reader.poll(0.2):
            return  # handled on the next round (the process is gone, its message is not)
        self.open_readers.pop(reader, None)
        self._record_death(rank, code)

    def _check_heartbeats(self) -> None:
        """A failure for every live worker without a result that stopped beating."""
        failed = {f.rank for f in self.failures}
        for rank in range(self.world):
            if rank in self.results or rank in failed or not self.processes[rank].is_alive():
                continue
            silent = self.heartbeats.stopped_for(rank, others_failed=bool(self.failures))
            if silent is not None:
                self.failures.append(_Failure(
                    rank, f"stopped responding: no heartbeat for {silent:.0f} s (the process is stopped, e.g. by "
                          "SIGSTOP or Ctrl-Z, hung, or starved of CPU); the other workers waited for it",
                    "", time.monotonic(), -1))

    def _record_death(self, rank: int, code: int | None) -> None:
        if any(f.rank == rank for f in self.failures):
            return
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code} without a result"
        self.failures.append(_Failure(rank, how, "", time.monotonic(), 0))

    def _error(self) -> WorkerError:
        """The root cause first (a stopped worker, then one that died, raised, and last a comm error)."""
        failures = sorted(self.failures, key=lambda f: (f.priority, f.at))
        root = failures[0]
        others = "\n".join(f"worker rank {f.rank} ({self.devices[f.rank]}): {f.reason}" for f in failures[1:])
        return WorkerError(root.rank, self.devices[root.rank], root.reason, root.details, others, root.cause)
