"""The torchrun path: this process *is* one worker; it joins the others through the rendezvous endpoint's store."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rsnet.parallel.worker import LaunchSettings, destroy_group, join_group, setup_device


def started_by_torchrun() -> bool:
    """True when RANK, WORLD_SIZE and LOCAL_RANK are set (torchrun / torch.distributed.run)."""
    return all(key in os.environ for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def run_torchrun_worker(worker_fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                        settings: LaunchSettings) -> Any:
    """Run ``worker_fn`` as global rank ``RANK`` on ``settings.devices[LOCAL_RANK]``."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if local_rank >= len(settings.devices):
        raise ValueError(f"LOCAL_RANK {local_rank} has no device: trainer.devices={settings.devices} lists this "
                         f"node's devices, one per process (torchrun --nproc-per-node={len(settings.devices)})")
    setup_device(torch.device(settings.devices[local_rank]), settings.cpu_threads)
    store = _rendezvous_store(rank, world, settings.timeout_s)
    ctx = join_group(settings, store, rank, world, local_rank)
    try:
        return worker_fn(ctx, *args, **kwargs)
    finally:
        destroy_group()


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
