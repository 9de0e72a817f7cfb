"""The pure parts of the scheduler: batch-size controller, intervals, partitions (no processes)."""

from __future__ import annotations

import pytest
import torch
from helpers import DictStore

from rsnet.parallel.batching import (
    IntervalClaimer,
    check_batch_settings,
    claim_span,
    coarse_multiple_warning,
    epoch_permutation,
    fit_total,
    initial_batch_sizes,
    may_claim_ahead,
    may_claim_next,
    next_batch_sizes,
    proportional_batches,
    proportional_targets,
    speed_proportional_sizes,
    static_batches,
    static_partition,
    updated_speed,
)


def _run_controller(speeds, total=48, batch_min=8, batch_max=1024, steps=20, start=None, **kw):
    sizes = start or initial_batch_sizes(total, len(speeds), batch_min, batch_max)
    history = [list(sizes)]
    for _ in range(steps):
        sizes = next_batch_sizes(sizes, speeds, total, batch_min, batch_max, **kw)
        history.append(list(sizes))
    return history


def test_controller_converges_to_proportional_sizes() -> None:
    history = _run_controller([2.0, 1.0], total=48)
    assert history[0] == [24, 24]
    assert history[-1] == [32, 16]
    history = _run_controller([3.0, 1.0], total=256, deadband=0.0)
    assert history[-1] == [192, 64]
    history = _run_controller([4.0, 2.0, 1.0, 1.0], total=512, deadband=0.0)
    assert history[-1] == [256, 128, 64, 64]
    # The default 5 % deadband: targets 265.3 / 123.4 / 61.7 / 61.7 stop at 256 / 128 / 64 / 64 (each within 5 % of
    # its size), where without it they move on to the nearest multiples of 8: 264 / 120 / 64 / 64.
    assert _run_controller([4.3, 2.0, 1.0, 1.0], total=512)[-1] == [256, 128, 64, 64]
    assert _run_controller([4.3, 2.0, 1.0, 1.0], total=512, deadband=0.0)[-1] == [264, 120, 64, 64]
    assert _run_controller([1.04, 1.0], total=512)[-1] == [256, 256]  # 261.0 / 251.0: held


def test_controller_closes_a_gap_smaller_than_one_multiple() -> None:
    # B = 32, speeds 2:1: targets 21.3 / 10.7 are less than one multiple (8) from 16 / 16; the sizes move to
    # the nearest multiples 24 / 8 and stay there.
    history = _run_controller([2.0, 1.0], total=32)
    assert history[0] == [16, 16] and history[1] == [24, 8] and history[-1] == [24, 8]
    assert _run_controller([1.2, 1.0], total=32)[-1] == [16, 16]  # 17.5 / 14.5: within the hold band


def test_controller_monotone_no_oscillation_and_multiples_of_8() -> None:
    for speeds in ([2.0, 1.0], [1.0, 5.0], [1.3, 1.0, 0.7], [10.0, 1.0]):
        history = _run_controller(speeds, total=400, steps=30)
        for worker in range(len(speeds)):
            sizes = [h[worker] for h in history]
            steps = [b - a for a, b in zip(sizes, sizes[1:])]
            assert all(s >= 0 for s in steps) or all(s <= 0 for s in steps), sizes  # one direction only
            assert all(b % 8 == 0 for b in sizes)
        assert history[-1] == history[-2]  # settled


def test_controller_is_stable_under_speed_noise() -> None:
    generator = torch.Generator().manual_seed(0)
    sizes = [32, 16]
    changes = 0
    for _ in range(50):
        noise = 1 + 0.03 * (torch.rand(2, generator=generator) - 0.5)
        new = next_batch_sizes(sizes, [2.0 * float(noise[0]), 1.0 * float(noise[1])], 48, 8, 1024)
        changes += new != sizes
        sizes = new
    assert changes == 0 and sizes == [32, 16]


def test_controller_respects_bounds_and_memory_cap() -> None:
    history = _run_controller([100.0, 1.0], total=256, batch_min=16, batch_max=128)
    assert history[-1] == [128, 128]  # the fast worker held at batch_max, the slow one takes the rest
    history = _run_controller([100.0, 1.0], total=256, batch_min=32, batch_max=1024)
    assert min(history[-1]) >= 32
    # A worker's batch_max (lowered after an out-of-memory) below batch_min wins; its share goes to the others.
    sizes = next_batch_sizes([64, 64], [1.0, 1.0], 128, 32, [16, 1024], damping=1.0)
    assert sizes[0] == 16 and sizes[1] == 112
    targets = proportional_targets([1.0, 1.0, 1.0], 300, 8, [50, 1000, 1000])
    assert targets == pytest.approx([50.0, 125.0, 125.0])


