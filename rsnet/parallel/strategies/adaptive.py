"""``adaptive``: dynamic scheduling, speed-proportional batch sizes, normalized merging every interval."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from rsnet.parallel.batching import (
    IntervalClaimer,
    check_batch_settings,
    coarse_multiple_warning,
    epoch_permutation,
    initial_batch_sizes,
    interval_bounds,
    next_batch_sizes,
    next_claim_size,
    updated_speed,
)
from rsnet.parallel.merge import MergeResult, normalized_merge
from rsnet.parallel.strategies.base import Claim, Strategy
from rsnet.parallel.strategies.reports import format_row

log = logging.getLogger(__name__)

# Per-worker fields carried in the merge's meta vector, in this order.
META_FIELDS = ("n", "s", "b", "updates", "compute", "batch_max")
# trainer.merge_weight -> the field of META_FIELDS a replica's merge weight counts (samples: an ablation of the rule).
MERGE_WEIGHTS = {"updates": "updates", "samples": "n"}


class AdaptiveStrategy(Strategy):
    """Dynamic scheduling + adaptive batch sizes + normalized merging (docs/scheduler.md)."""

    name = "adaptive"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        self.merge_interval = int(cfg["merge_interval"])
        self.multiple = int(cfg["batch_multiple"])
        self.batch_max = int(cfg["batch_max"])  # this worker's: lowered after an out-of-memory
        self.damping = float(cfg["damping"])
        self.deadband = float(cfg["deadband"])
        self.speed_ema = float(cfg["speed_ema"])
        self.warmup_intervals = int(cfg["warmup_intervals"])
        self.log_intervals = bool(cfg["log_intervals"])
        merge_weight = str(cfg["merge_weight"])
        if merge_weight not in MERGE_WEIGHTS:
            raise ValueError(f"trainer.merge_weight={merge_weight!r}: use one of {', '.join(MERGE_WEIGHTS)}")
        self._weight_field = MERGE_WEIGHTS[merge_weight]  # the META_FIELDS entry a replica's merge weight counts
        if not 0 < self.damping <= 1:
            raise ValueError(f"trainer.damping must be in (0, 1], got {self.damping}")
        if not 0 < self.speed_ema <= 1:
            raise ValueError(f"trainer.speed_ema must be in (0, 1], got {self.speed_ema}")
        check_batch_settings(self.total_batch, self.world, self.batch_min, self.batch_max, self.multiple)
        self.sizes = initial_batch_sizes(self.total_batch, self.world, self.batch_min, self.batch_max, self.multiple)
        coarse = coarse_multiple_warning(self.total_batch, self.world, self.multiple)
        if coarse and self.ctx.is_primary:
            log.warning(coarse)
        self.speeds = [0.0] * self.world
        self.speed = 0.0
        self.intervals_done = 0
        self._own_times: list[tuple[float, float]] = []  # this worker's (idle, merge) seconds of the epoch's merges
        self._interval = 0  # the interval being claimed (its store counter is deleted after its merge)
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
        """Halve this worker's ``batch_max`` (and its batch); returns the new batch size.

        The lower ``batch_max`` travels with the next merge, so the controller gives the freed share to the others.
        """
        if self.batch_size <= 1:
            raise RuntimeError(f"worker {self.rank} ({self.ctx.device}) runs out of memory at batch size 1")
        self.batch_max = max(1, self.batch_size // 2)
        self.sizes[self.rank] = self.batch_max
        log.warning("worker %d (%s): out of memory, batch_max lowered to %d", self.rank, self.ctx.device,
                    self.batch_max)
        return self.batch_max

    def start_epoch(self, epoch: int) -> int:
        self.epoch = epoch
        self._order = epoch_permutation(self.num_samples, self.seed, epoch)
        self._bounds = interval_bounds(self.num_samples, self.merge_interval,
                                       max(self.batch_min, self.merge_interval // 2))
        return len(self._bounds)

    def claims(self, interval: int) -> Iterator[Claim]:
        """Claim batches of the interval through the store until it is used up (no collective)."""
        low, high = self._bounds[interval]
        self._interval = interval
        claimer = IntervalClaimer(self.ctx.store, self._claim_key(interval), high - low, self.batch_min)
        while (span := claimer.claim(next_claim_size(claimer, self.rank, self.sizes, self.speeds, self.batch_min))):
            start, end = span
            yield Claim(self._order[low + start:low + end], self.epoch + (low + start) / self.num_samples)

    def _claim_key(self, interval: int) -> str:
        """The store counter the workers claim positions of this epoch's ``interval`` from."""
        return f"{self.prefix}/e{self.epoch}/i{interval}"

    def end_interval(self, compute_seconds: float) -> None:
        """The normalized merge: θ ← Σ_i p_i θ_i with p_i = u_i / Σ_j u_j (u = optimizer updates in the interval;
        samples with ``merge_weight: samples``),
        then every worker computes the same next batch sizes from the merged speed table."""
        super().end_interval(compute_seconds)
        busy = self._compute + self._sleep
        self.speed = updated_speed(self.speed, self._n, busy, self.speed_ema)
        mine = {"n": self._n, "s": self.speed, "b": self.batch_size, "updates": self._updates, "compute": busy,
                "batch_max": self.batch_max}
        k = len(META_FIELDS)
        meta = torch.zeros(self.world * k, dtype=torch.float64)
        meta[self.rank * k:(self.rank + 1) * k] = torch.tensor([mine[f] for f in META_FIELDS], dtype=torch.float64)
        result = normalized_merge(self.model, float(mine[self._weight_field]), meta=meta,
                                  comm_device=self.ctx.comm_device)
        if self.ctx.is_primary:  # every worker has claimed its last batch of the interval: the counter is done with
            self.ctx.store.delete_key(self._claim_key(self._interval))
        columns = result.meta.view(self.world, k).T
        table = {field: [float(v) for v in column] for field, column in zip(META_FIELDS, columns)}
        self.adapt(table)
        self._record(table, result)
        self._reset_counters()

    def adapt(self, table: Mapping[str, list[float]]) -> None:
        """Next batch sizes from the merged per-worker table (fields of ``META_FIELDS``, one value per worker);
        every worker runs this on the same table and so computes the same sizes. The first
        ``warmup_intervals`` merges keep the sizes (restoring Σ b_i = B after an out-of-memory)."""
        used = [int(b) for b in table["b"]]
        batch_maxes = [int(c) for c in table["batch_max"]]
        self.speeds = [float(s) for s in table["s"]]
        self.intervals_done += 1
        speeds = self.speeds if self.intervals_done > self.warmup_intervals else [0.0] * self.world
        self.sizes = next_batch_sizes(used, speeds, self.total_batch, self.batch_min, batch_maxes, self.multiple,
                                      self.damping, self.deadband)
        if sum(self.sizes) != self.total_batch:
            log.warning("adaptive: the workers' batch_max (%s) leave a total batch of %d instead of batch_size=%d",
                        batch_maxes, sum(self.sizes), self.total_batch)

    def _record(self, table: dict[str, list[float]], result: MergeResult) -> None:
        row: dict[str, float] = {"epoch": self.epoch, "interval": self.intervals_done, "merge_time": result.merge_s}
        total = result.total_weight or 1.0
        for rank in range(self.world):
            for field in META_FIELDS:
                row[f"{field}/{rank}"] = table[field][rank]
            row[f"p/{rank}"] = table[self._weight_field][rank] / total
            row[f"b_next/{rank}"] = float(self.sizes[rank])
        self._rows.append(row)
        self._own_times.append((result.idle_s, result.merge_s))  # everyone's are gathered at the end of the epoch
        if self.log_intervals and self.ctx.is_primary:
            log.info("merge %d (epoch %d): %s", self.intervals_done, self.epoch, format_row(row, self.world))

    def end_epoch(self) -> None:
        """Every interval ended with a merge, so the replicas are already identical; the epoch's idle and merge
        times of every worker reach every worker's rows in one all-reduce (not one store read per worker and
        merge on rank 0)."""
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
        self._own_times = []
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "batch_sizes": list(self.sizes), "speeds": list(self.speeds),
                "speed": self.speed, "batch_max": self.batch_max, "intervals_done": self.intervals_done}

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
        # Only rank 0's batch_max is in the checkpoint (rank 0 saves it); others keep the configured one.
        if self.rank == 0:
            self.batch_max = int(state.get("batch_max", state.get("b_max", self.batch_max)))  # "b_max": older runs
