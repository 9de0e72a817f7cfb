"""Dynamic scheduling and batch-size control: pure functions plus the store-backed claimer.

* :func:`epoch_permutation` — the shared, seeded order of an epoch (every worker computes the same one).
* :class:`IntervalClaimer` — workers claim the next ``b_i`` positions of a merge interval through an
  atomic counter in the c10d store (``store.add`` returns the counter after the increment, so each call
  owns ``[new - b_i, new)``); once the counter passes the interval's size the interval is exhausted.
* :func:`next_batch_sizes` — the controller: b_i ← clip(round_8(b_i + γ(B·s_i/Σs_j − b_i)), b_min, b_max_i).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's sample order, identical on every worker (int64 tensor)."""
    generator = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(num_samples, generator=generator)


def interval_bounds(num_samples: int, merge_interval: int) -> list[tuple[int, int]]:
    """[start, end) positions of every merge interval of an epoch (the last may be shorter)."""
    if num_samples <= 0:
        return []
    size = merge_interval if 0 < merge_interval < num_samples else num_samples
    return [(start, min(start + size, num_samples)) for start in range(0, num_samples, size)]


def static_partition(num_samples: int, seed: int, epoch: int, rank: int, world_size: int) -> torch.Tensor:
    """DistributedSampler-style share: the epoch permutation padded to a multiple of the world size
    (wrapping around), rank r takes positions r, r + world, ... — every worker gets the same count."""
    order = epoch_permutation(num_samples, seed, epoch)
    total = math.ceil(num_samples / world_size) * world_size
    if total > num_samples:
        order = torch.cat([order, order[: total - num_samples]])
    return order[rank:total:world_size]


class IntervalClaimer:
    """Claim positions of one merge interval through an atomic counter in the store."""

    def __init__(self, store, key: str, size: int) -> None:
        self.store, self.key, self.size = store, key, int(size)
        self.seen = 0  # the counter as of this claimer's last store call (a lower bound of the current one)

    def claim(self, count: int) -> tuple[int, int] | None:
        """Own the next ``count`` positions: (start, end) with end ≤ size, or None once the interval is used up."""
        end = int(self.store.add(self.key, int(count)))
        self.seen = end
        start = end - int(count)
        if start >= self.size:
            return None
        return start, min(end, self.size)

    def remaining(self) -> int:
        """Positions not yet claimed by anyone (one store round trip)."""
        self.seen = int(self.store.add(self.key, 0))
        return max(self.size - self.seen, 0)


def tail_claim_size(batch: int, remaining: int, weights: Sequence[float], rank: int, minimum: int = 1) -> int:
    """Batch to claim when only ``remaining`` positions of the interval are left: this worker's share of them
    by ``weights`` (speeds), rounded up, within [minimum, batch], so that the workers finish the interval
    together instead of one computing a last full batch while the others wait in the merge. A claim never
    leaves fewer than ``minimum`` positions behind (no batch of 1 for BatchNorm) unless it cannot help it."""
    total = sum(max(w, 0.0) for w in weights)
    if remaining <= 0 or total <= 0:
        return batch
    low = max(1, min(minimum, batch))
    count = max(low, min(batch, math.ceil(remaining * max(weights[rank], 0.0) / total)))
    if 0 < remaining - count < low:  # do not leave a scrap: take all of it, or leave exactly ``low``
        if remaining <= batch:
            count = remaining
        elif remaining - low >= low:
            count = remaining - low
    return count


def round_to_multiple(value: float, multiple: int) -> int:
    """Nearest multiple of ``multiple`` (at least one multiple); plain rounding when multiple ≤ 1."""
    if multiple <= 1:
        return max(1, int(round(value)))
    return max(multiple, int(round(value / multiple)) * multiple)


