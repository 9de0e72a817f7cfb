"""Several devices on this machine: torch's elastic agent starts one worker per device; rsnet adds a heartbeat, workers'
exceptions, workers that die with their launcher, Ctrl-C for the launcher and :class:`WorkerError`."""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import logging
import os
import pickle
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from rsnet.parallel.worker_setup import JOINED, START_STAGES, STARTING, LaunchSettings, run_torchrun_worker

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5  # each worker's heartbeat thread stamps the shared clock table this often
ARRIVE_S = 60.0  # a worker that has not joined the others this long after the launch is named in a log line
_PEER_GRACE_S = 1.0  # a worker that failed because a peer did exits this much later: the agent sees the peer first
_COMM_ERROR_HINTS = ("DistBackendError", "Connection closed", "Connection reset", "timed out", "Timeout",
                     "Broken pipe", "DistNetworkError", "DistStoreError", "peer")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_QUIET = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing.spawn")


class WorkerError(RuntimeError):
    """A worker process failed; ``rank`` and ``device`` name it, ``details`` has its traceback if any and
    ``cause`` the exception it raised (when it could be sent back; None if it died or hung). ``lost``: it died
    (killed, exited without a result) or stopped responding, without an error of its own: the device left the run,
    which the others can go on without (docs/scheduler.md, "Devices that come and go")."""

    def __init__(self, rank: int, device: str, reason: str, details: str = "", others: str = "",
                 cause: BaseException | None = None, lost: bool = False) -> None:
        self.rank, self.device, self.reason, self.details, self.cause = rank, device, reason, details, cause
        self.lost, self.others = lost, others
        message = f"worker rank {rank} ({device}) failed: {reason}"
        if details:
            message += f"\n--- traceback of worker {rank} ---\n{details.rstrip()}"
        if others:
            message += f"\n--- other workers ---\n{others.rstrip()}"
        super().__init__(message)


def launch_local(worker_fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], settings: LaunchSettings) -> Any:
    """Run one worker per device of ``settings`` under the elastic agent; return rank 0's result or raise
    :class:`WorkerError` naming the root cause."""
    world = len(settings.devices)
    method = start_method(worker_fn)
    context = mp.get_context("spawn")
    clocks, pids = context.Array("d", world, lock=False), context.Array("i", world, lock=False)
    stages = context.Array("i", world, lock=False)  # each worker's place in START_STAGES
    watchdog = _Watchdog(clocks, pids, settings.timeout_s, stages=stages, devices=settings.devices)
    watchdog.start()  # before this thread blocks SIGINT: the watchdog's thread takes Ctrl-C for it
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(_QUIET):  # the agent logs each failure with a traceback: WorkerError says it once
            logging.getLogger(name).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="rsnet-workers-") as folder:
        # torch < 2.9 has no signals_to_handle (its agent takes Ctrl-C too) and no shutdown_timeout (30 s)
        known = {field.name for field in dataclasses.fields(LaunchConfig)}
        newer = {key: value for key, value in (("signals_to_handle", "SIGTERM"), ("shutdown_timeout", 5))
                 if key in known}
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world, run_id=uuid.uuid4().hex,
                              rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", local_addr="127.0.0.1",
                              max_restarts=0, start_method=method,
                              logs_specs=DefaultLogsSpecs(log_dir=folder), **newer)
        log.info("launched %d workers on %s (backend %s) through torch's elastic agent (%s)", world, settings.devices,
                 settings.backend, config.start_method)
        log_files = [handler.baseFilename for handler in logging.getLogger().handlers
                     if isinstance(handler, logging.FileHandler)]
        sys.stdout.flush()  # a forked worker would write the launcher's buffered output again
        sys.stderr.flush()
        try:
            with _ctrl_c_for_the_launcher():
                results = elastic_launch(config, _worker_main)(
                    worker_fn, args, kwargs, settings, logging.getLogger().getEffectiveLevel(), log_files, clocks,
                    pids, stages, os.getpid(), folder)
        except ChildFailedError as failed:
            raise _root_cause(failed, watchdog.stopped, Path(folder), settings.devices) from None
        except SignalException as ended:  # the agent stopped the workers; end as the signal would
            if ended.sigval == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise SystemExit(128 + ended.sigval) from None
        finally:
            watchdog.done.set()
    return pickle.loads(results[0])


