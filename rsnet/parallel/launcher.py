"""Start one worker process per device and watch them.

Three ways in, one worker function:

* one device: the worker runs in this process, in a world of size 1 (the same code path as many workers);
* several devices on this machine: one spawned process per device; this process hosts the c10d
  ``TCPStore`` on a free port of 127.0.0.1 and watches the children: when one dies, raises or stops
  giving its heartbeat (stopped, hung), the others are terminated and :class:`WorkerError` names the
  worker (rank and device). The children ignore Ctrl-C: this process gets it and stops them;
* started by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment): this process *is*
  the worker; it takes ``devices[LOCAL_RANK]`` and joins the group through the c10d store on the
  rendezvous endpoint ``MASTER_ADDR:MASTER_PORT``.

The backend is gloo when any worker is on a CPU and NCCL when all are GPUs (override with
``backend=``). Collectives and store waits time out after ``timeout_s``, so a dead peer never makes
the survivors hang.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing.connection as mpc
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
_TERMINATE_GRACE_S = 5.0
_ROOT_CAUSE_GRACE_S = 1.0
HEARTBEAT_S = 0.5  # a spawned worker's heartbeat thread stamps the shared clock table this often
_STALE_S = 3.0  # a worker silent this long while another one failed is the one that stopped


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
class WorkerContext:
    """What a worker knows about its place in the run.

    ``store`` is the c10d store every worker shares (the adaptive scheduler claims batches through it);
    ``group`` the process group (None means the default group); ``slowdown`` the simulated slowdown
    factor of this worker (1.0 = none).
    """

    rank: int
    world_size: int
    device: torch.device
    store: Any
    group: Any
    is_primary: bool
    slowdown: float = 1.0
    backend: str = "gloo"
    devices: list[str] = field(default_factory=list)
    timeout_s: float = DEFAULT_TIMEOUT_S
    local_rank: int = 0

    @property
    def comm_device(self) -> torch.device:
        """Where tensors must live for this group's collectives (CPU for gloo, the GPU for NCCL)."""
        return self.device if self.backend == "nccl" else torch.device("cpu")


def choose_backend(devices: Sequence[str]) -> str:
    """NCCL when every device is a GPU, gloo as soon as one worker is on a CPU."""
    return "nccl" if devices and all(str(d).startswith("cuda") for d in devices) else "gloo"


