"""Dynamic scheduling and batch-size control (docs/scheduler.md): the epoch's shared order, static shards, claims
through an atomic counter in the c10d store, and the batch-size controller."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's sample order, identical on every worker (int64 tensor)."""
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(num_samples, generator=generator)


def static_partition(num_samples: int, seed: int, epoch: int, rank: int, world_size: int) -> torch.Tensor:
    """DistributedSampler-style share: the epoch permutation padded to a multiple of the world size
    (wrapping around), rank r takes positions r, r + world, ... — every worker gets the same count."""
    order = epoch_permutation(num_samples, seed, epoch)
    total = math.ceil(num_samples / world_size) * world_size
    if total > num_samples:
        order = torch.cat([order, order[: total - num_samples]])
    return order[rank:total:world_size]


def proportional_batches(num_samples: int, seed: int, epoch: int, sizes: Sequence[int],
                         rank: int) -> list[torch.Tensor]:
    """A static split with unequal batches: step k trains positions [k·B, (k+1)·B) of the epoch permutation (wrapped to
    whole steps), B = Σ sizes, worker ``rank`` its ``sizes[rank]`` of them after ranks 0 .. rank−1."""
    total = int(sum(sizes))
    steps = math.ceil(num_samples / total)
    order = epoch_permutation(num_samples, seed, epoch).repeat(math.ceil(steps * total / num_samples))
    start = int(sum(sizes[:rank]))
    return [order[k * total + start:k * total + start + int(sizes[rank])] for k in range(steps)]


def static_batches(shard: torch.Tensor, size: int, minimum: int) -> list[torch.Tensor]:
    """``shard`` cut into batches of ``size``; a last batch smaller than ``minimum`` joins the one before it."""
    batches = list(shard.split(max(int(size), 1)))
    if len(batches) > 1 and len(batches[-1]) < minimum:
        batches[-2:] = [torch.cat(batches[-2:])]
    return batches


def claim_span(start: int, count: int, size: int, minimum: int) -> tuple[int, int] | None:
    """The positions [start, end) of an interval of ``size`` that a claim of ``count`` owns, the counter standing at
    ``start`` before it; None for nothing. No claim leaves fewer than ``minimum`` behind."""
    if start >= size or (start > 0 and size - start < minimum):
        return None
    end = min(start + count, size)
    if 0 < size - end < minimum:
        end = size
    return start, end


class IntervalClaimer:
    """Claim positions of one merge interval through an atomic counter in the store (``store.add`` returns the
    counter after the increment, so a claim of ``count`` found it at ``new − count``)."""

    def __init__(self, store, key: str, size: int, minimum: int = 1) -> None:
        self.store, self.key, self.size, self.minimum = store, key, int(size), int(minimum)
        self.seen = 0  # the counter as of this claimer's last store call (a lower bound of the current one)

    def claim(self, count: int) -> tuple[int, int] | None:
        """Own the next positions (:func:`claim_span`), or None once the interval is used up."""
        end = int(self.store.add(self.key, int(count)))
        self.seen = end
        return claim_span(end - int(count), int(count), self.size, self.minimum)

    def remaining(self) -> int:
        """Positions not yet claimed by anyone (one store round trip)."""
        self.seen = int(self.store.add(self.key, 0))
        return max(self.size - self.seen, 0)


def check_batch_per_worker(total_batch: int, world: int) -> None:
    """Raise ValueError unless ``total_batch`` gives each of ``world`` workers at least one sample per step."""
    if total_batch < world:
        raise ValueError(f"batch_size={total_batch} is smaller than the number of workers ({world}); "
                         "every worker needs at least one sample per step")


def check_batch_settings(total_batch: int, world: int, batch_min: int, batch_max: int, multiple: int) -> None:
    """Raise ValueError, naming the setting to change, when ``world`` batches within [batch_min, batch_max]
    (multiples of ``multiple``) cannot add up to ``total_batch``."""
    if batch_min < 1 or batch_max < batch_min:
        raise ValueError(f"trainer.batch_min={batch_min}, trainer.batch_max={batch_max}: "
                         "need 1 <= batch_min <= batch_max")
    if world * batch_min > total_batch:
        raise ValueError(f"batch_size={total_batch} is too small for {world} workers with "
                         f"trainer.batch_min={batch_min} (every worker needs at least batch_min, {world} x "
                         f"{batch_min} = {world * batch_min}): raise batch_size to >= {world * batch_min} or lower "
                         "trainer.batch_min")
    if sum(initial_batch_sizes(total_batch, world, batch_min, batch_max, multiple)) != total_batch:
        raise ValueError(f"batch_size={total_batch} does not fit {world} workers with trainer.batch_max={batch_max} "
                         f"(multiples of trainer.batch_multiple={multiple}): raise trainer.batch_max to >= "
                         f"{math.ceil(total_batch / world / max(multiple, 1)) * max(multiple, 1)} or lower batch_size")