@contextmanager
def _ctrl_c_for_the_launcher() -> Iterator[None]:
    """SIGINT blocked in this thread while the agent starts the workers, so they start with it blocked (Ctrl-C is for
    the launcher, which stops them)."""
    names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    main = threading.current_thread() is threading.main_thread()
    handlers = {getattr(signal, name): signal.getsignal(getattr(signal, name))
                for name in names if main and hasattr(signal, name)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number, handler in handlers.items():
            if handler is not None:
                signal.signal(number, handler)


def _worker_main(worker_fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], settings: LaunchSettings,
                 log_level: int, log_files: list[str], clocks: Any, pids: Any, stages: Any, launcher: int,
                 folder: str) -> bytes | None:
    """A worker as the agent starts it (RANK, LOCAL_RANK, MASTER_* in its environment): ignore Ctrl-C, die with
    the launcher, beat, log, run; a failure leaves its reason, traceback and exception in ``folder``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops a Ctrl-C that came while it was blocked
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    launcher_runs = _die_with_launcher(launcher)
    _write_where_the_launcher_writes(launcher)
    rank = int(os.environ["RANK"])
    pids[rank], stages[rank] = os.getpid(), STARTING
    threading.Thread(target=_beat, args=(clocks, rank, launcher_runs), name="rsnet-heartbeat", daemon=True).start()
    logging.getLogger().handlers.clear()  # the fork server's handlers, without this worker's tag
    _log_beside_the_launcher(rank, log_level, log_files)
    try:
        result = run_torchrun_worker(worker_fn, args, kwargs, settings, lambda stage: stages.__setitem__(rank, stage))
        atexit.register(_exit_without_teardown)
        # pickled here: a result that cannot be sent is this worker's error, and tensors travel by value
        return pickle.dumps(result) if rank == 0 else None
    except BaseException as error:
        reason = f"{type(error).__name__}: {error}"
        report = (reason, traceback.format_exc(), _picklable(error), time.time())
        Path(folder, f"{rank}.pickle").write_bytes(pickle.dumps(report))
        if any(hint in reason for hint in _COMM_ERROR_HINTS):
            time.sleep(_PEER_GRACE_S)
        raise


def start_method(worker_fn: Callable[..., Any]) -> str:
    """How the workers start: from a fork server where the platform has one (Linux, macOS), else spawned.

    The fork server is a fresh, single-threaded interpreter that imports once what the workers need — every rsnet
    module this process has imported (the trainer's or the map's code, timm, torch) and ``worker_fn``'s module —
    then forks a worker per device: no worker imports them again (seconds each on a 2-core machine), and none
    inherits a lock that another thread of the launcher held at the moment of a fork (the launcher runs the elastic
    agent's store, the watchdog, torch's pools: a worker forked from it could hang for ever, e.g. in glibc's resolver
    lock or in the parent's OpenMP pool). It has never run CUDA, so GPU workers start from it too."""
    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    preload = sorted(name for name in sys.modules if name == "rsnet" or name.startswith("rsnet."))
    if worker_fn.__module__ not in ("__main__", "__mp_main__"):
        preload.append(worker_fn.__module__)
    mp.set_forkserver_preload(preload)  # heeded when the server starts: at this process's first launch
    return "forkserver"


def _log_beside_the_launcher(rank: int, level: int, log_files: list[str]) -> None:
    """A spawned worker's logging: the console, and for rank 0 also the launcher's ``log_files`` (a run's train.log,
    appended to beside the launcher's own lines), as a run with one worker logs there."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if rank == 0:
        handlers += [logging.FileHandler(path, encoding="utf-8") for path in log_files]
    logging.basicConfig(level=level, handlers=handlers,
                        format=f"[%(asctime)s][%(name)s][%(levelname)s][worker {rank}] - %(message)s")


def _exit_without_teardown() -> None:
    """A worker's end once its result is with the launcher: without the interpreter's teardown, about a second
    of CPU per process with torch loaded, which the agent waits for before it returns."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _write_where_the_launcher_writes(launcher: int) -> None:
    """Point this worker's stdout and stderr where the launcher's point now. The fork server keeps those of the
    launch that started it; a later launch of the same process may have redirected them since (a captured stderr,
    a log file): its workers' lines would go to the old place. Linux (``/proc``); elsewhere they stay as inherited,
    and so does a stream that cannot be opened again (a socket)."""
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            target = os.open(f"/proc/{launcher}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:
            continue
        stream.flush()
        os.dup2(target, fd)
        os.close(target)


def _die_with_launcher(launcher: int) -> Callable[[], bool]:
    """End this worker when its launcher ends, however it ends; returns the check :func:`_beat` runs every beat.

    A worker's parent is the fork server, which exits when the launcher does: ``prctl(PR_SET_PDEATHSIG)`` has the
    kernel SIGKILL the worker then (Linux). The heartbeat also watches the launcher itself, through a pidfd where
    there is one (no reused pid can pass for it), else by its pid."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the heartbeat's check remains
            pass
    try:
        descriptor = os.pidfd_open(launcher)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd here: ask by the pid
        return lambda: _pid_runs(launcher)
    poller = select.poll()
    poller.register(descriptor, select.POLLIN)
    return lambda: not poller.poll(0)  # readable once the launcher has ended


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # runs, as another user
        pass
    return True


def _beat(clocks: Any, rank: int, launcher_runs: Callable[[], bool]) -> None:
    """Stamp ``rank``'s slot of the shared clock table until the process ends (a daemon thread); end the worker
    when its launcher is gone instead of leaving it waiting in a collective until the timeout."""
    while True:
        if not launcher_runs():
            os._exit(1)
        clocks[rank] = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of this machine
        time.sleep(HEARTBEAT_S)


def _picklable(error: BaseException) -> BaseException | None:
    """``error`` if it survives a pickle round trip (so the launcher can re-raise its type), else None."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - e.g. an exception holding a lock or a C++ object
        return None
    return error


class _Watchdog(threading.Thread):
    """The launcher's reader of the clock table: the first worker silent for ``timeout_s`` (stopped, e.g. by
    SIGSTOP or Ctrl-Z, or hung holding the interpreter) is named in ``stopped`` and killed, which the agent sees. A
    worker that has not joined the others :data:`ARRIVE_S` after the launch is named in a log line, with its place in
    ``stages`` (:data:`START_STAGES`), while the run waits on. ``clock``: the heartbeats' clock (CLOCK_MONOTONIC,
    which every process of the machine shares)."""

    def __init__(self, clocks: Any, pids: Any, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 stages: Any = (), devices: Sequence[str] = ()) -> None:
        super().__init__(name="rsnet-watchdog", daemon=True)
        self.clocks, self.pids, self.timeout_s, self.clock = clocks, pids, timeout_s, clock
        self.stages, self.devices, self.launched = stages, devices, clock()
        self.stopped: dict[int, str] = {}
        self.late: set[int] = set()  # the workers named late to join
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(HEARTBEAT_S):
            self.check()

    def check(self) -> None:
        """Name and kill the first worker whose last beat is ``timeout_s`` old (one a run: the others only waited);
        name once each worker not yet joined :data:`ARRIVE_S` after the launch."""
        now = self.clock()
        waited = now - self.launched
        for rank, stage in enumerate(self.stages):
            if stage < JOINED and rank not in self.late and waited >= ARRIVE_S:
                self.late.add(rank)
                log.warning("worker rank %d (%s) has not joined the others %.0f s after the launch: %s; the run waits "
                            "on (trainer.timeout_s=%g ends it)", rank, self.devices[rank], waited, START_STAGES[stage],
                            self.timeout_s)
        for rank, last in enumerate(self.clocks):
            silent = now - last
            if last and self.pids[rank] and not self.stopped and silent >= self.timeout_s:
                # named before the kill: the agent may see the death before this thread runs again
                self.stopped[rank] = (f"stopped responding: no heartbeat for {silent:.0f} s (the process is "
                                      "stopped, e.g. by SIGSTOP or Ctrl-Z, hung, or starved of CPU); the other "
                                      "workers waited for it")
                try:
                    os.kill(self.pids[rank], signal.SIGKILL)
                except ProcessLookupError:  # it ended meanwhile: the agent has seen it
                    del self.stopped[rank]


def _root_cause(failed: ChildFailedError, stopped: dict[int, str], folder: Path, devices: list[str]) -> WorkerError:
    """The root cause first: a worker that stopped beating, then one that died without a word (killed,
    ``os._exit``, segfault), then one that raised, and last one that failed because a peer did (a comm error)."""
    failures: dict[int, tuple[float, float, str, str, BaseException | None]] = {}
    for path in folder.glob("*.pickle"):
        reason, details, cause, at = pickle.loads(path.read_bytes())
        comm = any(hint in reason for hint in _COMM_ERROR_HINTS)
        failures[int(path.stem)] = (2 if comm else 1, at, reason, details, cause)
    rank, failure = failed.get_first_failure()
    if rank not in failures:
        how = (f"killed by signal {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0 else
               f"exited with code {failure.exitcode} without a result")
        failures[rank] = (0, 0.0, how, "", None)
    failures.update({rank: (-1, 0.0, reason, "", None) for rank, reason in stopped.items()})
    order = sorted(failures, key=lambda rank: failures[rank][:2])
    root = failures[order[0]]
    others = "\n".join(f"worker rank {rank} ({devices[rank]}): {failures[rank][2]}" for rank in order[1:])
    return WorkerError(order[0], devices[order[0]], root[2], root[3], others, root[4], lost=root[0] <= 0)
