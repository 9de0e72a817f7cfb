"""The several-devices path: one spawned process per device, this process hosting the store and watching."""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rsnet.parallel.watch import Heartbeats, WorkerWatch, beat, die_with_parent
from rsnet.parallel.worker import LaunchSettings, destroy_group, join_group, setup_device

log = logging.getLogger(__name__)

_TERMINATE_GRACE_S = 5.0


def spawn_local(worker_fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], settings: LaunchSettings) -> Any:
    """Run one spawned worker per device of ``settings``; return rank 0's result (see :class:`WorkerWatch`)."""
    world = len(settings.devices)
    store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=datetime.timedelta(seconds=settings.timeout_s),
                          wait_for_workers=False)
    context = mp.get_context("spawn")
    clocks = context.Array("d", world, lock=False)  # 0.0 until a worker's first beat
    processes, readers = [], []
    try:
        for rank in range(world):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=_child_main, name=f"rsnet-worker-{rank}",
                                      args=(rank, settings, store.port, worker_fn, args, kwargs, writer,
                                            logging.getLogger().getEffectiveLevel(), clocks, os.getpid()),
                                      daemon=False)
            with _ctrl_c_ignored():  # inherited: Ctrl-C reaches this process only, which stops the workers
                process.start()
            writer.close()
            processes.append(process)
            readers.append(reader)
        log.info("launched %d workers on %s (backend %s, store port %d)", world, settings.devices, settings.backend,
                 store.port)
        heartbeats = Heartbeats(clocks, time.monotonic(), settings.timeout_s)
        return WorkerWatch(processes, readers, settings.devices, heartbeats).run()
    finally:
        _terminate(processes)
        del store


def _child_main(rank: int, settings: LaunchSettings, port: int, worker_fn: Callable[..., Any], args: tuple,
                kwargs: dict[str, Any], conn: Any, log_level: int, clocks: Any, parent: int) -> None:
    """Entry point of a spawned worker: die with the launcher, beat, join the store and group, run, send the result
    or the error."""
    die_with_parent(parent)
    threading.Thread(target=beat, args=(clocks, rank, parent), name="rsnet-heartbeat", daemon=True).start()
    if not logging.getLogger().handlers:  # spawned: the parent's logging setup (e.g. Hydra's) is not inherited
        logging.basicConfig(level=log_level,
                            format=f"[%(asctime)s][%(name)s][%(levelname)s][worker {rank}] - %(message)s")
    world = len(settings.devices)
    try:
        setup_device(torch.device(settings.devices[rank]), settings.cpu_threads)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=settings.timeout_s))
        result = worker_fn(join_group(settings, store, rank, world, rank), *args, **kwargs)
        # Plain pickle (tensors by value): torch's shared-memory reductions die with the sending process.
        conn.send_bytes(pickle.dumps(("ok", result if rank == 0 else None)))
    except BaseException as error:  # noqa: BLE001 - report everything to the parent
        try:
            conn.send_bytes(pickle.dumps(("error", f"{type(error).__name__}: {error}", traceback.format_exc(),
                                          _picklable(error))))
        except Exception:  # noqa: BLE001
            pass
        conn.close()
        destroy_group()
        os._exit(1)
    conn.close()
    destroy_group()


def _picklable(error: BaseException) -> BaseException | None:
    """``error`` if it survives a pickle round trip (so the parent can re-raise its type), else None."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - e.g. an exception holding a lock or a C++ object
        return None
    return error


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


def _terminate(processes: list[Any]) -> None:
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
