"""What every strategy shares (the claim it hands the loop, per-step counters and step times, stats rows, reports,
state), and the static strategies' equal shares."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rsnet.parallel.batching import check_batch_per_worker, static_batches, static_partition
from rsnet.parallel.strategies.reports import scheduler_report, slowdown_note, summarize
from rsnet.parallel.worker_setup import WorkerContext
from rsnet.registry import Registry

log = logging.getLogger(__name__)

# Strategies built in this process: each gets its own key prefix in the c10d store, apart from an earlier run's keys.
_instances = 0


def _shared_prefix(name: str, number: int, ctx: WorkerContext) -> str:
    """The strategy's key prefix in the c10d store, rank 0's on every worker (a collective): a worker that built
    another number of strategies than rank 0 must still claim from the same counters."""
    if ctx.world_size > 1 and dist.is_initialized():
        shared = torch.tensor([number], dtype=torch.int64, device=ctx.comm_device)
        dist.broadcast(shared, src=0)
        number = int(shared.item())
    return f"rsnet/{name}{number}"


@dataclass(frozen=True)
class Claim:
    """A batch this worker trains on: its sample indices, and ``position``, where it starts on the run's shared clock
    (epochs; drives the lr schedule, warm-up and ramp-up)."""

    indices: torch.Tensor
    position: float


class Strategy:
    """A training strategy: how the workers share the batches and when they communicate (``trainer=<name>``).

    The trainer's loop drives it, the same on every worker: ``intervals(epoch)`` plans the epoch's intervals,
    ``claims(interval)`` yields the batches a worker trains, ``after_step`` counts each step, ``end_interval`` is the
    communication point (a merge, an average) and ``end_epoch`` ends the epoch; every worker must issue the same
    collectives in the same order. ``check_config`` checks the strategy's ``trainer.*`` settings before any worker
    starts. The base class keeps the shared bookkeeping: per-step counters and step times, stats rows; ``model`` is
    what the loop calls for the forward pass (``sync``: its DistributedDataParallel wrapper). A new strategy
    subclasses it (or ``StaticStrategy``, ``SyncStrategy``) and registers itself with ``@register_strategy``."""

    name = "base"
    rows_are_merges = False  # each stats row is one merge (adaptive); else rows count averages in ``averages/0``

    def __init__(self, trainer_cfg: Any, ctx: WorkerContext, model: nn.Module, num_samples: int, batch_size: int,
                 seed: int) -> None:
        global _instances
        _instances += 1
        self.cfg, self.ctx, self.model = trainer_cfg, ctx, model
        self.num_samples, self.total_batch, self.seed = int(num_samples), int(batch_size), int(seed)
        self.world, self.rank = ctx.world_size, ctx.rank
        self.prefix = _shared_prefix(self.name, _instances, ctx)
        self.batch_min = int(trainer_cfg["batch_min"])
        # lr of a batch of b = lr x b / ref_batch; default ref_batch = B / world, the batch of an equal split.
        ref_batch = trainer_cfg.get("ref_batch")  # sync has none: its lr scale is always 1
        self.ref_batch = float(ref_batch) if ref_batch else max(int(batch_size), 1) / max(ctx.world_size, 1)
        self.epoch = 0
        self._rows: list[dict[str, float]] = []
        self._reported = 0
        self._reset_counters()

    @classmethod
    def check_config(cls, trainer: Mapping[str, Any], batch_size: int, workers: int) -> None:
        """Refuse this strategy's out-of-range ``trainer.*`` settings (ValueError naming the setting)."""
        if int(trainer["batch_min"]) < 1:
            raise ValueError(f"trainer.batch_min={trainer['batch_min']}: must be >= 1")
        ref_batch = trainer.get("ref_batch")
        if ref_batch is not None and not ref_batch > 0:
            raise ValueError(f"trainer.ref_batch={ref_batch}: must be > 0 (or null: the batch of an equal split)")

    @classmethod
    def check_setup(cls, ctx: WorkerContext, model: nn.Module, batch_size: int) -> None:
        """Refuse (or warn about) a setup this strategy cannot train; runs before the strategy is built."""

    @property
    def needs_step_seconds(self) -> bool:
        """Whether :meth:`after_step` needs every step's own time; otherwise the loop may time steps asynchronously."""
        return False

    @property
    def wants_probe(self) -> bool:
        """Whether :meth:`probe_speed` should be given a probe step (adaptive, before its speed is known)."""
        return False

    def probe_speed(self, step: Callable[[int], None]) -> None:
        """Time ``step`` (one training step on that many synthetic samples, on a copy of the model) where the strategy
        needs this worker's speed before it trains; nothing here."""

    def times_step(self, batch_size: int) -> bool:
        """Whether the loop must time the next step, on ``batch_size`` samples, on its own (a host sync)."""
        return self.needs_step_seconds

    @property
    def fixed_batch_sizes(self) -> bool:
        """Whether this worker's batches take only a few sizes, fixed for the run (``compile=true``)."""
        return False

    def start_epoch(self, epoch: int) -> int:  # pragma: no cover - abstract
        """Plan ``epoch``; returns its number of intervals."""
        raise NotImplementedError

    def intervals(self, epoch: int) -> Iterator[int]:
        """The indices of ``epoch``'s intervals, each ended (:meth:`end_interval`) before the next is asked for."""
        yield from range(self.start_epoch(epoch))

    def claims(self, interval: int) -> Iterator[Claim]:  # pragma: no cover - abstract
        """This worker's batches of ``interval`` of the current epoch, in order."""
        raise NotImplementedError

    @property
    def commits_merges(self) -> bool:
        """Whether the run can go on from this strategy's merges within an epoch (a commit, ``checkpoints/commit.pt``);
        else only from an epoch's end."""
        return False

    @property
    def epoch_merged(self) -> int:
        """At a merge: the samples of the current epoch merged into the model (where :attr:`commits_merges`)."""
        return 0

    def resume_within_epoch(self, position: int) -> None:
        """Start the next epoch at ``position`` of its order: only a strategy that :attr:`commits_merges` can."""
        if position:
            raise ValueError(f"trainer={self.name} cannot go on from within an epoch (a commit.pt of "
                             "trainer=adaptive); resume with trainer=adaptive, or from last.pt")

    def stop_claiming(self) -> None:
        """The loop takes no more of the interval's batches (an error stopped it); nothing to release here."""

    def follow_lr(self, lr_ratio: Callable[[float], float], epochs: int) -> None:
        """``lr_ratio(position)``: the scheduled lr over its peak, for strategies whose cadence follows the lr."""

    def lr_scale(self, batch_size: int) -> float:
        """Factor on the scheduled lr for a step on ``batch_size`` samples (1.0: DDP averages the gradients)."""
        return 1.0

    def after_step(self, batch_size: int, seconds: float | None) -> None:
        """Count the step; ``seconds``: its time when the loop timed it (see :attr:`needs_step_seconds`)."""
        self._n += int(batch_size)
        self._updates += 1
        if seconds is not None:
            seconds = float(seconds)
            self._timed_step(int(batch_size), seconds, max(self._own_seconds(seconds), 0.0))

    def _timed_step(self, batch_size: int, seconds: float, own: float) -> None:
        """A step of ``seconds``, ``own`` of them this worker's compute, for strategies that measure step by step."""

    def end_interval(self, compute_seconds: float) -> None:
        """The interval's communication point (a collective, or nothing); ``compute_seconds``: its step time."""
        self._compute += float(compute_seconds)

    def end_epoch(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _own_seconds(self, seconds: float) -> float:
        """This worker's own compute time within a step of ``seconds`` (overridden where a step can wait)."""
        return seconds

    def work_shares(self) -> list[float]:
        """Each worker's share of the work split outside training (evaluation), the same on every worker: equal here."""
        return [1.0] * self.world

    def on_out_of_memory(self) -> int:
        """Called after a CUDA out-of-memory error; returns the batch size to retry with."""
        raise RuntimeError(f"{self.name}: out of memory with static batches; lower batch_size")

    def stats(self) -> list[dict[str, float]]:
        """Log rows recorded since the previous call (on rank 0 with every worker's figures, ``b/<rank>``, ...)."""
        rows = self._complete_rows()
        new, self._reported = rows[self._reported:], len(rows)
        return list(new)

    def summary(self) -> str:
        """A text summary of the run's scheduling figures (for the end of training)."""
        return summarize(self._complete_rows(), self.world, self.name, slowdown_note(self._slowdowns()))

    def report(self) -> dict[str, Any]:
        """The run's scheduling figures per worker, for metrics.json (see :func:`scheduler_report`)."""
        return scheduler_report(self._complete_rows(), self.world, self.name, [str(d) for d in self.ctx.devices],
                                self._slowdowns(), self.rows_are_merges)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "epoch": self.epoch, "world_size": self.world}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("name") not in (None, self.name):
            log.warning("strategy state of %r loaded into %r: ignoring it", state.get("name"), self.name)
            return
        self.epoch = int(state.get("epoch", 0))

    def _reset_counters(self) -> None:
        self._n, self._updates, self._compute = 0, 0, 0.0

    def _complete_rows(self) -> list[dict[str, float]]:
        return self._rows

    def _slowdowns(self) -> list[float]:
        return list(self.ctx.slowdowns) or [self.ctx.slowdown]


