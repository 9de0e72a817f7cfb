"""Properties of the adaptive scheduler over many configurations, without processes.

W real :class:`AdaptiveStrategy` objects share one in-memory store and claim batches as W devices of the
given speeds would (the worker whose simulated clock is lowest claims next); after every interval each
gets the same merged table through :meth:`AdaptiveStrategy.adapt`, as the merge gives it. There is no
process group at all, so these runs also show that claiming never issues a collective: the only
communication points are ``end_interval`` and ``end_epoch``, which the simulation replaces.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import rsnet.parallel.strategies.base as strategy_base
from helpers import DictStore, trainer_config
from rsnet.parallel import WorkerContext, build_strategy
from rsnet.parallel.batching import epoch_permutation

SEED = 3


def _context(rank: int, world: int, store: DictStore) -> WorkerContext:
    return WorkerContext(rank=rank, world_size=world, device=torch.device("cpu"), store=store,
                         is_primary=rank == 0, devices=["cpu"] * world)


def _build(trainer: dict, ctx: WorkerContext, num_samples: int, total_batch: int):
    """A strategy as worker ``ctx.rank``'s process builds it: its store keys are numbered by how many strategies
    the process built before (the same on every worker), so here every simulated worker counts from zero."""
    strategy_base._instances = 0
    return build_strategy(trainer, ctx, nn.Linear(1, 1), num_samples, total_batch, SEED)


def simulate(speeds: list[float], total_batch: int, merge_rounds: int, num_samples: int, epochs: int = 3):
    """Run the adaptive scheduler's claiming and control as ``len(speeds)`` devices of those speeds (samples/s)
    would; returns (claims as (epoch, rank, Claim) in store order, total batch after every merge, strategies).
    B stays ``total_batch`` (share_min=0) and every worker is kept (leave_out=false): these are properties of the
    claiming and the controller."""
    world, store = len(speeds), DictStore()
    trainer = trainer_config("adaptive", merge_rounds=merge_rounds, merge_cost_max=0, share_min=0, leave_out=False,
                             log_intervals=False)
    strategies = [_build(trainer, _context(rank, world, store), num_samples, total_batch) for rank in range(world)]
    for strategy in strategies:  # the speed probes' exchange (merge 0), as the table of a collective gives it
        strategy.speed = speeds[strategy.rank]
        strategy.schedule.start(speeds)
    claims, totals, known = [], [], list(speeds)
    for epoch in range(epochs):
        plans = [strategy.intervals(epoch) for strategy in strategies]
        while (interval := _same(next(plan, None) for plan in plans)) is not None:
            streams = [strategy.claims(interval) for strategy in strategies]
            clock, samples, updates, active = [0.0] * world, [0] * world, [0] * world, set(range(world))
            while active:
                rank = min(active, key=lambda r: (clock[r], r))
                claim = next(streams[rank], None)
                if claim is None:
                    active.discard(rank)
                    continue
                claims.append((epoch, rank, claim))
                clock[rank] += len(claim.indices) / speeds[rank]
                samples[rank] += len(claim.indices)
                updates[rank] += 1
                # trained before it claims again
                strategies[rank].after_step(len(claim.indices), len(claim.indices) / speeds[rank])
            known = [samples[r] / clock[r] if clock[r] else known[r] for r in range(world)]
            table = {"n": samples, "s": known, "b": [s.batch_size for s in strategies], "updates": updates,
                     "compute": clock, "batch_max": [s.batch_max for s in strategies], "w": [1.0] * world,
                     "comm": [0.0] * world}
            for strategy in strategies:
                strategy.speed = known[strategy.rank]
                strategy.adapt(table)
                strategy._reset_counters()
            assert all(s.sizes == strategies[0].sizes for s in strategies)  # every worker computes the same sizes
            totals.append(sum(strategies[0].sizes))
    return claims, totals, strategies


def _same(values):
    """The one value every worker's interval plan gives (they must agree)."""
    distinct = set(values)
    assert len(distinct) == 1, distinct
    return distinct.pop()


