"""Start one worker process per device and watch them.

Three ways in, one worker function:

* one device (:mod:`~rsnet.parallel.worker`): the worker runs in this process, in a world of size 1 (the
  same code path as many workers);
* several devices on this machine (:mod:`~rsnet.parallel.spawn`): one spawned process per device; this
  process hosts the c10d ``TCPStore`` on a free port of 127.0.0.1 and watches the children: when one dies,
  raises or stops giving its heartbeat (stopped, hung), the others are terminated and :class:`WorkerError`
  names the worker (rank and device). The children ignore Ctrl-C: this process gets it and stops them;
* started by ``torchrun`` (:mod:`~rsnet.parallel.torchrun`; ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the
  environment): this process *is* the worker; it takes ``devices[LOCAL_RANK]`` and joins the group through
  the c10d store on the rendezvous endpoint ``MASTER_ADDR:MASTER_PORT``.

The backend is gloo when any worker is on a CPU and NCCL when all are GPUs (override with
``backend=``). Collectives and store waits time out after ``timeout_s``, so a dead peer never makes
the survivors hang.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from rsnet.parallel.spawn import spawn_local
from rsnet.parallel.torchrun import run_torchrun_worker, started_by_torchrun
from rsnet.parallel.watch import WorkerError
from rsnet.parallel.worker import LaunchSettings, WorkerContext, run_in_process

__all__ = ["DEFAULT_TIMEOUT_S", "WorkerContext", "WorkerError", "choose_backend", "launch", "started_by_torchrun"]

DEFAULT_TIMEOUT_S = 600.0


def choose_backend(devices: Sequence[str]) -> str:
    """NCCL when every device is a GPU, gloo as soon as one worker is on a CPU."""
    return "nccl" if devices and all(str(d).startswith("cuda") for d in devices) else "gloo"


def _cpu_threads_for(devices: Sequence[str]) -> int:
    """A CPU worker's fair share of this host's cores: max(1, cores // number of CPU workers here)."""
    cpu_workers = sum(1 for d in devices if str(d) == "cpu" or str(d).startswith("cpu:"))
    return max(1, _available_cores() // max(cpu_workers, 1))


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


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
        slowdown: simulated slowdown factor per rank (``[1.0, 2.0]`` makes rank 1 twice as slow); each
            worker finds its own in ``ctx.slowdown``.
        backend: ``"gloo"`` or ``"nccl"``; default: :func:`choose_backend` (under torchrun, ``RSNET_BACKEND``
            first).
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
        backend = backend or os.environ.get("RSNET_BACKEND")
        run = run_torchrun_worker
    else:
        run = run_in_process if len(devices) == 1 else spawn_local
    settings = LaunchSettings(devices=devices, backend=backend or choose_backend(devices), timeout_s=timeout_s,
                              slowdowns=slowdowns, cpu_threads=cpu_threads or _cpu_threads_for(devices))
    return run(worker_fn, args, kwargs, settings)
