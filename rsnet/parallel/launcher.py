"""Start one worker per device: the same worker function on one machine or many.

Three ways in:

* one device: the worker runs in this process, in a world of size 1 (the same code path as many workers);
* several devices on this machine (:mod:`~rsnet.parallel.elastic`): torch's elastic agent, the one torchrun runs,
  starts one process per device and hosts the c10d store; each process is then a torchrun-style worker, as below.
  When one dies, raises or stops giving its heartbeat (stopped, hung), the others are stopped and
  :class:`WorkerError` names it (rank and device). The workers ignore Ctrl-C: this process gets it and stops them;
* started by ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment): this process *is* the
  worker; it takes ``devices[LOCAL_RANK]`` and joins the group through the c10d store on the rendezvous endpoint
  ``MASTER_ADDR:MASTER_PORT``.

The backend is gloo when any worker is on a CPU and NCCL when all are GPUs (override with ``backend=``); under
torchrun the workers of every node agree on it through the store (:func:`agree_backend`). Collectives and store
waits time out after ``timeout_s``, so a dead peer never makes the survivors hang.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from rsnet.parallel.elastic import WorkerError, launch_local
from rsnet.parallel.worker import (LaunchSettings, WorkerContext, agree_backend, choose_backend, destroy_group,
                                   join_group, run_torchrun_worker, setup_device)

__all__ = ["DEFAULT_TIMEOUT_S", "WorkerContext", "WorkerError", "agree_backend", "check_slowdown", "choose_backend",
           "launch", "launch_options", "started_by_torchrun"]

DEFAULT_TIMEOUT_S = 600.0
GPU_WORKER_CORES = 2  # the cores a GPU worker's host needs: the thread that launches its kernels, its prefetch thread


def _cpu_threads_for(devices: Sequence[str]) -> int:
    """A CPU worker's fair share of this host's cores once each GPU worker here has kept GPU_WORKER_CORES: max(1,
    (cores - 2 x GPU workers) // CPU workers). A CPU worker on every core starves a GPU worker's launching thread,
    and the GPU then waits for kernels to be launched."""
    cpu_workers = sum(1 for d in devices if str(d) == "cpu" or str(d).startswith("cpu:"))
    gpu_workers = len(devices) - cpu_workers
    return max(1, (_available_cores() - GPU_WORKER_CORES * gpu_workers) // max(cpu_workers, 1))


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def launch_options(trainer_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`launch` that come from the trainer config (conf/_base/launcher.yaml)."""
    backend = trainer_cfg["backend"]
    return {"timeout_s": float(trainer_cfg["timeout_s"]), "slowdown": trainer_cfg["slowdown"],
            "backend": backend if backend != "auto" else None, "cpu_threads": trainer_cfg["cpu_threads"]}


def check_slowdown(slowdown: Sequence[float] | None, num_workers: int) -> list[float]:
    """The simulated slowdown factors (``trainer.slowdown``): none, or one number >= 1 per worker."""
    if slowdown is None:
        return []
    factors = list(slowdown) if isinstance(slowdown, (list, tuple)) else [slowdown]
    if len(factors) != num_workers:
        raise ValueError(f"trainer.slowdown={factors} has {len(factors)} factor(s) for {num_workers} worker(s): give "
                         f"one factor per worker, e.g. [{', '.join(['1.0'] * num_workers)}]")
    if any(not isinstance(f, (int, float)) or isinstance(f, bool) or f < 1.0 for f in factors):
        raise ValueError(f"trainer.slowdown={factors}: every factor must be a number >= 1.0 "
                         "(1.0 = full speed, 2.0 = twice as slow)")
    return [float(f) for f in factors]


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
            first, else :func:`agree_backend` over every node's workers).
        cpu_threads: torch threads of each CPU worker; default: a fair share of the cores.

    Raises:
        WorkerError: a worker raised, was killed, or exited without a result; names its rank and device.
    """
    devices = [str(d) for d in devices]
    if not devices:
        raise ValueError("launch needs at least one device, e.g. ['cpu'] or ['cuda:0', 'cuda:1']")
    torchrun = started_by_torchrun()
    slowdowns = check_slowdown(slowdown, int(os.environ["WORLD_SIZE"]) if torchrun else len(devices))
    if torchrun:
        backend = backend or os.environ.get("RSNET_BACKEND")
        run = run_torchrun_worker
    else:
        run = run_in_process if len(devices) == 1 else launch_local
    # Under torchrun this node sees its own devices only: the workers agree on the backend through the store.
    settings = LaunchSettings(devices=devices, backend=backend or (None if torchrun else choose_backend(devices)),
                              timeout_s=timeout_s, slowdowns=slowdowns,
                              cpu_threads=cpu_threads or _cpu_threads_for(devices))
    return run(worker_fn, args, kwargs, settings)


def run_in_process(worker_fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                   settings: LaunchSettings) -> Any:
    """The one-device path: ``worker_fn`` runs in this process, in a world of size 1 with its own store."""
    device = torch.device(settings.devices[0])
    previous_threads = torch.get_num_threads()
    setup_device(device, settings.cpu_threads)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=settings.timeout_s),
                          wait_for_workers=False)
    if dist.is_initialized():
        raise RuntimeError("launch: a default process group already exists in this process")
    ctx = join_group(settings, store, 0, 1, 0)
    try:
        return worker_fn(ctx, *args, **kwargs)
    finally:
        destroy_group()
        if device.type == "cpu":
            torch.set_num_threads(previous_threads)


def started_by_torchrun() -> bool:
    """True when RANK, WORLD_SIZE and LOCAL_RANK are set (torchrun / torch.distributed.run)."""
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


