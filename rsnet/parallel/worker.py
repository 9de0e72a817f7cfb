"""What every worker has, however it was started: its settings, its context, its device and process group."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaunchSettings:
    """What the workers of one launch share: this machine's devices (one per worker), the backend (None until the
    workers of a torchrun launch have agreed on it), the process-group and store timeout, every worker's simulated
    slowdown and a CPU worker's torch threads."""

    devices: list[str]
    backend: str | None
    timeout_s: float
    slowdowns: list[float]
    cpu_threads: int


@dataclass
class WorkerContext:
    """What a worker knows about its place in the run.

    ``store`` is the c10d store every worker shares (the adaptive scheduler claims batches through it); the
    collectives use the default process group. ``slowdowns``: every worker's simulated slowdown factor by rank
    (empty: none), checked and logged by :func:`rsnet.parallel.launch`. ``stage_through_host``: the group runs
    gloo and at least one worker's model sits on a GPU, so every worker (CPU ones too) takes the host-staged
    collectives; a per-worker choice would have the GPU and CPU workers issue different collectives.
    """

    rank: int
    world_size: int
    device: torch.device
    store: Any
    is_primary: bool
    backend: str = "gloo"
    devices: list[str] = field(default_factory=list)
    slowdowns: list[float] = field(default_factory=list)
    stage_through_host: bool = False

    @property
    def slowdown(self) -> float:
        """This worker's simulated slowdown factor (1.0 = none)."""
        return self.slowdowns[self.rank] if self.rank < len(self.slowdowns) else 1.0

    @property
    def comm_device(self) -> torch.device:
        """Where tensors must live for this group's collectives (CPU for gloo, the GPU for NCCL)."""
        return self.device if self.backend == "nccl" else torch.device("cpu")


def setup_device(device: torch.device, threads: int) -> None:
    """Make ``device`` this process's current GPU, or give a CPU worker ``threads`` torch threads."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "cpu":
        torch.set_num_threads(threads)


def join_group(settings: LaunchSettings, store: Any, rank: int, world: int, local_rank: int) -> WorkerContext:
    """Join the default process group through ``store`` as ``rank`` of ``world`` (on ``devices[local_rank]``);
    returns the worker's context."""
    device = torch.device(settings.devices[local_rank])
    options: dict[str, Any] = {}
    if settings.backend == "nccl" and device.type == "cuda":
        options["device_id"] = device
    dist.init_process_group(settings.backend, store=dist.PrefixStore("rsnet_pg", store), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=settings.timeout_s), **options)
    ctx = WorkerContext(rank=rank, world_size=world, device=device, store=store, is_primary=rank == 0,
                        backend=settings.backend, devices=list(settings.devices), slowdowns=list(settings.slowdowns),
                        stage_through_host=settings.backend == "gloo" and _any_worker_on_gpu(device, world))
    if ctx.slowdown != 1.0:
        log.warning("worker %d (%s): SIMULATED slowdown x%.2f (sleeps after every step)", rank, device,
                    ctx.slowdown)
    return ctx


def _any_worker_on_gpu(device: torch.device, world: int) -> bool:
    """Whether any worker of the group is on a GPU: a collective, so every worker (on any machine) must call it."""
    flag = torch.tensor([int(device.type == "cuda")])
    if world > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def destroy_group() -> None:
    """Leave the default process group, if any; never raises (it runs on the way out of a failure too)."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - cleanup must not mask the real error
            pass
