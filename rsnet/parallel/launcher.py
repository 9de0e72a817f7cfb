"""Start one worker per device: in this process for one device, through torch's elastic agent for several on this
machine (:mod:`~rsnet.parallel.elastic`), or as this process under ``torchrun``."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from rsnet.parallel.elastic import WorkerError, launch_local
from rsnet.parallel.worker_setup import (LaunchSettings, WorkerContext, agree_backend, choose_backend, destroy_group,
                                   join_group, run_torchrun_worker, setup_device)

__all__ = ["DEFAULT_TIMEOUT_S", "WorkerContext", "WorkerError", "agree_backend", "check_slowdown", "choose_backend",
           "launch", "launch_options", "started_by_torchrun"]

DEFAULT_TIMEOUT_S = 600.0
GPU_WORKER_CORES = 2  # the cores a GPU worker's host needs: the thread that launches its kernels, its prefetch thread


def _cpu_threads_for(devices: Sequence[str]) -> int:
    """A CPU worker's fair share of this host's cores once each GPU worker here has kept GPU_WORKER_CORES (a CPU worker
    on every core starves a GPU worker's launching thread)."""
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
    """Run ``worker_fn(ctx, *args, **kwargs)`` (module-level, in a file: the workers import it by name, as a script
    calling this needs ``if __name__ == "__main__":``) once per device of ``devices`` (under torchrun: this
    node's); return rank 0's result. ``slowdown``: simulated, per rank; ``backend``: default :func:`choose_backend`;
    ``cpu_threads``: default a fair share. Raises :class:`WorkerError` naming a failed worker."""
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