def cpu_threads_for(devices: Sequence[str], cores: int | None = None) -> int:
    """A CPU worker's fair share of this host's cores: max(1, cores // number of CPU workers here)."""
    cores = cores if cores is not None else _available_cores()
    cpu_workers = sum(1 for d in devices if str(d) == "cpu" or str(d).startswith("cpu:"))
    return max(1, cores // max(cpu_workers, 1))


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def started_by_torchrun() -> bool:
    """True when RANK, WORLD_SIZE and LOCAL_RANK are set (torchrun / torch.distributed.run)."""
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def launch(worker_fn: Callable[..., Any], devices: Sequence[str], *args: Any, timeout_s: float = DEFAULT_TIMEOUT_S,
           slowdown: Sequence[float] | None = None, backend: str | None = None, cpu_threads: int | None = None,
           **kwargs: Any) -> Any:
    """Run ``worker_fn(ctx, *args, **kwargs)`` once per device; return rank 0's return value.

    Args:
        worker_fn: a picklable (module-level) function; its first argument is a :class:`WorkerContext`.
        devices: one entry per worker on this machine, e.g. ``["cuda:0", "cuda:1"]``, ``["cuda:0", "cpu"]``,
            ``["cpu", "cpu"]``. Under torchrun: the devices of this node, indexed by LOCAL_RANK.
        timeout_s: process-group and store timeout: a worker stuck in a collective with a dead peer gives
            up after this long.
        slowdown: simulated slowdown factor per rank (``[1.0, 2.0]`` makes rank 1 twice as slow).
        backend: ``"gloo"`` or ``"nccl"``; default: :func:`choose_backend`.
        cpu_threads: torch threads of each CPU worker; default: a fair share of the cores.

    Raises:
        WorkerError: a worker raised, was killed, or exited without a result; names its rank and device.
    """
    devices = [str(d) for d in devices]
    if not devices:
        raise ValueError("launch needs at least one device, e.g. ['cpu'] or ['cuda:0', 'cuda:1']")
    slowdowns = [float(s) for s in (slowdown or [])]
    if any(s < 1.0 for s in slowdowns):
        raise ValueError(f"slowdown factors must be >= 1.0, got {slowdowns}")
    if started_by_torchrun():
        return _run_torchrun_worker(worker_fn, devices, args, kwargs, timeout_s, slowdowns, backend, cpu_threads)
    backend = backend or choose_backend(devices)
    threads = cpu_threads or cpu_threads_for(devices)
    if len(devices) == 1:
        return _run_in_process(worker_fn, devices[0], args, kwargs, timeout_s, slowdowns, backend, threads)
    return _spawn_local(worker_fn, devices, args, kwargs, timeout_s, slowdowns, backend, threads)


# --------------------------------------------------------------------------------------------- workers


def _setup_device(device: torch.device, threads: int) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "cpu":
        torch.set_num_threads(threads)


def _make_context(rank: int, world: int, device_name: str, store: Any, backend: str, timeout_s: float,
                  slowdowns: list[float], devices: list[str], local_rank: int) -> WorkerContext:
    slow = slowdowns[rank] if rank < len(slowdowns) else 1.0
    ctx = WorkerContext(rank=rank, world_size=world, device=torch.device(device_name), store=store, group=None,
                        is_primary=rank == 0, slowdown=slow, backend=backend, devices=list(devices),
                        timeout_s=timeout_s, local_rank=local_rank)
    if slow != 1.0:
        log.warning("worker %d (%s): SIMULATED slowdown x%.2f (sleeps after every step)", rank, device_name, slow)
    return ctx


def _init_group(backend: str, store: Any, rank: int, world: int, timeout_s: float, device: torch.device) -> None:
    options: dict[str, Any] = {}
    if backend == "nccl" and device.type == "cuda":
        options["device_id"] = device
    dist.init_process_group(backend, store=dist.PrefixStore("rsnet_pg", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **options)


def _destroy_group() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - cleanup must not mask the real error
            pass


def _run_in_process(worker_fn, device_name, args, kwargs, timeout_s, slowdowns, backend, threads) -> Any:
    device = torch.device(device_name)
    previous_threads = torch.get_num_threads()
    _setup_device(device, threads)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    if dist.is_initialized():
        raise RuntimeError("launch: a default process group already exists in this process")
    _init_group(backend, store, 0, 1, timeout_s, device)
    try:
        ctx = _make_context(0, 1, device_name, store, backend, timeout_s, slowdowns, [device_name], 0)
        return worker_fn(ctx, *args, **kwargs)
    finally:
        _destroy_group()
        if device.type == "cpu":
            torch.set_num_threads(previous_threads)


def _run_torchrun_worker(worker_fn, devices, args, kwargs, timeout_s, slowdowns, backend, cpu_threads) -> Any:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank >= len(devices):
        raise ValueError(f"LOCAL_RANK {local_rank} has no device: trainer.devices={devices} lists this node's "
                         f"devices, one per process (torchrun --nproc-per-node={len(devices)})")
    device_name = devices[local_rank]
    device = torch.device(device_name)
    backend = backend or os.environ.get("RSNET_BACKEND") or choose_backend(devices)
    _setup_device(device, cpu_threads or cpu_threads_for(devices))
    store = _rendezvous_store(rank, world, timeout_s)
    _init_group(backend, store, rank, world, timeout_s, device)
    try:
        ctx = _make_context(rank, world, device_name, store, backend, timeout_s, slowdowns, devices, local_rank)
        return worker_fn(ctx, *args, **kwargs)
    finally:
        _destroy_group()


def _rendezvous_store(rank: int, world: int, timeout_s: float) -> dist.Store:
    """The c10d store on the rendezvous endpoint ``MASTER_ADDR:MASTER_PORT``, keyed by run id and restart.

    torchrun's agent hosts a TCPStore there when ``TORCHELASTIC_USE_AGENT_STORE=True``; otherwise
    (RANK, WORLD_SIZE, MASTER_* set by hand or by SLURM) rank 0 hosts it. The prefix keeps the keys of
    a restarted attempt apart from those the failed attempt left behind.
    """
    host, port = _master_endpoint()
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host, port, world, is_master=not agent_hosts and rank == 0,
                          timeout=datetime.timedelta(seconds=timeout_s), multi_tenant=not agent_hosts)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"rsnet/{run_id}/{restart}", store)


def _master_endpoint() -> tuple[str, int]:
    """``MASTER_ADDR`` and ``MASTER_PORT``, which torchrun (or whoever set RANK and WORLD_SIZE) must set."""
    missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(key)]
    if missing:
        raise ValueError(f"RANK, WORLD_SIZE and LOCAL_RANK are set (a torchrun-style start), but there is no "
                         f"{' or '.join(missing)} in the environment: set MASTER_ADDR and MASTER_PORT to rank 0's "
                         f"address and a free port (torchrun sets them)")
    port = os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 2**16:
        raise ValueError(f"MASTER_PORT={port!r} is not a port number (1..65535)")
    return os.environ["MASTER_ADDR"], int(port)