class StaticStrategy(Strategy):
    """Equal static shares (DistributedSampler-style) cut into intervals of ``steps_per_interval`` batches.
    The clock of step k of an epoch is k·B / N_padded: the same on every worker."""

    steps_per_interval = 1

    @classmethod
    def check_setup(cls, ctx: WorkerContext, model: nn.Module, batch_size: int) -> None:
        check_batch_per_worker(batch_size, ctx.world_size)

    @property
    def fixed_batch_sizes(self) -> bool:
        """A static share is cut into batches of one size and the epoch's last one, the same every epoch."""
        return True

    def start_epoch(self, epoch: int) -> int:
        self.epoch = epoch
        shard = static_partition(self.num_samples, self.seed, epoch, self.rank, self.world)
        self._batches = static_batches(shard, self._static_batch(), min(self.batch_min, self._static_batch()))
        self._padded, self._step_samples = len(shard) * self.world, self._static_batch() * self.world
        return -(-len(self._batches) // self.steps_per_interval)

    def claims(self, interval: int) -> Iterator[Claim]:
        first = interval * self.steps_per_interval
        for step in range(first, min(first + self.steps_per_interval, len(self._batches))):
            position = step * self._step_samples / self._padded
            yield Claim(self._batches[step], self.epoch + position)

    def _static_batch(self) -> int:
        return max(1, self.total_batch // self.world)

    def _gather_epoch_row(self, epoch: int, extra: Mapping[str, float] | None = None) -> None:
        """One row per epoch with every worker's counters (a collective)."""
        busy = self._compute
        mine = {"n": self._n, "updates": self._updates, "compute": busy, "s": self._n / busy if busy > 0 else 0.0,
                "b": self._static_batch(), **(extra or {})}
        everyone: list[Any] = [None] * self.world
        dist.all_gather_object(everyone, mine)
        total = sum(r["n"] for r in everyone) or 1
        row: dict[str, float] = {"epoch": epoch, "interval": epoch + 1}
        for rank, r in enumerate(everyone):
            for key, value in r.items():
                row[f"{key}/{rank}"] = float(value)
            row[f"p/{rank}"] = r["n"] / total
        self._rows.append(row)
        self._reset_counters()


STRATEGIES: Registry[type[Strategy]] = Registry("trainer.name", key="name")  # filled by @register_strategy
register_strategy = STRATEGIES.register  # class decorator: a strategy registers itself under its ``name``
"""Class decorator: a strategy registers itself in ``STRATEGIES`` under its ``name`` (the value of ``trainer.name``);
a name taken by another class is refused."""
