"""The adaptive scheduler's rules: B, the batch-size grid, the merge cadence and who trains, as pure functions of
the settings and the measures; :class:`~rsnet.parallel.schedule.Schedule` applies them (docs/scheduler.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rsnet.parallel.batching import check_batch_settings

MERGE_WEIGHTS = ("uniform", "updates", "samples")


def auto_multiple(share: float) -> int:
    """The batch-size grid for an equal share B / W: 8 (tensor-core friendly) from 64 samples a worker, else the
    largest power of two at most share / 8, and at least 1 (16 a worker: 2; 32: 4; below 16: 1)."""
    if share >= 64:
        return 8
    multiple = 1
    while multiple * 2 <= share / 8:
        multiple *= 2
    return multiple


def parse_multiple(value: Any) -> str | int:
    """``trainer.batch_multiple``: "auto" or a whole number >= 1; raises ValueError naming the setting."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"trainer.batch_multiple={value!r}: use auto or a whole number >= 1")
    return value


def resolve_multiple(value: Any, total_batch: int, workers: int) -> int:
    """The grid of ``trainer.batch_multiple`` for B = ``total_batch`` over ``workers`` (auto: :func:`auto_multiple`)."""
    multiple = parse_multiple(value)
    return auto_multiple(total_batch / max(workers, 1)) if multiple == "auto" else int(multiple)


def round_batch(batch_size: int, workers: int, share_min: int) -> int:
    """B, the samples of one round of every active worker's batch: ``batch_size``, raised to workers × ``share_min``
    where ``batch_size`` / workers is smaller (0 never raises it)."""
    return max(int(batch_size), int(workers) * int(share_min))


def merge_rounds(rounds_min: int, comm_s: float, round_s: float, cost_max: float,
                 lr_profile: Sequence[float] = (), rounds_max: int = 0) -> int:
    """The base rounds of B between merges: at least ``rounds_min``, and enough that the merges take at most
    ``cost_max`` of the compute (over the run where the rounds follow ``lr_profile``); ``rounds_min`` where unknown."""
    if cost_max <= 0 or comm_s <= 0 or round_s <= 0:
        return int(rounds_min)
    merges_per_round = cost_max * round_s / comm_s  # the most merges a round may pay for
    base = max(int(rounds_min), 1)
    if not lr_profile or rounds_max <= rounds_min:
        return max(base, math.ceil(1 / merges_per_round - 1e-9))
    while 1 / mean_rounds(base, rounds_max, lr_profile) > merges_per_round + 1e-12:
        base += 1
    return base


def mean_rounds(rounds: int, rounds_max: int, lr_profile: Sequence[float] = ()) -> float:
    """The run's rounds per merge when an interval has :func:`lr_rounds` rounds at each point of ``lr_profile``
    (the harmonic mean: merges per round averaged over the run); ``rounds`` without a profile."""
    if not lr_profile:
        return float(rounds)
    return len(lr_profile) / sum(1 / lr_rounds(rounds, rounds_max, ratio) for ratio in lr_profile)


def lr_rounds(rounds: int, rounds_max: int, lr_ratio: float) -> int:
    """Rounds between merges while the lr is ``lr_ratio`` × its peak: ``rounds`` / lr_ratio², between ``rounds`` and
    ``rounds_max`` (the quadratic synchronization rule of Gu et al., ICLR 2024)."""
    if rounds_max <= rounds or lr_ratio >= 1:
        return int(rounds)
    return min(int(rounds_max), max(int(rounds), math.floor(rounds / max(lr_ratio, 1e-9) ** 2)))


def next_interval(start: int, num_samples: int, size: int, minimum: int) -> tuple[int, int]:
    """[start, end) of the merge interval that begins at ``start``: ``size`` positions, or the rest of the epoch
    where fewer than ``minimum`` would be left after it (no merge is spent on a scrap of an epoch)."""
    end = min(start + max(int(size), 1), num_samples)
    if num_samples - end < minimum:
        end = num_samples
    return start, end