def _child_main(rank: int, world: int, devices: list[str], port: int, backend: str, timeout_s: float,
                slowdowns: list[float], threads: int, worker_fn, args, kwargs, conn, log_level: int,
                heartbeats) -> None:
    """Entry point of a spawned worker: beat, join the store and group, run, send the result or the error."""
    threading.Thread(target=_beat, args=(heartbeats, rank), name="rsnet-heartbeat", daemon=True).start()
    device_name = devices[rank]
    if not logging.getLogger().handlers:  # spawned: the parent's logging setup (e.g. Hydra's) is not inherited
        logging.basicConfig(level=log_level,
                            format=f"[%(asctime)s][%(name)s][%(levelname)s][worker {rank}] - %(message)s")
    try:
        device = torch.device(device_name)
        _setup_device(device, threads)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=timeout_s))
        _init_group(backend, store, rank, world, timeout_s, device)
        ctx = _make_context(rank, world, device_name, store, backend, timeout_s, slowdowns, devices, rank)
        result = worker_fn(ctx, *args, **kwargs)
        # Plain pickle (tensors by value): torch's shared-memory reductions die with the sending process.
        conn.send_bytes(pickle.dumps(("ok", result if rank == 0 else None)))
    except BaseException as error:  # noqa: BLE001 - report everything to the parent
        try:
            conn.send_bytes(pickle.dumps(("error", f"{type(error).__name__}: {error}", traceback.format_exc(),
                                          _picklable(error))))
        except Exception:  # noqa: BLE001
            pass
        conn.close()
        _destroy_group()
        os._exit(1)
    conn.close()
    _destroy_group()


def _beat(heartbeats, rank: int) -> None:
    """Stamp this worker's slot of the shared clock table until the process ends. It stops when the process
    does not run (SIGSTOP, Ctrl-Z, a hang that holds the interpreter): the parent reads that as "stopped"."""
    while True:
        heartbeats[rank] = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of this machine
        time.sleep(HEARTBEAT_S)


def _picklable(error: BaseException) -> BaseException | None:
    """``error`` if it survives a pickle round trip (so the parent can re-raise its type), else None."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - e.g. an exception holding a lock or a C++ object
        return None
    return error


# ---------------------------------------------------------------------------------------------- parent


@dataclass
class _Failure:
    rank: int
    reason: str
    details: str
    at: float
    priority: int  # -1: stopped beating; 0: died without a word (killed, os._exit, segfault); 1: raised;
    # 2: raised a comm error (a symptom of another worker's failure)
    cause: BaseException | None = None


_COMM_ERROR_HINTS = ("DistBackendError", "Connection closed", "Connection reset", "timed out", "Timeout",
                     "Broken pipe", "DistNetworkError", "DistStoreError", "peer")


def _spawn_local(worker_fn, devices, args, kwargs, timeout_s, slowdowns, backend, threads) -> Any:
    world = len(devices)
    store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    context = mp.get_context("spawn")
    heartbeats = context.Array("d", world, lock=False)  # 0.0 until a worker's first beat
    processes, readers = [], []
    try:
        for rank in range(world):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_child_main, name=f"rsnet-worker-{rank}",
                                      args=(rank, world, devices, store.port, backend, timeout_s, slowdowns,
                                            threads, worker_fn, args, kwargs, writer,
                                            logging.getLogger().getEffectiveLevel(), heartbeats), daemon=False)
            with _ctrl_c_ignored():  # inherited: Ctrl-C reaches this process only, which stops the workers
                process.start()
            writer.close()
            processes.append(process)
            readers.append(reader)
        log.info("launched %d workers on %s (backend %s, store port %d)", world, devices, backend, store.port)
        return _watch(processes, readers, devices, _Heartbeats(heartbeats, time.monotonic(), timeout_s))
    finally:
        _terminate(processes)
        del store


@contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored for the block (in the main thread; elsewhere a no-op). A process started meanwhile
    inherits the ignored disposition, which Python keeps, so a spawned worker never sees Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class _Heartbeats:
    """The workers' shared clock table, read by the parent to find a worker that stopped running."""

    clocks: Any
    started: float
    timeout_s: float

    def silent_for(self, rank: int) -> tuple[float, bool]:
        """Seconds since ``rank``'s last beat (since launch if it never beat) and whether it ever beat."""
        last = self.clocks[rank]
        return time.monotonic() - (last or self.started), bool(last)

    def stopped(self, rank: int, others_failed: bool) -> _Failure | None:
        """A failure for ``rank`` if it went silent: for ``timeout_s`` (the run would stop then anyway), or, once
        another worker failed, for a few seconds. A worker that never beat is still starting (imports, CUDA
        init: slow on a loaded machine); it is blamed only once another failed and ``timeout_s`` has passed."""
        silent, beat = self.silent_for(rank)
        if beat:
            limit = min(_STALE_S, self.timeout_s) if others_failed else self.timeout_s
        else:
            limit = self.timeout_s if others_failed else float("inf")
        if silent < limit:
            return None
        return _Failure(rank, f"stopped responding: no heartbeat for {silent:.0f} s (the process is stopped, e.g. "
                              "by SIGSTOP or Ctrl-Z, hung, or starved of CPU); the other workers waited for it",
                        "", time.monotonic(), -1)