CASES = [(world, ratio, batch, rounds)
         for world, ratio, batch, rounds in itertools.product((1, 2, 3, 4), (1.0, 2.0, 10.0), (8, 32, 100, 256),
                                                              (1, 4, 16))
         if world * 4 <= batch]


@pytest.mark.parametrize("world, ratio, total_batch, rounds", CASES)
def test_every_sample_once_no_small_batch_total_kept_one_clock(world: int, ratio: float, total_batch: int,
                                                               rounds: int) -> None:
    num_samples, epochs = 300, 3
    speeds = [1.0 + (ratio - 1.0) * r / max(world - 1, 1) for r in range(world)]  # 1 ... ratio
    claims, totals, _ = simulate(speeds, total_batch, rounds, num_samples, epochs)
    assert totals and all(total == total_batch for total in totals)
    for epoch in range(epochs):
        mine = [claim for e, _, claim in claims if e == epoch]
        indices = [i for claim in mine for i in claim.indices.tolist()]
        assert sorted(indices) == list(range(num_samples))  # every training sample exactly once
        assert min(len(claim.indices) for claim in mine) >= 4  # no batch below batch_min
        if world == 1:  # nor, alone, below half the batch (a whole epoch shorter than that is one batch)
            assert min(len(claim.indices) for claim in mine) >= min(total_batch // 2, num_samples)
        # One clock: a batch's lr position is where its first sample stands in the epoch's shared order,
        # whichever worker trains it, so positions rise in claim order on every worker alike.
        order = epoch_permutation(num_samples, SEED, epoch).tolist()
        positions = [claim.position for claim in mine]
        assert positions == [epoch + order.index(int(claim.indices[0])) / num_samples for claim in mine]
        assert positions == sorted(positions) and epoch <= positions[0] and positions[-1] < epoch + 1


def test_a_single_workers_epoch_never_ends_in_a_scrap_of_a_batch() -> None:
    """900 images at B = 32 train as 27 batches of 32 and one of 36, not 28 and a batch of 4 (a train-mode step on 4
    images moves the batch-norm statistics the model carries into its evaluation)."""
    claims, _, _ = simulate([1.0], 32, 2, 900, epochs=1)
    assert [len(claim.indices) for _, _, claim in claims] == [32] * 27 + [36]


@pytest.mark.parametrize("total_batch", [8, 32, 100, 256])
def test_a_single_worker_claims_two_batch_sizes_at_most_so_compile_specialises(total_batch: int) -> None:
    """compile=true compiles for static shapes, once per size, where the strategy says its sizes are fixed."""
    claims, _, strategies = simulate([1.0], total_batch, 4, 900, epochs=3)
    assert strategies[0].fixed_batch_sizes
    assert len({len(claim.indices) for _, _, claim in claims}) <= 2


def test_several_workers_claim_batches_of_sizes_that_follow_the_speeds_so_compile_is_dynamic() -> None:
    claims, _, strategies = simulate([1.0, 2.0, 3.0], 96, 4, 900, epochs=3)
    assert not any(strategy.fixed_batch_sizes for strategy in strategies)
    sizes = [{len(claim.indices) for _, rank, claim in claims if rank == worker} for worker in range(3)]
    # the equal split (32) until the first merge, then sizes in proportion to the speeds, and an interval's end
    assert [sorted(mine) for mine in sizes] == [[16, 32], [20, 32], [32, 48]]


@pytest.mark.parametrize("world, total_batch", [(9, 32), (5, 16), (7, 24)])
def test_bounds_that_cannot_add_up_to_the_total_batch_are_refused(world: int, total_batch: int) -> None:
    with pytest.raises(ValueError, match=f"batch_size={total_batch} is too small for {world} workers"):
        simulate([1.0] * world, total_batch, 4, 100)


def test_fast_worker_gets_the_larger_share_and_updates_balance() -> None:
    claims, _, strategies = simulate([1.0, 10.0], 256, 4, 3000, epochs=2)
    assert strategies[0].sizes == [24, 232]  # 23.3 / 232.7 on the grid of 8 (232 + 24 = B)
    late = [(rank, claim) for epoch, rank, claim in claims if epoch == 1]
    assert [sum(1 for rank, _ in late if rank == r) for r in range(2)] == [11, 12]  # the second epoch's updates


def test_static_strategies_share_one_clock() -> None:
    """sync / local_sgd: step k of an epoch is at k·B / N_padded on every worker."""
    for name in ("local_sgd",):  # sync wraps the model in DDP, which needs a process group
        world, store = 3, DictStore()
        strategies = [_build(trainer_config(name, average_every=2), _context(r, world, store), 100, 24)
                      for r in range(world)]
        per_worker = []
        for strategy in strategies:
            positions = []
            for interval in range(strategy.start_epoch(1)):
                positions += [claim.position for claim in strategy.claims(interval)]
            per_worker.append(positions)
        assert per_worker[0] == per_worker[1] == per_worker[2]
        assert per_worker[0][0] == 1.0 and all(1.0 <= p < 2.0 for p in per_worker[0])


def _claim_round_robin(strategies: list, interval: int) -> list:
    """Every claim of the workers' ``interval``, the workers taking turns, each training a batch before it claims
    again."""
    streams = [strategy.claims(interval) for strategy in strategies]
    claims, active = [], list(range(len(streams)))
    while active:
        for rank in list(active):
            claim = next(streams[rank], None)
            if claim is None:
                active.remove(rank)
                continue
            claims.append(claim)
            strategies[rank].after_step(len(claim.indices), None)
    return claims


def test_every_sample_of_an_epoch_once_across_a_lost_worker() -> None:
    """Three workers merge the epoch's first two intervals and are claiming the third when one is lost: the claims
    in flight go with it (the survivors go back to the last merge). Two survivors, as new processes with a new store,
    go on from the commit's position: the epoch's samples in the model that goes on are its permutation, each once."""
    n, epoch, trainer = 200, 1, trainer_config("adaptive", merge_rounds=1, merge_cost_max=0, share_min=0,
                                               leave_out=False, log_intervals=False)
    store = DictStore()
    before = [_build(trainer, _context(rank, 3, store), n, 48) for rank in range(3)]
    for strategy in before:
        strategy.schedule.start([1.0] * 3)
    plans, merged = [strategy.intervals(epoch) for strategy in before], []
    for _ in range(2):  # two intervals merged: the commit holds them
        interval = _same(next(plan) for plan in plans)
        merged += _claim_round_robin(before, interval)
    position = _same(strategy._interval.high for strategy in before)
    interval = _same(next(plan) for plan in plans)
    in_flight = [next(strategy.claims(interval)) for strategy in before]  # claimed, never merged: lost
    assert position == 96 and all(len(claim.indices) for claim in in_flight)

    store = DictStore()  # the survivors' launch: a new rendezvous and store
    after = [_build(trainer, _context(rank, 2, store), n, 48) for rank in range(2)]
    for strategy in after:
        strategy.schedule.start([1.0] * 2)
        strategy.resume_within_epoch(position)
    plans, resumed = [strategy.intervals(epoch) for strategy in after], []
    while (interval := _same(next(plan, None) for plan in plans)) is not None:
        resumed += _claim_round_robin(after, interval)
    trained = torch.cat([claim.indices for claim in merged + resumed]).tolist()
    assert sorted(trained) == list(range(n))  # every sample once: none dropped, none twice
    assert torch.cat([c.indices for c in merged]).tolist() == epoch_permutation(n, SEED, epoch)[:position].tolist()
    assert min(claim.position for claim in resumed) == pytest.approx(epoch + position / n)  # the lr's clock goes on
    assert next(after[0].intervals(epoch + 1)) == 0 and after[0]._interval.low == 0  # the next epoch from its start