def test_controller_holds_when_a_speed_is_unknown() -> None:
    assert next_batch_sizes([24, 24], [2.0, 0.0], 48, 8, 1024) == [24, 24]


def test_epoch_order_and_static_partition() -> None:
    order = epoch_permutation(11, seed=3, epoch=2)
    assert torch.equal(order, epoch_permutation(11, seed=3, epoch=2))
    assert not torch.equal(order, epoch_permutation(11, seed=3, epoch=3))
    shards = [static_partition(11, 3, 2, r, 3) for r in range(3)]
    assert all(len(s) == 4 for s in shards)
    assert set(torch.cat(shards).tolist()) == set(range(11))
    # A static shard's last batch below the minimum joins the one before it.
    assert [len(b) for b in static_batches(torch.arange(105), 16, 8)] == [16] * 6 + [9]
    assert [len(b) for b in static_batches(torch.arange(97), 16, 8)] == [16] * 5 + [17]
    assert [len(b) for b in static_batches(torch.arange(5), 16, 8)] == [5]


def test_static_speed_proportional_split() -> None:
    assert speed_proportional_sizes([200.0, 100.0], 48, 8, 1024, 8) == [32, 16]
    # 12, 12, 24 in multiples of 8
    assert speed_proportional_sizes([100.0, 100.0, 200.0], 48, 8, 1024, 8) == [16, 8, 24]
    assert speed_proportional_sizes([1000.0, 1.0], 48, 8, 1024, 8) == [40, 8]  # the slow one keeps batch_min
    # Every step trains B = 48 positions of the epoch permutation, split 32 / 16; all workers get 5 steps.
    sizes = [32, 16]
    batches = [proportional_batches(200, 3, 1, sizes, rank) for rank in range(2)]
    assert [len(b) for b in batches[0]] == [32] * 5 and [len(b) for b in batches[1]] == [16] * 5
    covered = torch.cat([torch.cat(b) for b in batches]).tolist()
    assert set(covered) == set(range(200)) and len(covered) == 240  # 40 positions wrap around
    order = epoch_permutation(200, 3, 1).tolist()
    assert batches[0][1].tolist() == order[48:80] and batches[1][1].tolist() == order[80:96]


def test_claimer_hands_out_disjoint_ranges_until_exhausted() -> None:
    store = DictStore()
    a, b = IntervalClaimer(store, "k", 20), IntervalClaimer(store, "k", 20)
    claims = [a.claim(8), b.claim(4), a.claim(8), b.claim(4), a.claim(8)]
    assert claims == [(0, 8), (8, 12), (12, 20), None, None]


def test_no_claim_below_the_minimum_whatever_the_order() -> None:
    """'remaining 9, batch 8 -> 1 left' must not train a scrap of 1 (BatchNorm raises on a batch of 1)."""
    store = DictStore()
    a, b = IntervalClaimer(store, "k", 17, minimum=8), IntervalClaimer(store, "k", 17, minimum=8)
    assert a.claim(8) == (0, 8)
    assert b.claim(8) == (8, 17)  # would leave 1: takes it
    assert a.claim(8) is None
    # A full-size claim truncated by a stale view never yields a scrap: the claim before it took the scrap.
    assert claim_span(60, 8, 64, 8) is None and claim_span(56, 8, 64, 8) == (56, 64)
    assert claim_span(50, 8, 64, 8) == (50, 64)  # 58 would leave 6
    assert claim_span(0, 8, 5, 8) == (0, 5)  # an interval smaller than the minimum goes whole to the first claim
    # Every position is owned exactly once for any sequence of claim sizes.
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        size = int(torch.randint(1, 120, (1,), generator=generator))
        counter, owned = 0, []
        while (span := claim_span(counter, (count := int(torch.randint(1, 40, (1,), generator=generator))), size, 8)):
            owned.extend(range(*span))
            assert span[1] - span[0] >= min(count, 8, size)
            counter += count
        assert sorted(owned) == list(range(size))


def test_total_batch_is_kept_or_the_config_refused() -> None:
    """Σ b_i = B also where B / W is not a multiple of batch_multiple; bounds that cannot add up to B are refused."""
    assert initial_batch_sizes(100, 3, 8, 1024) == [36, 32, 32]
    assert initial_batch_sizes(32, 3, 8, 1024) == [16, 8, 8]
    assert initial_batch_sizes(30, 2, 8, 1024, multiple=1) == [15, 15]
    for speeds in ([10.0, 3.0, 1.0], [1.0, 1.0, 1.0], [1.0, 10.0]):
        sizes = initial_batch_sizes(100, len(speeds), 8, 1024)
        for _ in range(20):
            sizes = next_batch_sizes(sizes, speeds, 100, 8, 1024)
            assert sum(sizes) == 100 and min(sizes) >= 8
    with pytest.raises(ValueError, match=r"batch_size=32 is too small for 8 workers .*trainer\.batch_min"):
        check_batch_settings(32, 8, 8, 1024, 8)  # 8 x 8 = 64 > 32
    with pytest.raises(ValueError, match=r"trainer\.batch_max"):
        check_batch_settings(256, 2, 8, 64, 8)
    # A batch_min between multiples: the smallest size is the first multiple above it (12 -> 16).
    check_batch_settings(64, 2, 12, 1024, 8)
    assert next_batch_sizes([32, 32], [10.0, 1.0], 64, 12, 1024, multiple=8, damping=1.0) == [48, 16]
    check_batch_settings(100, 3, 8, 40, 8)  # 36 + 32 + 32 fits under 40