def _watch(processes, readers, devices, heartbeats: _Heartbeats | None = None) -> Any:
    """Wait for every worker; on the first failure give the others a moment to report, then raise."""
    world = len(processes)
    results: dict[int, Any] = {}
    failures: list[_Failure] = []
    open_readers = {readers[rank]: rank for rank in range(world)}
    alive = {processes[rank].sentinel: rank for rank in range(world)}
    first_failure_at: float | None = None
    while len(results) < world:
        if first_failure_at is not None and time.monotonic() - first_failure_at > _ROOT_CAUSE_GRACE_S:
            break
        wait_s = 1.0 if first_failure_at is None else _ROOT_CAUSE_GRACE_S
        ready = mpc.wait(list(open_readers) + list(alive), timeout=wait_s)
        log.debug("watch: %d ready, failures %s", len(ready), [(f.rank, f.reason[:40]) for f in failures])
        for item in ready:
            if item in open_readers:
                rank = open_readers[item]
                try:
                    message = pickle.loads(item.recv_bytes())
                except (EOFError, OSError):
                    # The worker closed its end without a word: it died (or is dying) without a result.
                    del open_readers[item]
                    processes[rank].join(0.5)
                    if not processes[rank].is_alive():
                        alive.pop(processes[rank].sentinel, None)
                        _record_death(failures, rank, processes[rank].exitcode)
                    continue
                except Exception as error:  # noqa: BLE001 - e.g. a result that cannot be unpickled here
                    message = ("error", f"result could not be received: {type(error).__name__}: {error}",
                               traceback.format_exc())
                del open_readers[item]
                if message[0] == "ok":
                    results[rank] = message[1]
                else:
                    comm = any(hint in message[1] for hint in _COMM_ERROR_HINTS)
                    cause = message[3] if len(message) > 3 else None
                    failures.append(_Failure(rank, message[1], message[2], time.monotonic(), 2 if comm else 1,
                                             cause))
            elif item in alive:
                rank = alive.pop(item)
                processes[rank].join(0.1)
                code = processes[rank].exitcode
                if rank in results:
                    continue
                # Give a pending message in the pipe the chance to arrive first.
                reader = readers[rank]
                if reader in open_readers and reader.poll(0.2):
                    continue  # handled on the next round (the process is gone, its message is not)
                open_readers.pop(reader, None)
                _record_death(failures, rank, code)
        if heartbeats is not None:
            failed = {f.rank for f in failures}
            for rank in range(world):
                if rank not in results and rank not in failed and processes[rank].is_alive():
                    stopped = heartbeats.stopped(rank, others_failed=bool(failures))
                    if stopped is not None:
                        failures.append(stopped)
        if failures and first_failure_at is None:
            first_failure_at = time.monotonic()
        if not alive and not open_readers and len(results) < world and not failures:
            missing = [r for r in range(world) if r not in results]
            failures.append(_Failure(missing[0], "exited without a result", "", time.monotonic(), 0))
    if failures:
        failures.sort(key=lambda f: (f.priority, f.at))
        root = failures[0]
        others = "\n".join(f"worker rank {f.rank} ({devices[f.rank]}): {f.reason}" for f in failures[1:])
        raise WorkerError(root.rank, devices[root.rank], root.reason, root.details, others, root.cause)
    return results.get(0)


def _record_death(failures: list[_Failure], rank: int, code: int | None) -> None:
    if any(f.rank == rank for f in failures):
        return
    if code is not None and code < 0:
        how = f"killed by signal {signal.Signals(-code).name}"
    else:
        how = f"exited with code {code} without a result"
    failures.append(_Failure(rank, how, "", time.monotonic(), 0))


def _terminate(processes) -> None:
    """SIGTERM every live child, then SIGKILL what is still there after a grace period."""
    for process in processes:
        if process.is_alive():
            process.terminate()
            os.kill(process.pid, signal.SIGCONT)  # a stopped (SIGSTOP) worker acts on SIGTERM only once it runs
    deadline = time.monotonic() + _TERMINATE_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1.0)
