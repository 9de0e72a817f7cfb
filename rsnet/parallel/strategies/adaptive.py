"""``adaptive``: dynamic scheduling, speed-proportional batch sizes, normalized merging every few rounds of B."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rsnet.parallel.batching import (IntervalClaimer, coarse_multiple_warning, epoch_permutation, may_claim_ahead,
                                    may_claim_next, updated_speed)
from rsnet.parallel.merge import MergeResult, broadcast_module, exchange_table, merge_share, normalized_merge
from rsnet.parallel.schedule import Schedule, describe
from rsnet.parallel.schedule_rules import MERGE_WEIGHTS, ScheduleSettings, next_interval
from rsnet.parallel.speed_probe import SpeedProbe
from rsnet.parallel.strategies.adaptive_probes import SpeedProbing
from rsnet.parallel.strategies.base import Claim, Strategy, register_strategy
from rsnet.parallel.strategies.reports import format_row

log = logging.getLogger(__name__)

# Per-worker fields of the merge's meta vector ("w": merge weight; "comm": seconds of its previous merge).
META_FIELDS = ("n", "s", "b", "updates", "compute", "batch_max", "w", "comm")
# A step that runs longer than this while the prefetch thread waits to claim the next batch gets a log line (the
# claim still waits for it: claiming ahead would hold samples that the others might train before the merge).
SLOW_STEP_LOG_S = 30.0


@dataclass
class Interval:
    """One merge interval of an epoch as this worker trains it: planned by ``intervals()`` (main thread), claimed
    from by ``claims()`` (prefetch thread), closed by ``end_interval()``. ``low:high``: its positions in the epoch's
    permutation; ``warmup_*``: samples and seconds of its first steps at a batch size (one-time costs, left out of
    the speed); ``stopped``: the loop stopped taking batches (an error), so the prefetch thread claims no more."""

    low: int
    high: int
    rounds: int
    claim_key: str
    warmup_samples: int = 0
    warmup_seconds: float = 0.0
    stopped: bool = False


def check_settings(trainer: Mapping[str, Any], batch_size: int, workers: int) -> ScheduleSettings:
    """Every ``trainer=adaptive`` setting checked before anything is built (ValueError naming the setting); returns the
    schedule's settings."""
    merge_weight, elastic, speed_ema = trainer["merge_weight"], trainer["elastic"], trainer["speed_ema"]
    if merge_weight not in MERGE_WEIGHTS:
        raise ValueError(f"trainer.merge_weight={merge_weight!r}: use one of {', '.join(MERGE_WEIGHTS)}")
    if not 0 < float(speed_ema) <= 1:
        raise ValueError(f"trainer.speed_ema must be in (0, 1], got {speed_ema}")
    if not float(trainer["probe_timeout_s"]) > 0:
        raise ValueError(f"trainer.probe_timeout_s={trainer['probe_timeout_s']}: must be > 0 (seconds a speed probe "
                         "may run before its worker is left out)")
    if not 0 < float(elastic) <= 1:
        raise ValueError(f"trainer.elastic={elastic}: must be in (0, 1] (1: every replica becomes the merged model)")
    settings = ScheduleSettings.from_config(trainer, batch_size)
    settings.check_workers(workers)
    return settings