def test_coarse_multiple_is_warned_where_it_hides_a_speed_ratio() -> None:
    # 32 over 2 workers in multiples of 8: a 1 : 1.5 pair wants 19.2 / 12.8, within 4 of 16, so the sizes hold
    assert next_batch_sizes([16, 16], [1.5, 1.0], 32, 8, 1024, multiple=8) == [16, 16]
    message = coarse_multiple_warning(32, 2, 8)
    assert "batch_size=32 over 2 workers is 16 samples a worker" in message
    assert "more than 4 samples (25%) away" in message and "batch_size to >= 64" in message
    assert "10.7 samples a worker" in coarse_multiple_warning(32, 3, 8)
    # finer multiples follow the same pair; large shares, one worker and multiple 1 are fine
    assert next_batch_sizes([16, 16], [1.5, 1.0], 32, 8, 1024, multiple=4) == [20, 12]
    assert coarse_multiple_warning(32, 2, 4) is None and coarse_multiple_warning(256, 4, 8) is None
    assert coarse_multiple_warning(32, 1, 8) is None and coarse_multiple_warning(32, 3, 1) is None


def test_speed_estimate_starts_at_the_first_measurement_then_averages() -> None:
    assert updated_speed(0.0, 100, 2.0, ema=0.5) == 50.0  # no estimate yet: the measurement
    assert updated_speed(50.0, 100, 1.0, ema=0.5) == 75.0  # 0.5 * 100 + 0.5 * 50
    assert updated_speed(50.0, 0, 0.0, ema=0.5) == 50.0  # trained nothing: the estimate stays


def test_claims_ahead_or_at_all_only_where_no_one_waits_for_them() -> None:
    store = DictStore()
    claimer = IntervalClaimer(store, "k", 200, 4)
    assert not may_claim_ahead(claimer, 0, [16, 16], [0.0, 100.0])  # speed unknown: after the step
    assert may_claim_next(claimer, 0, [16, 16], [0.0, 100.0])
    # worker 1 at 10 samples/s with batches of 8: 0.8 s a step; in two, worker 0 (100/s) trains 160 positions
    assert may_claim_ahead(claimer, 1, [24, 8], [100.0, 10.0])
    claimer.seen = 50  # 150 left (as last seen)
    assert not may_claim_ahead(claimer, 1, [24, 8], [100.0, 10.0])
    claimer.seen = 130  # 70 left
    assert may_claim_ahead(claimer, 0, [24, 8], [100.0, 10.0])  # worker 1 trains 4.8 positions in 0.48 s
    assert may_claim_ahead(claimer, 0, [32, 0], [100.0, 10.0])  # nobody else trains
    # Free, near the end: the store is read. 70 left take worker 0 0.7 s, over half of worker 1's 0.8 s step: claim.
    store.add("k", 130)
    assert may_claim_next(claimer, 1, [24, 8], [100.0, 10.0])
    store.add("k", 40)  # 30 left: 0.3 s for worker 0, less than half of 0.8 s: worker 1 leaves them to it
    assert claimer.seen == 130  # its view is stale, but near the end it reads the counter
    assert not may_claim_next(claimer, 1, [24, 8], [100.0, 10.0])
    assert may_claim_next(claimer, 0, [24, 8], [100.0, 10.0])  # the fastest always claims
    assert may_claim_next(claimer, 0, [16, 16], [50.0, 50.0])  # a tie: the lower rank is the fastest


def test_a_total_the_batch_maxes_cannot_hold_is_said_where_it_happens(caplog) -> None:
    with caplog.at_level("WARNING", logger="rsnet.parallel.batching"):
        sizes = fit_total(100, [48, 48], [50.0, 50.0], 8, [40, 40], 8)
    assert sizes == [40, 40]
    assert caplog.records[0].getMessage().startswith(
        "batch sizes [40, 40] add up to 80, not the total batch of 100: the workers' batch_max ([40, 40])")
    caplog.clear()
    with caplog.at_level("WARNING", logger="rsnet.parallel.batching"):
        assert fit_total(100, [48, 48], [50.0, 50.0], 8, [64, 64], 8) == [52, 48]
    assert caplog.records == []