def initial_batch_sizes(total_batch: int, world_size: int, batch_min: int, batch_max: int,
                        multiple: int = 8) -> list[int]:
    """The equal split of B: multiples of ``multiple`` within bounds that add up to B (the lowest ranks get the
    extra multiples, rank 0 also B mod ``multiple``)."""
    share = total_batch / world_size
    batch_maxes = [int(batch_max)] * world_size
    return fit_total(total_batch, [0] * world_size, [share] * world_size, batch_min, batch_maxes, multiple)


def fit_total(total: int, proposed: Sequence[int], wanted: Sequence[float], batch_min: int,
              batch_maxes: Sequence[int], multiple: int) -> list[int]:
    """Sizes close to ``proposed`` that add up to ``total``: multiples of ``multiple`` within [batch_min,
    batch_maxes[i]] plus total mod ``multiple`` on one worker, moved a multiple at a time off what each ``wanted``."""
    n = len(proposed)
    unit = max(int(multiple), 1)
    sizes = [int(batch_maxes[i]) if batch_maxes[i] <= batch_min else 0 for i in range(n)]
    free = [i for i in range(n) if batch_maxes[i] > batch_min]
    if not free:
        return sizes
    units_total, remainder = divmod(max(total - sum(sizes), 0), unit)
    low = -(-batch_min // unit)
    high = {i: max(int(batch_maxes[i]) // unit, low) for i in free}
    units = {i: min(max(int(proposed[i]) // unit, low), high[i]) for i in free}
    while sum(units.values()) > units_total and (above := [i for i in free if units[i] > low]):
        units[max(above, key=lambda i: (units[i] * unit - wanted[i], -i))] -= 1
    while sum(units.values()) < units_total and (below := [i for i in free if units[i] < high[i]]):
        units[max(below, key=lambda i: (wanted[i] - units[i] * unit, -i))] += 1
    for i in free:
        sizes[i] = units[i] * unit
    holders = [i for i in free if sizes[i] + remainder <= batch_maxes[i]]
    if remainder and holders:
        sizes[max(holders, key=lambda i: (units[i], -i))] += remainder
    if sum(sizes) < total:
        log.warning("batch sizes %s add up to %d, not the total batch of %d: the workers' batch_max (%s) in "
                    "multiples of %d cannot hold the rest, so every round trains fewer samples; raise "
                    "trainer.batch_max or lower batch_size", sizes, sum(sizes), total, list(batch_maxes), unit)
    return sizes


def speed_proportional_sizes(speeds: Sequence[float], total_batch: int, batch_min: int, batch_max: int,
                             multiple: int) -> list[int]:
    """The static speed-proportional split of ``total_batch`` (:func:`proportional_targets`, then :func:`fit_total`)."""
    maxes = [int(batch_max)] * len(speeds)
    targets = proportional_targets(speeds, total_batch, batch_min, maxes)
    return fit_total(total_batch, [round(t) for t in targets], targets, batch_min, maxes, multiple)


def proportional_targets(speeds: Sequence[float], total_batch: int, batch_min: int,
                         batch_maxes: Sequence[int]) -> list[float]:
    """B·s_i/Σs_j, water-filled so that workers held at a bound hand their share to the others."""
    n = len(speeds)
    targets = [0.0] * n
    free = set(range(n))
    remaining = float(total_batch)
    for _ in range(2 * n + 1):
        speed_sum = sum(max(speeds[i], 0.0) for i in free)
        for i in free:
            targets[i] = remaining * max(speeds[i], 0.0) / speed_sum if speed_sum > 0 else remaining / len(free)
        # Fix the workers above their batch_max first (their excess goes to the others), then those below batch_min.
        over = [i for i in sorted(free) if targets[i] > batch_maxes[i]]
        under = [i for i in sorted(free) if targets[i] < min(batch_min, batch_maxes[i])]
        if not (fixed := over or under):
            break
        for i in fixed:
            targets[i] = float(batch_maxes[i]) if i in over else float(min(batch_min, batch_maxes[i]))
            free.discard(i)
            remaining -= targets[i]
        if not free:
            break
    return targets


def updated_speed(previous: float, samples: float, seconds: float, ema: float) -> float:
    """A worker's speed after training ``samples`` in ``seconds`` of its own: the EMA (weight ``ema`` on the newest),
    the measurement when there is no estimate yet, the old one when it trained nothing."""
    if samples <= 0 or seconds <= 0:
        return previous
    measured = samples / seconds
    return measured if previous <= 0 else ema * measured + (1 - ema) * previous


def next_batch_sizes(current: Sequence[int], speeds: Sequence[float], total_batch: int, batch_min: int,
                     batch_max: Sequence[int] | int, multiple: int = 8, damping: float = 0.5,
                     deadband: float = 0.05) -> list[int]:
    """One controller step: every b_i moves by γ·(target_i − b_i), target_i = B·s_i/Σs_j within the bounds, in whole
    multiples (at most to the one nearest the target) unless within the deadband; Σ b_i = B."""
    n = len(current)
    batch_maxes = [int(batch_max)] * n if isinstance(batch_max, (int, float)) else [int(c) for c in batch_max]
    batch_maxes = [max(c, 1) for c in batch_maxes]
    if any(s <= 0 for s in speeds):
        return fit_total(total_batch, current, [float(b) for b in current], batch_min, batch_maxes, multiple)
    targets = proportional_targets(speeds, total_batch, batch_min, batch_maxes)
    unit = max(int(multiple), 1)
    proposed = []
    for b, target in zip(current, targets):
        gap = target - int(b)
        if abs(gap) <= max(deadband * int(b), unit / 2):
            proposed.append(int(b))
            continue
        # At least one multiple: stopping short would never close a gap below one (B = 32, speeds 2:1: 16/16 for
        # ever instead of 24/8); at most to the multiple nearest the target, which the hold band then keeps.
        moved = max(unit, round(abs(gap) * damping / unit) * unit)
        moved = min(moved, int(math.floor(abs(gap) / unit + 0.5)) * unit)
        proposed.append(int(b) + int(math.copysign(moved, gap)))
    return fit_total(total_batch, proposed, targets, batch_min, batch_maxes, multiple)


def _others_rate(rank: int, sizes: Sequence[int], speeds: Sequence[float]) -> float:
    """Samples/s of the other workers that train (a batch size above 0)."""
    return sum(float(s) for r, (s, b) in enumerate(zip(speeds, sizes)) if r != rank and b > 0)


def may_claim_ahead(claimer: IntervalClaimer, rank: int, sizes: Sequence[int], speeds: Sequence[float]) -> bool:
    """Whether worker ``rank``, while its current step runs, should claim its next batch now: only while the others
    cannot use up the interval in two of its steps (a worker with no speed yet never claims ahead)."""
    own = float(speeds[rank])
    if own <= 0:
        return False
    others_rate = _others_rate(rank, sizes, speeds)
    if others_rate <= 0:
        return True
    return claimer.size - claimer.seen > 2 * int(sizes[rank]) / own * others_rate


def may_claim_next(claimer: IntervalClaimer, rank: int, sizes: Sequence[int], speeds: Sequence[float]) -> bool:
    """Whether worker ``rank``, its steps done, should claim its next batch, so that no one waits for it at the
    merge: the fastest always claims, the others while the rest of the interval lasts the others half its step."""
    own = float(speeds[rank])
    others_rate = _others_rate(rank, sizes, speeds)
    if own <= 0 or others_rate <= 0:
        return True
    others = [(float(s), r) for r, (s, b) in enumerate(zip(speeds, sizes)) if r != rank and b > 0]
    if all(own > s or (own == s and rank < r) for s, r in others):
        return True
    step_s = int(sizes[rank]) / own
    left = claimer.size - claimer.seen
    if left / others_rate < step_s:  # near the end: the exact count
        left = claimer.remaining()
    return left / others_rate >= step_s / 2


def coarse_multiple_warning(total_batch: int, world: int, multiple: int) -> str | None:
    """A warning when sizes in multiples of ``multiple`` are coarse for the equal share B / W (below 4 multiples, the
    half-multiple hold band is over 12.5 % of a share); None when the share is fine."""
    share = total_batch / world
    if world < 2 or multiple < 2 or share >= 4 * multiple:
        return None
    return (f"adaptive: batch_size={total_batch} over {world} workers is {share:.3g} samples a worker, and sizes move "
            f"in multiples of trainer.batch_multiple={multiple}: a worker's size changes only when its "
            f"speed-proportional share is more than {multiple / 2:g} samples ({multiple / 2 / share:.0%}) away, so "
            f"moderately different speeds keep the equal split and unbalanced updates. Lower trainer.batch_multiple "
            f"(4, or 1 on CPUs) or raise batch_size to >= {4 * multiple * world}")