def proportional_targets(speeds: Sequence[float], total_batch: int, b_min: int, b_max: Sequence[int]) -> list[float]:
    """B·s_i/Σs_j, water-filled so that workers held at a bound hand their share to the others."""
    n = len(speeds)
    targets = [0.0] * n
    free = set(range(n))
    remaining = float(total_batch)
    for _ in range(2 * n + 1):
        speed_sum = sum(max(speeds[i], 0.0) for i in free)
        for i in free:
            targets[i] = remaining * max(speeds[i], 0.0) / speed_sum if speed_sum > 0 else remaining / len(free)
        # Fix the workers above their cap first (their excess goes to the others), then those below b_min.
        over = [i for i in sorted(free) if targets[i] > b_max[i]]
        under = [i for i in sorted(free) if targets[i] < min(b_min, b_max[i])]
        fixed = over or under
        if not fixed:
            break
        for i in fixed:
            targets[i] = float(b_max[i]) if i in over else float(min(b_min, b_max[i]))
            free.discard(i)
            remaining -= targets[i]
        if not free:
            break
    return targets


def next_batch_sizes(current: Sequence[int], speeds: Sequence[float], total_batch: int, b_min: int,
                     b_max: Sequence[int] | int, multiple: int = 8, damping: float = 0.5,
                     deadband: float = 0.05) -> list[int]:
    """One controller step: move every b_i part of the way toward its speed-proportional share.

    target_i = B·s_i/Σs_j (water-filled within [b_min, b_max_i]); b_i ← b_i + γ·(target_i − b_i),
    rounded to a multiple of ``multiple`` (when the bounds allow it) and clipped to [b_min, b_max_i].
    A worker within ``deadband`` (relative) or half a multiple of its target keeps its size.

    Stability: for fixed speeds a step moves toward the target and never past the multiple nearest to it
    (γ ≤ 1; at most half a multiple beyond the target, inside the hold band), so the sizes approach the
    proportional split monotonically and then stay put: no oscillation.
    """
    n = len(current)
    caps = [int(b_max)] * n if isinstance(b_max, (int, float)) else [int(c) for c in b_max]
    caps = [max(c, 1) for c in caps]
    lows = [min(b_min, c) for c in caps]  # an out-of-memory cap below b_min wins over b_min
    if any(s <= 0 for s in speeds):
        return [_clip(int(b), lows[i], caps[i], multiple) for i, b in enumerate(current)]
    targets = proportional_targets(speeds, total_batch, b_min, caps)
    sizes = []
    for i in range(n):
        b, target = int(current[i]), targets[i]
        gap = target - b
        if abs(gap) <= max(deadband * b, multiple / 2 if multiple > 1 else 0.5):
            proposed = b
        else:
            step = gap * damping
            # Move toward the target by at least one multiple, at most to the multiple nearest the target
            # (past it by at most half a multiple, which the deadband of at least half a multiple then holds).
            # Stopping short of the target instead would leave any gap below one multiple unclosed: with
            # B = 32 and a 2:1 speed ratio the sizes would stay at 16/16 (targets 21.3/10.7) for ever.
            unit = multiple if multiple > 1 else 1
            moved = round_to_multiple(abs(step), unit)
            moved = min(moved, int(math.floor(abs(gap) / unit + 0.5)) * unit)
            proposed = b + int(math.copysign(moved, gap))
        sizes.append(_clip(proposed, lows[i], caps[i], multiple))
    return sizes


def _clip(value: int, low: int, high: int, multiple: int) -> int:
    """Clip to [low, high], preferring a multiple of ``multiple`` inside the bounds when one exists."""
    value = min(max(value, low), high)
    if multiple > 1 and value % multiple:
        down = (value // multiple) * multiple
        up = down + multiple
        if low <= down:
            return down
        if up <= high:
            return up
    return value


def initial_batch_sizes(total_batch: int, world_size: int, b_min: int, b_max: int, multiple: int = 8) -> list[int]:
    """Equal split of B, rounded to a multiple of ``multiple`` where the total allows it, within bounds."""
    share = total_batch / world_size
    size = round_to_multiple(share, multiple) if share >= multiple else max(1, int(round(share)))
    return [_clip(size, b_min, b_max, multiple if share >= multiple else 1)] * world_size