def predicted_rate(speeds: Sequence[float], total_batch: int, batch_min: int, rounds: float, comm_s: float) -> float:
    """Samples/s of workers with ``speeds`` sharing rounds of ``total_batch`` at equal updates, less each interval's
    merge (``comm_s``) and a wait of half the longest step."""
    total_speed = sum(speeds)
    if len(speeds) == 1:
        return float(speeds[0])
    if total_speed <= 0 or min(speeds) <= 0:
        return 0.0
    round_s = total_batch / total_speed
    longest_step = max(max(total_batch * s / total_speed, batch_min) / s for s in speeds)
    interval_s = rounds * round_s
    return total_speed * interval_s / (interval_s + comm_s + longest_step / 2)


@dataclass(frozen=True)
class Admission:
    """The workers to keep (``keep[r]``) and, per candidate count of the fastest workers, the predicted samples/s."""

    keep: list[bool]
    rates: dict[int, float]


def choose_workers(speeds: Sequence[float], active: Sequence[bool], settings: ScheduleSettings,
                   comm_s: float, lr_profile: Sequence[float] = ()) -> Admission:
    """The set of the k fastest active workers with the highest :func:`predicted_rate` (a larger set wins a tie), each
    set with its own B and merge cadence."""
    ranked = sorted((r for r in range(len(speeds)) if active[r]), key=lambda r: (-speeds[r], r))
    rates: dict[int, float] = {}
    for count in range(1, len(ranked) + 1):
        chosen = [speeds[r] for r in ranked[:count]]
        total = round_batch(settings.batch_size, count, settings.share_min)
        round_s = total / max(sum(chosen), 1e-12)
        rounds = merge_rounds(settings.merge_rounds, comm_s, round_s, settings.merge_cost_max, lr_profile,
                              settings.merge_rounds_max)
        rates[count] = predicted_rate(chosen, total, settings.batch_min,
                                      mean_rounds(rounds, settings.merge_rounds_max, lr_profile), comm_s)
    best = max(rates, key=lambda count: (rates[count], count))
    return Admission([rank in ranked[:best] for rank in range(len(speeds))], rates)


@dataclass(frozen=True)
class ScheduleSettings:
    """The adaptive trainer's scheduling settings (conf/trainer/adaptive.yaml) and the run's ``batch_size``."""

    batch_size: int
    batch_min: int
    batch_max: int
    multiple: str | int  # "auto" or a fixed multiple
    share_min: int
    merge_rounds: int
    merge_rounds_max: int
    merge_cost_max: float
    damping: float
    deadband: float
    warmup_intervals: int
    leave_out: bool

    @classmethod
    def from_config(cls, trainer: Mapping[str, Any], batch_size: int) -> ScheduleSettings:
        """From the trainer config as a run composes it; raises ValueError naming a bad setting."""
        settings = cls(int(batch_size), int(trainer["batch_min"]), int(trainer["batch_max"]),
                       parse_multiple(trainer["batch_multiple"]), int(trainer["share_min"] or 0),
                       int(trainer["merge_rounds"]), int(trainer.get("merge_rounds_max") or 0),
                       float(trainer["merge_cost_max"] or 0.0),
                       float(trainer["damping"]), float(trainer["deadband"]), int(trainer["warmup_intervals"]),
                       bool(trainer["leave_out"]))
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ValueError, naming the setting, for values the scheduler cannot work with."""
        if self.merge_rounds < 1:
            raise ValueError(f"trainer.merge_rounds={self.merge_rounds}: must be >= 1 (rounds of batch_size between "
                             "merges)")
        if not 0 <= self.merge_cost_max < 1:
            raise ValueError(f"trainer.merge_cost_max={self.merge_cost_max}: must be in [0, 1) (0: no cost rule)")
        if self.share_min < 0:
            raise ValueError(f"trainer.share_min={self.share_min}: must be >= 0 (0: B is always batch_size)")
        if not 0 < self.damping <= 1:
            raise ValueError(f"trainer.damping must be in (0, 1], got {self.damping}")

    def multiple_for(self, total_batch: int, workers: int) -> int:
        """The grid for B = ``total_batch`` over ``workers``."""
        return resolve_multiple(self.multiple, total_batch, workers)

    def check_workers(self, workers: int) -> None:
        """Raise ValueError, naming the setting to change, when ``workers`` batches cannot add up to B."""
        total = round_batch(self.batch_size, workers, self.share_min)
        check_batch_settings(total, workers, self.batch_min, self.batch_max, self.multiple_for(total, workers))