@register_strategy
class AdaptiveStrategy(SpeedProbing, Strategy):
    """Dynamic scheduling + adaptive batch sizes + normalized merging (docs/scheduler.md); what the workers agree
    on after every merge (who trains, B, the sizes, the cadence) is a :class:`~rsnet.parallel.schedule.Schedule`."""

    name = "adaptive"
    rows_are_merges = True

    @classmethod
    def check_config(cls, trainer: Mapping[str, Any], batch_size: int, workers: int) -> None:
        super().check_config(trainer, batch_size, workers)
        check_settings(trainer, batch_size, workers)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        self.schedule = Schedule(check_settings(cfg, self.total_batch, self.world), self.world)
        self.speed_ema = float(cfg["speed_ema"])
        self.log_intervals = bool(cfg["log_intervals"])
        self.merge_weight = str(cfg["merge_weight"])
        self.elastic = float(cfg["elastic"])
        self.probe_timeout_s = float(cfg["probe_timeout_s"])
        coarse = coarse_multiple_warning(self.schedule.total_batch, self.world, self.schedule.multiple)
        if coarse and self.ctx.is_primary:
            log.warning(coarse)
        self.speed = 0.0
        self._probe: SpeedProbe | None = None  # this worker's speed probe, while it runs (or until merge 0)
        self._comm_s = 0.0  # this worker's communication time in its last merge of the model
        self._own_times: list[tuple[float, float]] = []  # this worker's (idle, merge) seconds of the epoch's merges
        self._order = torch.empty(0, dtype=torch.long)  # the epoch's permutation of the samples
        self._interval = Interval(0, 0, self.schedule.rounds, self._claim_key(0, 0))  # the one being trained
        # after_step and stop_claiming notify the prefetch thread waiting to claim
        self._stepped = threading.Condition()
        self._trained_sizes: set[int] = set()  # batch sizes trained (a size's first step is no measure of speed)
        self._resume_position = 0  # where the next epoch starts: the commit's position, for the epoch it was made in

    @property
    def sizes(self) -> list[int]:
        """Every worker's batch size (0 for a worker left out)."""
        return self.schedule.sizes

    @property
    def batch_size(self) -> int:
        """This worker's current batch size b_i."""
        return self.sizes[self.rank]

    @property
    def batch_max(self) -> int:
        """This worker's ``batch_max`` (lower after an out-of-memory)."""
        return self.schedule.batch_maxes[self.rank]

    def lr_scale(self, batch_size: int) -> float:
        """batch_size / ref_batch, ref_batch = ``batch_size`` / W_active unless configured: each sample's gradient
        carries lr / batch_size after a uniform merge (docs/scheduler.md)."""
        configured = self.cfg.get("ref_batch")
        reference = float(configured) if configured else max(self.total_batch, 1) / max(self.schedule.workers, 1)
        return batch_size / reference

    def follow_lr(self, lr_ratio: Callable[[float], float], epochs: int) -> None:
        """Intervals grow as the lr decays (:func:`~rsnet.parallel.schedule_rules.lr_rounds`)."""
        self.schedule.follow_lr(lr_ratio, epochs)

    def work_shares(self) -> list[float]:
        """The workers' measured speeds (0 for a worker left out); equal while no speed is known."""
        speeds = self.schedule.speeds_of_active()
        return speeds if sum(speeds) > 0 else [1.0] * self.world

    def on_out_of_memory(self) -> int:
        """Halve this worker's ``batch_max`` and batch until the next merge; returns the new batch size."""
        if self.batch_size <= 1:
            raise RuntimeError(f"worker {self.rank} ({self.ctx.device}) runs out of memory at batch size 1")
        self.schedule.lower_batch_max(self.rank, max(1, self.batch_size // 2))
        log.warning("worker %d (%s): out of memory, batch_max lowered to %d", self.rank, self.ctx.device,
                    self.batch_max)
        return self.batch_max


    def intervals(self, epoch: int) -> Iterator[int]:
        """The epoch's merge intervals, each planned when the one before it has merged (before the run's first: the
        exchange of the speed probes, :meth:`_start`)."""
        self.epoch = epoch
        if not self.schedule.started:
            self._start()
        self._order = epoch_permutation(self.num_samples, self.seed, epoch)
        start, index, self._resume_position = self._resume_position, 0, 0
        while start < self.num_samples:
            size = self.schedule.interval_at(epoch + start / self.num_samples, self.num_samples - start,
                                             self.num_samples)
            low, high = next_interval(start, self.num_samples, size, max(self.schedule.settings.batch_min, size // 2))
            self._interval = Interval(low, high, max(size // self.schedule.total_batch, 1),
                                      self._claim_key(epoch, index))
            yield index
            start = high
            index += 1

    def _start(self) -> None:
        """Merge 0: every worker waits for its own speed probe, then at most :data:`PROBE_GRACE_STEPS` of the first
        probe's steps for the others' (the store counts the probes done); the speeds are all-reduced, the workers whose
        probe is still running are pending (:meth:`Schedule.start`), and every replica becomes rank 0's. Alone, a
        worker needs no speed."""
        if self.world == 1:
            self.schedule.started = True
            return
        if self._probe is None:
            raise RuntimeError("adaptive: call strategy.probe_speed(step) before the first interval: with several "
                               "workers each needs a speed before the first batch sizes")
        self._await_probes()
        self._take_probe_result()
        k = len(META_FIELDS)
        meta = torch.zeros(self.world * k, dtype=torch.float64)
        meta[self.rank * k + META_FIELDS.index("s")] = self.speed
        meta[self.rank * k + META_FIELDS.index("batch_max")] = self.batch_max
        result = exchange_table(meta, comm_device=self.ctx.comm_device)
        table = {field: [float(v) for v in column]
                 for field, column in zip(META_FIELDS, result.meta.view(self.world, k).T)}
        if all(speed < 0 for speed in table["s"]):
            raise RuntimeError("every worker's speed probe failed or ran past trainer.probe_timeout_s (each worker's "
                               "log line says which): no worker can train")
        # The replicas start from rank 0's weights, whatever each process drew or loaded before.
        broadcast_module(self.model, 0, comm_device=self.ctx.comm_device)
        self.schedule.batch_maxes = [max(int(c), 1) for c in table["batch_max"]]
        for note in describe(self.schedule.start(table["s"])):
            if self.ctx.is_primary:
                log.info("adaptive: %s", note)
        if self.ctx.is_primary:
            log.info("adaptive: speed probes (samples/s): %s; batch sizes %s", ", ".join(
                f"w{rank} {speed:.1f}" for rank, speed in enumerate(table["s"])), self.sizes)


    def claims(self, interval: int) -> Iterator[Claim]:
        """Claim batches of the interval through the store until it is used up (no collective): ahead of the current
        step where :func:`may_claim_ahead` allows, else after it where :func:`may_claim_next` does."""
        current = self._interval
        if not self.schedule.active[self.rank] or current.stopped:
            return
        claimer = IntervalClaimer(self.ctx.store, current.claim_key, current.high - current.low,
                                  self.schedule.claim_min)
        speeds = self.schedule.speeds_of_active()
        speeds[self.rank] = self.speed
        claimed = 0
        while True:
            ahead = claimed > 0 and may_claim_ahead(claimer, self.rank, self.sizes, speeds)
            if claimed and not ahead and not self._wait_for_steps(current, claimed):
                return
            if not ahead and not may_claim_next(claimer, self.rank, self.sizes, speeds):
                return
            span = claimer.claim(self.batch_size)
            if span is None:
                return
            claimed += 1
            start, end = span
            yield Claim(self._order[current.low + start:current.low + end],
                        self.epoch + (current.low + start) / self.num_samples)

    def stop_claiming(self) -> None:
        """The loop takes no more batches of this interval (an error): a prefetch thread waiting to claim returns."""
        with self._stepped:
            self._interval.stopped = True
            self._stepped.notify_all()

    @property
    def commits_merges(self) -> bool:
        """With others, every merge is a commit point: the run can go on from it (:meth:`resume_within_epoch`)."""
        return self.world > 1

    @property
    def epoch_merged(self) -> int:
        """At a merge: the samples of the epoch merged into the model, the positions of its order up to the end of the
        interval just merged."""
        return self._interval.high

    def resume_within_epoch(self, position: int) -> None:
        """The next epoch starts at ``position`` of its permutation: the samples before it are in the model already
        (a commit's, :mod:`rsnet.engine.merge_commit`); the rest is split among this run's workers."""
        self._resume_position = int(position)

    @property
    def fixed_batch_sizes(self) -> bool:
        """Alone, a worker claims its batch (the epoch's rest joined); with others, claims of any size."""
        return self.world == 1

    def times_step(self, batch_size: int) -> bool:
        """Also the first step at a batch size this worker has not trained: its time is left out of the speed."""
        return self.needs_step_seconds or batch_size not in self._trained_sizes

    def after_step(self, batch_size: int, seconds: float | None) -> None:
        super().after_step(batch_size, seconds)
        with self._stepped:
            self._stepped.notify_all()

    def _timed_step(self, batch_size: int, seconds: float, own: float) -> None:
        # The first step at a size carries one-time costs (allocations, cuDNN's autotuning: seconds on a GPU), which
        # would make a worker whose batch is resized at a merge look slow, and be resized again at the next.
        if batch_size not in self._trained_sizes:
            self._trained_sizes.add(batch_size)
            self._interval.warmup_samples += batch_size
            self._interval.warmup_seconds += seconds

    def _wait_for_steps(self, interval: Interval, count: int) -> bool:
        """Block (the prefetch thread) until this worker has trained ``count`` batches of ``interval``; False where
        the loop stopped taking batches meanwhile. A step longer than :data:`SLOW_STEP_LOG_S` is logged once."""
        with self._stepped:
            done = lambda: self._updates >= count or interval.stopped  # noqa: E731 - the condition's predicate
            if not self._stepped.wait_for(done, timeout=SLOW_STEP_LOG_S):
                log.warning("worker %d (%s): a step has run for more than %.0f s; its next claim waits for it",
                            self.rank, self.ctx.device, SLOW_STEP_LOG_S)
                self._stepped.wait_for(done)
            return not interval.stopped

    def _claim_key(self, epoch: int, interval: int) -> str:
        """The store counter the workers claim positions of ``epoch``'s ``interval`` from."""
        return f"{self.prefix}/e{epoch}/i{interval}"

    def _merge_weight(self) -> float:
        """w_i of the merge: 1 (uniform over the active workers, the default), the interval's updates or samples."""
        if not self.schedule.active[self.rank]:
            return 0.0
        return {"uniform": 1.0, "updates": float(self._updates), "samples": float(self._n)}[self.merge_weight]

    def end_interval(self, compute_seconds: float) -> None:
        """The normalized merge θ ← Σ_i p_i θ_i (elastic: each replica moves α of the way), then every worker moves the
        schedule on from the same merged table (one active worker: only the table). A pending worker's probe speed
        travels in the table once measured; a worker admitted then gets the merged model in a second merge."""
        super().end_interval(compute_seconds)
        busy, interval = self._compute, self._interval
        self._take_probe_result()
        # Without the first step at each batch size (its one-time costs are no measure of the speed).
        self.speed = updated_speed(self.speed, self._n - interval.warmup_samples, busy - interval.warmup_seconds,
                                   self.speed_ema)
        mine = {"n": self._n, "s": self.speed, "b": self.batch_size, "updates": self._updates, "compute": busy,
                "batch_max": self.batch_max, "w": self._merge_weight(), "comm": self._comm_s}
        k = len(META_FIELDS)
        meta = torch.zeros(self.world * k, dtype=torch.float64)
        meta[self.rank * k:(self.rank + 1) * k] = torch.tensor([mine[f] for f in META_FIELDS], dtype=torch.float64)
        trained = self._active_ranks()
        result = normalized_merge(self.model, mine["w"], meta=meta, comm_device=self.ctx.comm_device,
                                  members=trained, elastic=self.elastic)
        if len(trained) > 1 and self.rank in trained:
            self._comm_s = max(result.merge_s - result.idle_s, 0.0)
        if self.ctx.is_primary and self.world > 1:  # every worker has claimed its last batch: the counters are done
            self.ctx.store.delete_key(interval.claim_key)
        columns = result.meta.view(self.world, k).T
        table = {field: [float(v) for v in column] for field, column in zip(META_FIELDS, columns)}
        was_active = self.schedule.active[self.rank]
        self.adapt(table)
        if self.schedule.joined:  # the admitted workers start from the trained model (their weight: 0)
            normalized_merge(self.model, float(was_active), comm_device=self.ctx.comm_device,
                             members=self._active_ranks())
        self._record(table, result, interval.rounds, trained)
        self._reset_counters()

    def _active_ranks(self) -> list[int]:
        """The workers that train now."""
        return [rank for rank in range(self.world) if self.schedule.active[rank]]

    def adapt(self, table: Mapping[str, list[float]]) -> None:
        """Move the schedule on from the merged per-worker table (``META_FIELDS``), alike on every worker; the primary
        logs what changed."""
        for note in describe(self.schedule.update(table)):
            if self.ctx.is_primary:
                log.info("adaptive: %s", note)

    def _record(self, table: dict[str, list[float]], result: MergeResult, rounds: int, members: list[int]) -> None:
        """The merge's row: every worker's table, its share p_i in the merge of ``members``, its next batch size."""
        row: dict[str, float] = {"epoch": self.epoch, "interval": self.schedule.merges, "merge_time": result.merge_s,
                                 "rounds": rounds, "B": self.schedule.total_batch}
        total = sum(table["w"][rank] for rank in members)
        for rank in range(self.world):
            for field in META_FIELDS:
                row[f"{field}/{rank}"] = table[field][rank]
            row[f"p/{rank}"] = merge_share(table["w"][rank], total, len(members)) if rank in members else 0.0
            row[f"b_next/{rank}"] = float(self.sizes[rank])
            row[f"active/{rank}"] = float(self.schedule.active[rank])
        self._rows.append(row)
        self._own_times.append((result.idle_s, result.merge_s))  # everyone's are gathered at the end of the epoch
        if self.log_intervals and self.ctx.is_primary and self.world > 1:
            log.info("merge %d (epoch %d): %s", self.schedule.merges, self.epoch, format_row(row, self.world))

    def end_epoch(self) -> None:
        """Share the epoch's idle and merge times of every worker; where the active replicas may differ (elastic
        merges) average them, so that evaluation and checkpoints see one model. The workers left out or pending get
        no copy (they evaluate nothing), unless the primary, which saves the checkpoints, is one of them."""
        if self.world > 1:
            active = self._active_ranks()
            if self.elastic < 1.0 and len(active) > 1:  # the replicas may differ: one model for evaluation
                normalized_merge(self.model, 1.0, comm_device=self.ctx.comm_device, members=active)
            if not self.schedule.active[0]:  # the primary, left out, saves the checkpoints
                broadcast_module(self.model, active[0], comm_device=self.ctx.comm_device, members=[0, active[0]])
            self._gather_times()
        self._own_times = []
        self.epoch += 1

    def _gather_times(self) -> None:
        times = torch.zeros(len(self._own_times), self.world, 2, dtype=torch.float64)
        if self._own_times:
            times[:, self.rank] = torch.tensor(self._own_times, dtype=torch.float64)
        reduced = times.to(self.ctx.comm_device)
        dist.all_reduce(reduced)
        rows = self._rows[len(self._rows) - len(self._own_times):]
        for row, row_times in zip(rows, reduced.cpu()):
            for rank, (idle, merge) in enumerate(row_times.tolist()):
                row[f"idle/{rank}"], row[f"merge_time/{rank}"] = idle, merge
            row["merge_time"] = float(row_times[:, 1].max())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self.schedule.state_dict(), "speed": self.speed,
                "batch_max": self.batch_max}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("name") != self.name:
            return
        if int(state.get("world_size", -1)) != self.world:
            log.warning("adaptive: checkpoint has %s workers, this run %d: batch sizes start from an equal split",
                        state.get("world_size"), self.world)
            self.schedule.merges = int(state.get("merges", 0))  # the merges go on counting (rows, TensorBoard steps)
            return
        self.schedule.load_state_dict(state)
        self.speed = self.schedule.speeds[self.rank]
        # Only rank 0's batch_max is in the checkpoint (rank 0 saves it); others keep the configured one.
        if self.rank == 0 and "batch_max" in state:
            self.schedule.batch_maxes[0] = int(state["batch_max"])

