"""What every worker has, however it was started: its settings, context, device and process group, and the
torchrun-style start (set by torchrun or by the elastic agent of :func:`rsnet.parallel.launch`)."""

from __future__ import annotations

import datetime
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import SignalException

log = logging.getLogger(__name__)

# Where a worker's start-up stands (run_torchrun_worker's on_stage): what the launcher says of a worker late to join
START_STAGES = ("its process has not started yet (the fork server may still be importing)",
                "it is starting (imports, device setup)", "it is connecting to the store at MASTER_ADDR:MASTER_PORT",
                "it is agreeing on a backend with the others through the store", "it is joining the process group",
                "joined")
STARTING, AT_STORE, AT_BACKEND, AT_GROUP, JOINED = range(1, len(START_STAGES))  # indexes of START_STAGES


@dataclass(frozen=True)
class LaunchSettings:
    """What the workers of one launch share: devices, backend (None until torchrun's workers agree on it), timeout,
    every worker's simulated slowdown and a CPU worker's torch threads."""

    devices: list[str]
    backend: str | None
    timeout_s: float
    slowdowns: list[float]
    cpu_threads: int


@dataclass
class WorkerContext:
    """What a worker knows about its place in the run: ``store``, the shared c10d store; ``slowdowns`` by rank;
    ``stage_through_host``: gloo with a model on a GPU, so every worker stages collectives through the host."""

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


def choose_backend(devices: Sequence[str]) -> str:
    """NCCL when every device is a GPU, gloo as soon as one worker is on a CPU."""
    return "nccl" if devices and all(str(d).startswith("cuda") for d in devices) else "gloo"


def agree_backend(store: dist.Store, rank: int, world: int, device: str) -> str:
    """The backend of a torchrun launch, the same on every node: :func:`choose_backend` over every worker's device,
    published and read through the store."""
    store.set(f"backend/device/{rank}", str(device))
    devices = [store.get(f"backend/device/{other}").decode() for other in range(world)]
    return choose_backend(devices)


def run_torchrun_worker(worker_fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                        settings: LaunchSettings, on_stage: Callable[[int], None] = lambda stage: None) -> Any:
    """Run ``worker_fn`` as global rank ``RANK`` on ``settings.devices[LOCAL_RANK]``; ``on_stage(i)`` as it reaches
    each of :data:`START_STAGES` (from :data:`AT_STORE` to :data:`JOINED`)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
    if local_rank >= len(settings.devices):
        raise ValueError(f"LOCAL_RANK {local_rank} has no device: trainer.devices={settings.devices} lists this "
                         f"node's devices, one per process (torchrun --nproc-per-node={len(settings.devices)})")
    setup_device(torch.device(settings.devices[local_rank]), settings.cpu_threads)
    on_stage(AT_STORE)
    store = _rendezvous_store(rank, world, settings.timeout_s)
    if settings.backend is None:
        on_stage(AT_BACKEND)
        settings = replace(settings, backend=agree_backend(store, rank, world, settings.devices[local_rank]))
        if rank == 0:
            log.info("backend %s, agreed by the %d workers through the store", settings.backend, world)
    on_stage(AT_GROUP)
    ctx = join_group(settings, store, rank, world, local_rank)
    on_stage(JOINED)
    try:
        return worker_fn(ctx, *args, **kwargs)
    finally:
        destroy_group()


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    """An agent (torchrun's, or the one :func:`rsnet.parallel.launch` runs) stops a worker with SIGTERM when a peer
    failed: raised as torch's agent raises it in itself, so that the worker leaves through its ``with`` blocks (the
    primary writes its newest merge commit) before the agent's SIGKILL, instead of dying where it stands."""
    raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))


@contextmanager
def sigterm_ignored() -> Iterator[None]:
    """SIGTERM ignored in the block (in the main thread; elsewhere nothing changes): a worker on its way out finishes
    a write before an agent's SIGTERM can interrupt it; the agent's SIGKILL after its shutdown timeout still ends it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, handler)


def _rendezvous_store(rank: int, world: int, timeout_s: float) -> dist.Store:
    """The c10d store on ``MASTER_ADDR:MASTER_PORT``, hosted by torchrun's agent (``TORCHELASTIC_USE_AGENT_STORE=True``)
    or else by rank 0, prefixed by run id and restart so that a restarted attempt's keys stay apart."""
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
