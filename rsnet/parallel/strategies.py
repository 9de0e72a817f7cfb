"""Training strategies: ``adaptive`` (dynamic scheduling, adaptive batch sizes, normalized merging),
``sync`` (DistributedDataParallel) and ``local_sgd`` (periodic uniform averaging).

Every strategy drives the same worker loop (rsnet/engine/trainer.py); every communication point is a
call in that loop::

    for epoch in ...:
        for interval in range(strategy.start_epoch(epoch)):
            for claim in strategy.claims(interval):      # store round trips at most, never a collective
                lr = schedule(claim.position) * strategy.lr_scale(len(claim.indices))
                loss = criterion(strategy.model(x[claim.indices]), y); loss.backward(); optimizer.step()
                strategy.after_step(len(claim.indices), step_seconds)
            strategy.end_interval(compute_seconds)      # adaptive: the merge; local_sgd: the average
        strategy.end_epoch()                            # afterwards every replica is identical

``claim.position`` is the run's one learning-rate clock (epochs since the start, at the batch's first
sample in the epoch's shared order): every worker reads the same clock, whatever its share of the batches.
All workers issue the same collectives in the same order: the adaptive strategy merges at every interval
boundary on every worker (a worker that claimed nothing merges with weight 0).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from rsnet.parallel.launcher import WorkerContext
from rsnet.parallel.merge import average_buffers, normalized_merge
from rsnet.parallel.batching import (
    IntervalClaimer,
    check_batch_settings,
    epoch_permutation,
    initial_batch_sizes,
    interval_bounds,
    next_batch_sizes,
    next_claim_size,
    static_batches,
    static_partition,
)

log = logging.getLogger(__name__)

STRATEGIES = ("adaptive", "sync", "local_sgd")
# Strategies built in this process so far: each gets its own key prefix in the c10d store, so a second run in the
# same process group (tests, sweeps in one interpreter) never reads the claims or timings a first one left there.
_instances = 0

# Per-worker fields carried in the merge's meta vector, in this order.
_META_FIELDS = ("n", "s", "b", "updates", "compute", "b_max")


def _get(cfg: Any, key: str, default: Any) -> Any:
    value = cfg.get(key, default) if isinstance(cfg, Mapping) or hasattr(cfg, "get") else default
    return default if value is None else value


def launch_options(trainer_cfg: Any) -> dict[str, Any]:
    """The keyword arguments of :func:`rsnet.parallel.launch` that come from the trainer config."""
    slowdown = _get(trainer_cfg, "slowdown", None)
    return {"timeout_s": float(_get(trainer_cfg, "timeout_s", 600.0)),
            "slowdown": [float(s) for s in slowdown] if slowdown else None,
            "backend": _get(trainer_cfg, "backend", None) if _get(trainer_cfg, "backend", "auto") != "auto" else None,
            "cpu_threads": _get(trainer_cfg, "cpu_threads", None)}


@dataclass(frozen=True)
class Claim:
    """A batch this worker trains on: its sample indices, and ``position``, where it starts on the run's shared
    clock (epochs since the start of training; drives the lr schedule, warm-up and distillation ramp-up)."""

    indices: torch.Tensor
    position: float


class Strategy:
    """Shared bookkeeping: simulated slowdown, per-step counters, stats rows."""

    name = "base"

    def __init__(self, trainer_cfg: Any, ctx: WorkerContext, model: nn.Module, optimizer: Any, num_samples: int,
                 batch_size: int, seed: int) -> None:
        global _instances
        _instances += 1
        self.cfg, self.ctx, self.module, self.optimizer = trainer_cfg, ctx, model, optimizer
        self.num_samples, self.total_batch, self.seed = int(num_samples), int(batch_size), int(seed)
        self.world, self.rank = ctx.world_size, ctx.rank
        self.prefix = f"rsnet/{self.name}{_instances}"
        self.b_min = int(_get(trainer_cfg, "batch_min", 8))
        # lr of a batch of b = lr x b / ref_batch; default ref_batch = B / world, the batch of an equal split.
        ref_batch = _get(trainer_cfg, "ref_batch", None)
        self.ref_batch = float(ref_batch) if ref_batch else max(int(batch_size), 1) / max(ctx.world_size, 1)
        slowdowns = _get(trainer_cfg, "slowdown", None)
        self.slowdown = float(slowdowns[self.rank]) if slowdowns and self.rank < len(slowdowns) else ctx.slowdown
        if self.slowdown < 1.0:
            raise ValueError(f"trainer.slowdown must be >= 1.0, got {self.slowdown} for worker {self.rank}")
        if self.slowdown != 1.0 and self.slowdown != ctx.slowdown:  # launch already said so otherwise
            log.warning("worker %d (%s): SIMULATED slowdown x%g (sleeps %g x its step time after every step)",
                        self.rank, ctx.device, self.slowdown, self.slowdown - 1.0)
        self.epoch = 0
        self._rows: list[dict[str, float]] = []
        self._reported = 0
        self._reset_counters()

    # ------------------------------------------------------------------ loop API
    @property
    def model(self) -> nn.Module:
        """The module to call for the forward pass."""
        return self.module

    @property
    def needs_step_seconds(self) -> bool:
        """Whether :meth:`after_step` needs every step's own time (a simulated slowdown sleeps in proportion to
        it); otherwise the loop may time steps asynchronously and report only the interval's total."""
        return self.slowdown != 1.0

    def start_epoch(self, epoch: int) -> int:  # pragma: no cover - abstract
        """Plan ``epoch``; returns its number of intervals."""
        raise NotImplementedError

    def claims(self, interval: int) -> Iterator[Claim]:  # pragma: no cover - abstract
        """This worker's batches of ``interval`` of the current epoch, in order."""
        raise NotImplementedError

    def lr_scale(self, batch_size: int) -> float:
        """Factor on the scheduled lr for a step on ``batch_size`` samples. 1.0 for sync (DDP averages the
        gradients of the total batch B, which is what ``optimizer.lr`` is tuned for)."""
        return 1.0

    def after_step(self, batch_size: int, seconds: float | None) -> None:
        """Count the step; a simulated slow worker sleeps (slowdown − 1) × its own compute time of the step
        (``seconds`` less any time the step spent waiting for other workers, see :meth:`_own_seconds`)."""
        extra = (self.slowdown - 1.0) * max(self._own_seconds(float(seconds)), 0.0) if seconds is not None else 0.0
        if extra > 0:
            time.sleep(extra)
        self._n += int(batch_size)
        self._updates += 1
        self._sleep += extra

    def end_interval(self, compute_seconds: float) -> None:
        """The interval's communication point (a collective on every worker, or nothing). ``compute_seconds``:
        this worker's step time in the interval, without the simulated-slowdown sleep."""
        self._compute += float(compute_seconds)

    def end_epoch(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _own_seconds(self, seconds: float) -> float:
        """This worker's own compute time within a step of ``seconds`` (overridden where a step can wait)."""
        return seconds

    def on_out_of_memory(self) -> int:
        """Called after a CUDA out-of-memory error; returns the batch size to retry with."""
        raise RuntimeError(f"{self.name}: out of memory with static batches; lower batch_size")

    def stats(self, all_rows: bool = False) -> list[dict[str, float]]:
        """Log rows recorded since the previous call (``all_rows``: every row). On rank 0 they hold every
        worker's figures (keys ``b/<rank>``, ``s/<rank>``, ...); on other ranks this worker's view."""
        rows = self._complete_rows()
        if all_rows:
            return list(rows)
        new = rows[self._reported:]
        self._reported = len(rows)
        return list(new)

    def summary(self) -> str:
        """A text summary of the run's scheduling figures (for the end of training)."""
        return summarize(self._complete_rows(), self.world, self.name, self._slowdowns_text())

    def report(self) -> dict[str, Any]:
        """The run's scheduling figures per worker, for metrics.json (see :func:`scheduler_report`)."""
        return scheduler_report(self._complete_rows(), self.world, self.name, [str(d) for d in self.ctx.devices],
                                self._slowdowns())

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "epoch": self.epoch, "world_size": self.world}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("name") not in (None, self.name):
            log.warning("strategy state of %r loaded into %r: ignoring it", state.get("name"), self.name)
            return
        self.epoch = int(state.get("epoch", 0))

    # ------------------------------------------------------------------ helpers
    def _reset_counters(self) -> None:
        self._n, self._updates, self._compute, self._sleep = 0, 0, 0.0, 0.0

    def _complete_rows(self) -> list[dict[str, float]]:
        return self._rows

    def _slowdowns(self) -> list[float]:
        return [float(f) for f in (_get(self.cfg, "slowdown", None) or [])] or [self.slowdown]

    def _slowdowns_text(self) -> str:
        factors = self._slowdowns()
        if all(f == 1.0 for f in factors):
            return ""
        return "simulated heterogeneity: slowdown per worker " + ", ".join(f"x{f:g}" for f in factors)

    def _gather_epoch_row(self, epoch: int, extra: Mapping[str, float] | None = None) -> None:
        """Static strategies: one row per epoch with every worker's counters (a collective)."""
        busy = self._compute + self._sleep
        mine = {"n": self._n, "updates": self._updates, "compute": busy, "s": self._n / busy if busy > 0 else 0.0,
                "b": self._static_batch(), **(extra or {})}
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine, group=self.ctx.group)
        total = sum(r["n"] for r in everyone) or 1
        row: dict[str, float] = {"epoch": epoch, "interval": epoch + 1}
        for rank, r in enumerate(everyone):
            for key, value in r.items():
                row[f"{key}/{rank}"] = float(value)
            row[f"p/{rank}"] = r["n"] / total
        self._rows.append(row)
        self._reset_counters()

    def _static_batch(self) -> int:
        return max(1, self.total_batch // self.world)


class _StaticStrategy(Strategy):
    """Equal static shares (DistributedSampler-style) cut into intervals of ``steps_per_interval`` batches.
    The clock of step k of an epoch is k·B / N_padded: the same on every worker."""

    steps_per_interval = 1

    def start_epoch(self, epoch: int) -> int:
        self.epoch = epoch
        shard = static_partition(self.num_samples, self.seed, epoch, self.rank, self.world)
        self._batches = static_batches(shard, self._static_batch(), min(self.b_min, self._static_batch()))
        self._padded = len(shard) * self.world
        return -(-len(self._batches) // self.steps_per_interval)

    def claims(self, interval: int) -> Iterator[Claim]:
        first = interval * self.steps_per_interval
        for step in range(first, min(first + self.steps_per_interval, len(self._batches))):
            position = step * self._static_batch() * self.world / self._padded
            yield Claim(self._batches[step], self.epoch + position)


class SyncStrategy(_StaticStrategy):
    """DistributedDataParallel: equal static batches B/world, gradient all-reduce every step (inside backward).
    Its intervals (``interval_steps`` batches) only set how often the loop syncs with the host."""

    name = "sync"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ctx = self.ctx
        self.steps_per_interval = int(_get(self.cfg, "interval_steps", 16))
        if self.steps_per_interval < 1:
            raise ValueError(f"trainer.interval_steps must be >= 1, got {self.steps_per_interval}")
        device_ids = [ctx.device] if ctx.device.type == "cuda" else None
        staged = ctx.device.type == "cuda" and ctx.backend == "gloo"  # a GPU worker among CPU workers
        if staged:
            for tensor in self.module.state_dict().values():  # DDP's own init broadcast, through host memory
                host = tensor.detach().cpu()
                dist.broadcast(host, src=0, group=ctx.group)
                tensor.copy_(host.to(tensor.device))
        self.ddp = nn.parallel.DistributedDataParallel(self.module, device_ids=device_ids, process_group=ctx.group,
                                                       init_sync=not staged, broadcast_buffers=not staged)
        # Our own all-reduce hook (through host memory for a GPU worker among CPU workers) records when the
        # last bucket is handed to the backend and when the last reduction completes: the time in between is
        # spent communicating or waiting for the other workers, not computing (see _own_seconds).
        self._comm = _CommTimer(ctx, staged)
        self.ddp.register_comm_hook(self._comm, _timed_allreduce_hook)

    @property
    def model(self) -> nn.Module:
        return self.ddp

    def _own_seconds(self, seconds: float) -> float:
        """The step time less the un-overlapped tail of the gradient all-reduce (waiting for the slowest worker
        and the last bucket's transfer), so a simulated slowdown scales compute only."""
        waited = self._comm.pop_wait()
        return max(seconds - waited, 0.0)

    def end_epoch(self) -> None:
        # DDP broadcasts rank 0's buffers before each forward; do it once more so replicas end identical.
        comm = self.ctx.comm_device
        for buffer in self.module.buffers():
            staged = buffer.detach().to(comm)
            dist.broadcast(staged, src=0, group=self.ctx.group)
            with torch.no_grad():
                buffer.copy_(staged.to(buffer.device))
        self._gather_epoch_row(self.epoch)
        self.epoch += 1


class _CommTimer:
    """State of :func:`_timed_allreduce_hook`: when the step's last bucket was launched and its last reduction
    completed (perf_counter seconds)."""

    def __init__(self, ctx: WorkerContext, staged: bool) -> None:
        self.ctx, self.staged = ctx, staged
        self.last_launch = self.last_done = None

    def pop_wait(self) -> float:
        """Seconds from the last bucket's launch to the last completion in the step just done; resets."""
        launch, done = self.last_launch, self.last_done
        self.last_launch = self.last_done = None
        if launch is None or done is None:
            return 0.0
        return max(done - launch, 0.0)


def _timed_allreduce_hook(timer, bucket):  # no annotations: DDP checks them, and they are strings here
    """DDP comm hook: average the bucket (through host memory when ``timer.staged``: a GPU worker in a gloo
    group), recording launch and completion times for :meth:`SyncStrategy._own_seconds`."""
    ctx = timer.ctx
    tensor = bucket.buffer()
    staged = tensor.detach().cpu() if timer.staged else tensor
    staged.div_(ctx.world_size)
    timer.last_launch = time.perf_counter()
    work = dist.all_reduce(staged, group=ctx.group, async_op=True)

    def done(future: torch.futures.Future) -> torch.Tensor:
        if timer.staged:
            tensor.copy_(future.value()[0].to(tensor.device))
        now = time.perf_counter()
        timer.last_done = now if timer.last_done is None else max(timer.last_done, now)
        return tensor

    return work.get_future().then(done)


class LocalSGDStrategy(_StaticStrategy):
    """Static equal partition; uniform model averaging every H = ``average_every`` local steps (parallel
    restarted SGD), BatchNorm statistics included: an interval is H steps and ends with the average (the
    last interval of an epoch may be shorter, so every epoch ends averaged)."""

    name = "local_sgd"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps_per_interval = int(_get(self.cfg, "average_every", 8))
        if self.steps_per_interval < 1:
            raise ValueError(f"trainer.average_every must be >= 1, got {self.steps_per_interval}")
        params = list(self.module.parameters())
        fits = bool(params) and params[0].device == self.ctx.comm_device
        self.use_torch_averager = fits and bool(_get(self.cfg, "torch_averager", True))
        self._merge_s = 0.0
        self._averages = 0

    def lr_scale(self, batch_size: int) -> float:
        """batch_size / ref_batch: 1.0 for the static batch B/W by default (ref_batch = B/W). Averaging W replicas
        that each stepped with lr on their own batch B/W moves the model like one sync step with lr on the union
        batch B (identical for H = 1 without momentum); scaling each worker by (B/W)/B would divide it by W."""
        return batch_size / self.ref_batch

    def end_interval(self, compute_seconds: float) -> None:
        """Average the replicas: parameters with torch's model-averaging all-reduce (the one
        ``PeriodicModelAverager`` uses) where they sit on the backend's device, and buffers, or everything
        through :func:`normalized_merge` (host-staged) otherwise."""
        super().end_interval(compute_seconds)
        started = time.perf_counter()
        if self.use_torch_averager:
            average_parameters(iter([p for p in self.module.parameters() if p.requires_grad]), self.ctx.group)
            average_buffers(self.module.buffers(), group=self.ctx.group, comm_device=self.ctx.comm_device)
        else:
            normalized_merge(self.module, 1.0, group=self.ctx.group, comm_device=self.ctx.comm_device)
        self._merge_s += time.perf_counter() - started
        self._averages += 1

    def end_epoch(self) -> None:
        self._gather_epoch_row(self.epoch, {"averages": self._averages, "merge_time": self._merge_s})
        self._averages, self._merge_s = 0, 0.0
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "average_every": self.steps_per_interval}


class AdaptiveStrategy(Strategy):
    """Dynamic scheduling + adaptive batch sizes + normalized merging (docs/scheduler.md)."""

    name = "adaptive"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        self.merge_interval = int(_get(cfg, "merge_interval", 512))
        self.multiple = int(_get(cfg, "batch_multiple", 8))
        self.batch_max = int(_get(cfg, "batch_max", 1024))
        self.damping = float(_get(cfg, "damping", 0.5))
        self.deadband = float(_get(cfg, "deadband", 0.05))
        self.speed_ema = float(_get(cfg, "speed_ema", 0.5))
        self.warmup_intervals = int(_get(cfg, "warmup_intervals", 1))
        self.log_intervals = bool(_get(cfg, "log_intervals", True))
        if not 0 < self.damping <= 1:
            raise ValueError(f"trainer.damping must be in (0, 1], got {self.damping}")
        if not 0 < self.speed_ema <= 1:
            raise ValueError(f"trainer.speed_ema must be in (0, 1], got {self.speed_ema}")
        check_batch_settings(self.total_batch, self.world, self.b_min, self.batch_max, self.multiple)
        self.sizes = initial_batch_sizes(self.total_batch, self.world, self.b_min, self.batch_max, self.multiple)
        self.cap = self.batch_max  # this worker's own cap: batch_max, or less after an out-of-memory
        self.speeds = [0.0] * self.world
        self.speed = 0.0
        self.intervals_done = 0
        self._timing_keys: list[tuple[int, int]] = []  # (row index, interval) whose idle/merge times are pending
        self._bounds: list[tuple[int, int]] = []
        self._order = torch.empty(0, dtype=torch.long)

    @property
    def batch_size(self) -> int:
        """This worker's current batch size b_i."""
        return self.sizes[self.rank]

    def lr_scale(self, batch_size: int) -> float:
        """batch_size / ref_batch, by default batch_size / (B / W): the linear scaling rule relative to an equal
        split, applied to the batch's real size (a short tail batch steps less). With merge weights
        p_i = u_i / Σ u_j every sample's gradient then carries lr / B to first order when the workers' update
        counts are equal — one sync step's weight (docs/scheduler.md, Learning rate and merge weights)."""
        return batch_size / self.ref_batch

    def on_out_of_memory(self) -> int:
        """Halve this worker's batch cap (and its batch); returns the new batch size.

        The cap travels with the next merge, so the controller gives the freed share to the others.
        """
        if self.batch_size <= 1:
            raise RuntimeError(f"worker {self.rank} ({self.ctx.device}) runs out of memory at batch size 1")
        self.cap = max(1, self.batch_size // 2)
        self.sizes[self.rank] = self.cap
        log.warning("worker %d (%s): out of memory, batch size capped at %d", self.rank, self.ctx.device, self.cap)
        return self.cap

    def start_epoch(self, epoch: int) -> int:
        self.epoch = epoch
        self._order = epoch_permutation(self.num_samples, self.seed, epoch)
        self._bounds = interval_bounds(self.num_samples, self.merge_interval, max(self.b_min, self.merge_interval // 2))
        return len(self._bounds)

    def claims(self, interval: int) -> Iterator[Claim]:
        """Claim batches of the interval through the store until it is used up (no collective)."""
        low, high = self._bounds[interval]
        claimer = IntervalClaimer(self.ctx.store, f"{self.prefix}/e{self.epoch}/i{interval}", high - low, self.b_min)
        while (span := claimer.claim(next_claim_size(claimer, self.rank, self.sizes, self.speeds, self.b_min))):
            start, end = span
            yield Claim(self._order[low + start:low + end], self.epoch + (low + start) / self.num_samples)

    def end_interval(self, compute_seconds: float) -> None:
        """The normalized merge: θ ← Σ_i p_i θ_i with p_i = u_i / Σ_j u_j (u = optimizer updates in the interval),
        then every worker computes the same next batch sizes from the merged speed table."""
        super().end_interval(compute_seconds)
        busy = self._compute + self._sleep
        if self._n > 0 and busy > 0:
            measured = self._n / busy
            self.speed = measured if self.speed <= 0 else self.speed_ema * measured + (1 - self.speed_ema) * self.speed
        k = len(_META_FIELDS)
        meta = torch.zeros(self.world * k, dtype=torch.float64)
        mine = (self._n, self.speed, self.batch_size, self._updates, busy, self.cap)
        meta[self.rank * k:(self.rank + 1) * k] = torch.tensor(mine, dtype=torch.float64)
        result = normalized_merge(self.module, float(self._updates), meta=meta, group=self.ctx.group,
                                  comm_device=self.ctx.comm_device)
        table = {field: [float(v) for v in column] for field, column in zip(_META_FIELDS, result.meta.view(self.world, k).T)}
        self.adapt(table)
        self._record(table, result)
        self._reset_counters()

    def adapt(self, table: Mapping[str, list[float]]) -> None:
        """Next batch sizes from the merged per-worker table (fields of ``_META_FIELDS``, one value per worker);
        every worker runs this on the same table and so computes the same sizes. The first
        ``warmup_intervals`` merges keep the sizes (restoring Σ b_i = B after an out-of-memory cap)."""
        used = [int(b) for b in table["b"]]
        caps = [int(c) for c in table["b_max"]]
        self.speeds = [float(s) for s in table["s"]]
        self.intervals_done += 1
        speeds = self.speeds if self.intervals_done > self.warmup_intervals else [0.0] * self.world
        self.sizes = next_batch_sizes(used, speeds, self.total_batch, self.b_min, caps, self.multiple, self.damping,
                                      self.deadband)
        if sum(self.sizes) != self.total_batch:
            log.warning("adaptive: the workers' batch caps (%s) leave a total batch of %d instead of batch_size=%d",
                        caps, sum(self.sizes), self.total_batch)

    def _record(self, table: dict[str, list[float]], result: Any) -> None:
        row: dict[str, float] = {"epoch": self.epoch, "interval": self.intervals_done,
                                 "merge_time": result.merge_s, "idle": result.idle_s}
        total = result.total_weight or 1.0
        for rank in range(self.world):
            for field in _META_FIELDS:
                row[f"{field}/{rank}"] = table[field][rank]
            row[f"p/{rank}"] = table["updates"][rank] / total
            row[f"b_next/{rank}"] = float(self.sizes[rank])
        # This worker's own idle and merge time go through the store so rank 0 can report everyone's.
        self.ctx.store.set(f"{self.prefix}/t/{self.intervals_done}/{self.rank}",
                           f"{result.idle_s:.6f},{result.merge_s:.6f}")
        self._rows.append(row)
        self._timing_keys.append((len(self._rows) - 1, self.intervals_done))
        if self.log_intervals and self.ctx.is_primary:
            log.info("merge %d (epoch %d): %s", self.intervals_done, self.epoch, format_row(row, self.world))

    def end_epoch(self) -> None:
        """Every interval ended with a merge, so the replicas are already identical."""
        self.epoch += 1

    def _complete_rows(self) -> list[dict[str, float]]:
        """Fill in every worker's idle/merge time (rank 0 only; read from the store)."""
        if self.ctx.is_primary:
            for row_index, interval in self._timing_keys:
                row = self._rows[row_index]
                for rank in range(self.world):
                    raw = self.ctx.store.get(f"{self.prefix}/t/{interval}/{rank}").decode()
                    idle, merge = (float(v) for v in raw.split(","))
                    row[f"idle/{rank}"], row[f"merge_time/{rank}"] = idle, merge
                row.pop("idle", None)
                row["merge_time"] = max(row[f"merge_time/{rank}"] for rank in range(self.world))
            self._timing_keys = []
        return self._rows

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "batch_sizes": list(self.sizes), "speeds": list(self.speeds),
                "speed": self.speed, "b_max": self.cap, "intervals_done": self.intervals_done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("name") != self.name:
            return
        self.intervals_done = int(state.get("intervals_done", 0))
        if int(state.get("world_size", -1)) != self.world:
            log.warning("adaptive: checkpoint has %s workers, this run %d: batch sizes start from an equal split",
                        state.get("world_size"), self.world)
            return
        self.sizes = [int(b) for b in state["batch_sizes"]]
        self.speeds = [float(s) for s in state["speeds"]]
        self.speed = self.speeds[self.rank]
        # Only rank 0's cap is in the checkpoint (rank 0 saves it); others keep the configured limit.
        if self.rank == 0:
            self.cap = int(state.get("b_max", self.batch_max))


def build_strategy(trainer_cfg: Any, ctx: WorkerContext, model: nn.Module, optimizer: Any, num_samples: int,
                   batch_size: int, seed: int) -> Strategy:
    """The strategy named by ``trainer_cfg.name`` (adaptive | sync | local_sgd)."""
    name = str(_get(trainer_cfg, "name", "adaptive"))
    classes = {"adaptive": AdaptiveStrategy, "sync": SyncStrategy, "local_sgd": LocalSGDStrategy}
    if name not in classes:
        raise ValueError(f"unknown trainer.name {name!r}; valid: {', '.join(STRATEGIES)}")
    if batch_size < ctx.world_size and name != "adaptive":
        raise ValueError(f"batch_size {batch_size} is smaller than the number of workers {ctx.world_size}")
    if name == "sync" and ctx.world_size > 1 and any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                                     for m in model.modules()):
        warnings.warn("trainer=sync: BatchNorm statistics are per replica (DDP broadcasts rank 0's buffers)",
                      stacklevel=2)
    return classes[name](trainer_cfg, ctx, model, optimizer, num_samples, batch_size, seed)


# ---------------------------------------------------------------------------------------------- text


def format_row(row: Mapping[str, float], world: int) -> str:
    """One merge interval on one line: per worker b, s, n, p, updates (and idle when known)."""
    parts = []
    for rank in range(world):
        text = (f"w{rank}: b={row.get(f'b/{rank}', 0):.0f} s={row.get(f's/{rank}', 0):.1f}/s "
                f"n={row.get(f'n/{rank}', 0):.0f} p={row.get(f'p/{rank}', 0):.2f} "
                f"u={row.get(f'updates/{rank}', 0):.0f}")
        if f"idle/{rank}" in row:
            text += f" idle={row[f'idle/{rank}'] * 1000:.0f}ms"
        parts.append(text)
    merge = row.get("merge_time")
    return " | ".join(parts) + (f" | merge {merge * 1000:.0f}ms" if merge is not None else "")


def _worker_totals(rows: list[Mapping[str, float]], rank: int) -> dict[str, float]:
    samples = sum(row.get(f"n/{rank}", 0.0) for row in rows)
    updates = sum(row.get(f"updates/{rank}", 0.0) for row in rows)
    last = rows[-1] if rows else {}
    return {"samples": samples, "updates": updates, "mean_batch": samples / max(updates, 1.0),
            "last_batch": last.get(f"b_next/{rank}", last.get(f"b/{rank}", 0.0)), "speed": last.get(f"s/{rank}", 0.0),
            "idle_s": sum(row.get(f"idle/{rank}", 0.0) for row in rows),
            "merge_s": sum(row.get(f"merge_time/{rank}", row.get("merge_time", 0.0)) for row in rows)}


def scheduler_report(rows: list[Mapping[str, float]], world: int, name: str, devices: list[str],
                     slowdowns: list[float]) -> dict[str, Any]:
    """The scheduling figures of a run for metrics.json: ``strategy``, ``merges`` (adaptive merges or local_sgd
    averages; 0 for sync, which all-reduces gradients every step), ``simulated_slowdown`` and per worker
    ``rank``, ``device``, ``samples``, ``updates``, ``mean_batch``, ``last_batch``, ``speed`` (samples/s),
    ``idle_s`` (waiting in merges) and ``merge_s``."""
    merges = len(rows) if name == "adaptive" else int(sum(row.get("averages/0", 0.0) for row in rows))
    workers = []
    for rank in range(world):
        totals = _worker_totals(rows, rank)
        workers.append({"rank": rank, "device": devices[rank] if rank < len(devices) else "?",
                        **{key: round(float(value), 4) for key, value in totals.items()}})
    return {"strategy": name, "merges": merges,
            "simulated_slowdown": slowdowns if any(s != 1.0 for s in slowdowns) else None, "workers": workers}


def summarize(rows: list[Mapping[str, float]], world: int, name: str = "adaptive", note: str = "") -> str:
    """End-of-run table per worker: samples, share, updates, mean batch, last speed, idle and merge time."""
    if not rows:
        return f"{name}: no scheduling rows recorded"
    lines = [f"scheduler {name}: {len(rows)} rows, {world} workers" + (f" ({note})" if note else ""),
             f"{'worker':>6} {'samples':>9} {'share':>6} {'updates':>8} {'mean b':>7} {'last b':>7} "
             f"{'speed/s':>9} {'idle s':>8} {'merge s':>8}"]
    totals = [_worker_totals(rows, rank) for rank in range(world)]
    everyone = sum(t["samples"] for t in totals) or 1.0
    for rank, t in enumerate(totals):
        lines.append(f"{rank:>6} {t['samples']:>9.0f} {t['samples'] / everyone:>6.2f} {t['updates']:>8.0f} "
                     f"{t['mean_batch']:>7.1f} {t['last_batch']:>7.0f} {t['speed']:>9.1f} {t['idle_s']:>8.2f} "
                     f"{t['merge_s']:>8.2f}")
    return "\n".join(lines)
