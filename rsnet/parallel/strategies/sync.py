"""``sync``: DistributedDataParallel, with a comm hook that tells the step's own compute from its waiting."""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rsnet.parallel.strategies.base import StaticStrategy, register_strategy
from rsnet.parallel.worker_setup import WorkerContext


# DDP's switch for broadcasting rank 0's buffers before every forward: broadcast_buffers, deprecated by newer torch.
_BUFFER_SYNC_ARGUMENT = ("forward_sync_buffers"
                         if "forward_sync_buffers" in inspect.signature(nn.parallel.DistributedDataParallel).parameters
                         else "broadcast_buffers")


@register_strategy
class SyncStrategy(StaticStrategy):
    """DistributedDataParallel: equal static batches B/world, gradient all-reduce every step (inside backward).
    Its intervals (``interval_steps`` batches) only set how often the loop syncs with the host."""

    name = "sync"
    # DDP's default: rank 0's buffers are broadcast before every forward, a collective timed apart (see _own_seconds),
    # so that a worker that waits there for a slower one does not count the wait as its own compute.
    sync_buffers_every_step = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ctx = self.ctx
        self.steps_per_interval = int(self.cfg["interval_steps"])
        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        staged = ctx.stage_through_host  # a GPU worker among CPU workers: all workers choose the same collectives
        if staged:
            for tensor in self.model.state_dict().values():  # DDP's own init broadcast, through host memory
                host = tensor.detach().cpu()
                dist.broadcast(host, src=0)
                tensor.copy_(host.to(tensor.device))
        # From here on the loop trains the model through its DDP wrapper (same parameters and buffers).
        sync_buffers = self.sync_buffers_every_step and not staged
        self.model = nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids, init_sync=not staged,
                                                         **{_BUFFER_SYNC_ARGUMENT: sync_buffers})
        # Our own all-reduce hook times the last bucket's hand-over and the last reduction's completion: the time in
        # between is communication or waiting for the other workers, not compute (see _own_seconds).
        self._comm = _CommTimer(ctx, staged)
        self.model.register_comm_hook(self._comm, _timed_allreduce_hook)
        self._forward_wait = _ForwardWaitTimer()
        self.model.register_forward_pre_hook(self._forward_wait.called)
        self.model.module.register_forward_pre_hook(self._forward_wait.started)

    @classmethod
    def check_config(cls, trainer: Mapping[str, Any], batch_size: int, workers: int) -> None:
        super().check_config(trainer, batch_size, workers)
        if int(trainer["interval_steps"]) < 1:
            raise ValueError(f"trainer.interval_steps must be >= 1, got {trainer['interval_steps']}")

    @classmethod
    def check_setup(cls, ctx: WorkerContext, model: nn.Module, batch_size: int) -> None:
        super().check_setup(ctx, model, batch_size)
        if ctx.world_size > 1 and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            warnings.warn("trainer=sync: BatchNorm statistics are per replica (DDP broadcasts rank 0's buffers)",
                          stacklevel=3)

    def _own_seconds(self, seconds: float) -> float:
        """The step time less its waits for the other workers (the un-overlapped all-reduce tail and DDP's collectives
        before the forward)."""
        waited = self._comm.pop_wait() + self._forward_wait.pop()
        return max(seconds - waited, 0.0)

    def end_epoch(self) -> None:
        # DDP broadcasts rank 0's buffers before each forward; do it once more so replicas end identical.
        comm = self.ctx.comm_device
        for buffer in self.model.buffers():
            staged = buffer.detach().to(comm)
            dist.broadcast(staged, src=0)
            with torch.no_grad():
                buffer.copy_(staged.to(buffer.device))
        self._gather_epoch_row(self.epoch)
        self.epoch += 1


class _CommTimer:
    """State of :func:`_timed_allreduce_hook`: when the step's last bucket was launched and its last reduction
    completed (perf_counter seconds)."""

    def __init__(self, ctx: WorkerContext, staged: bool) -> None:
        self.ctx, self.staged = ctx, staged
        self.weight = 1.0 / ctx.world_size  # this worker's share of the summed gradient (its batch / B)
        self.last_launch = self.last_done = None

    def pop_wait(self) -> float:
        """Seconds from the last bucket's launch to the last completion in the step just done; resets."""
        launch, done = self.last_launch, self.last_done
        self.last_launch = self.last_done = None
        if launch is None or done is None:
            return 0.0
        return max(done - launch, 0.0)


class _ForwardWaitTimer:
    """Forward pre-hooks on the DDP wrapper (``called``) and on the model it wraps (``started``): the seconds in
    between are DDP's own collectives before the forward."""

    def __init__(self) -> None:
        self._called: float | None = None
        self._waited = 0.0

    def called(self, module: nn.Module, inputs: Any) -> None:
        self._called = time.perf_counter()

    def started(self, module: nn.Module, inputs: Any) -> None:
        if self._called is not None:
            self._waited += time.perf_counter() - self._called
            self._called = None

    def pop(self) -> float:
        """Seconds spent before the forwards since the last call; resets."""
        waited, self._waited = self._waited, 0.0
        return waited


def _timed_allreduce_hook(timer, bucket):  # no annotations: DDP checks them, and they are strings here
    """DDP comm hook: the buckets' sum of each worker's gradient × ``timer.weight``, through host memory when
    ``timer.staged``, timed for :meth:`SyncStrategy._own_seconds`."""
    tensor = bucket.buffer()
    staged = tensor.detach().cpu() if timer.staged else tensor
    staged.mul_(timer.weight)
    timer.last_launch = time.perf_counter()
    work = dist.all_reduce(staged, async_op=True)

    def done(future: torch.futures.Future) -> torch.Tensor:
        if timer.staged:
            tensor.copy_(future.value()[0].to(tensor.device))
        now = time.perf_counter()
        timer.last_done = now if timer.last_done is None else max(timer.last_done, now)
        return tensor

    return work.get_future().then(done)
