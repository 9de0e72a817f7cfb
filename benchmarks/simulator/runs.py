"""The strategies simulated on a :class:`~simulator.scenario.Scenario`: adaptive through the scheduler's
own code, sync and the static split as lockstep steps, the fastest device alone; and their comparison."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rsnet.parallel import batching
from rsnet.parallel.speed_probe import PROBE_TIMED_STEPS
from rsnet.parallel.schedule import Schedule, describe
from rsnet.parallel.schedule_rules import next_interval, resolve_multiple
from rsnet.parallel.strategies.adaptive_probes import PROBE_GRACE_MIN_S, PROBE_GRACE_STEPS
from .costs import comm_threshold_interval, gradient_allreduce_seconds, merge_seconds
from .scenario import RunResult, Scenario, SimStore


@dataclass
class _Interval:
    """Per-worker figures of one merge interval; ``finish``: when the worker is ready to merge."""

    samples: list[int]
    updates: list[int]
    compute: list[float]
    finish: list[float]


def _run_interval(scenario: Scenario, sizes: list[int], speeds: list[float], store: SimStore, key: str,
                  size: int, start: float, claim_min: int) -> _Interval:
    """Every active worker (size > 0) claims and trains batches of one interval (as AdaptiveStrategy.claims with the
    prefetcher: the next claim is made when a batch starts where :func:`~rsnet.parallel.batching.may_claim_ahead`
    allows), in the order of the claims' times. ``claim_min``: the smallest claim the interval's rest may form
    (:attr:`~rsnet.parallel.schedule.Schedule.claim_min`)."""
    world = scenario.world
    claimers = [batching.IntervalClaimer(store, key, size, claim_min) for _ in range(world)]
    tally = _Interval([0] * world, [0] * world, [0.0] * world, [start] * world)
    events = [(start, rank) for rank in range(world) if sizes[rank] > 0]
    while events:
        now, rank = heapq.heappop(events)
        calls = store.calls
        free = now >= tally.finish[rank]
        if free and not batching.may_claim_next(claimers[rank], rank, sizes, speeds):
            continue  # the others train the rest sooner
        span = claimers[rank].claim(sizes[rank])
        ready = now + scenario.store_rtt * (store.calls - calls)
        if span is None:
            tally.finish[rank] = max(tally.finish[rank], ready)
            continue
        count = span[1] - span[0]
        begin = max(ready, tally.finish[rank])
        seconds = scenario.devices[rank].step_seconds(count)
        tally.finish[rank] = begin + seconds
        tally.samples[rank] += count
        tally.updates[rank] += 1
        tally.compute[rank] += seconds
        ahead = scenario.prefetch and batching.may_claim_ahead(claimers[rank], rank, sizes, speeds)
        heapq.heappush(events, (begin if ahead else tally.finish[rank], rank))
    return tally


def speed_probes(scenario: Scenario, batch: int) -> tuple[list[float], list[float], float]:
    """Every worker's speed probe at ``batch`` (AdaptiveStrategy's: a first step with the device's one-time costs,
    then PROBE_TIMED_STEPS timed ones, on a thread of its own): when each ends, the speed each measures, and when
    the run starts (merge 0: when all are done, or the grace of PROBE_GRACE_STEPS steps of the first one done)."""
    steps = [device.step_seconds(batch) for device in scenario.devices]
    ends = [device.first_step + (1 + PROBE_TIMED_STEPS) * step for device, step in zip(scenario.devices, steps)]
    first = min(range(scenario.world), key=lambda rank: ends[rank])
    begin = min(max(ends), ends[first] + max(PROBE_GRACE_STEPS * steps[first], PROBE_GRACE_MIN_S))
    return ends, [batch / step for step in steps], begin


def cosine_lr_ratio(progress: float) -> float:
    """The default lr schedule over its peak at ``progress`` (0..1) of the run: cosine to 1 % (warm-up left out);
    the simulated cadence follows it as the trainer's does (``merge_rounds_max``)."""
    return 0.01 + 0.99 * 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


def simulate_adaptive(scenario: Scenario, start: int = 0, stop: int | None = None, lost: bool = False) -> RunResult:
    """The adaptive strategy: the speed probes and merge 0 (:func:`speed_probes`), dynamic claims per merge interval,
    a merge at every interval's end (only the small table once a single worker trains), a merge that hands the model
    to a worker admitted after its probe, and the real :class:`~rsnet.parallel.schedule.Schedule` moved on by every
    merge's table. A launch of a run that changes its devices (:mod:`.membership`) trains from ``start`` (samples of
    the whole run, the commit it goes on from) up to the interval in which ``stop`` falls: merged there, or, where a
    worker is ``lost`` in it, not (its time passes up to ``stop``'s share of it); ``result.committed``: where the next
    launch goes on from."""
    world = scenario.world
    schedule = Schedule(scenario.settings.schedule, world)
    schedule.follow_lr(lambda position: cosine_lr_ratio(position / scenario.epochs), scenario.epochs)
    ends, probed, begin = speed_probes(scenario, schedule.total_batch // world)
    speeds = [speed if end <= begin else 0.0 for speed, end in zip(probed, ends)]
    result = RunResult("adaptive", scenario.samples * scenario.epochs - start)
    result.notes += describe(schedule.start(speeds))
    result.wall_s = begin + merge_seconds(scenario.model, world, scenario.link, tensors=False)
    comm, store = 0.0, SimStore()
    result.committed = start
    for epoch in range(start // scenario.samples, scenario.epochs):
        position, index = start - epoch * scenario.samples if epoch == start // scenario.samples else 0, 0
        while position < scenario.samples:
            size = schedule.interval_at(epoch + position / scenario.samples, scenario.samples - position,
                                        scenario.samples)
            low, high = next_interval(position, scenario.samples, size, max(schedule.settings.batch_min, size // 2))
            tally = _run_interval(scenario, list(schedule.sizes), schedule.speeds_of_active(), store,
                                  f"e{epoch}/i{index}", high - low, result.wall_s, schedule.claim_min)
            position, index = high, index + 1
            crossed = stop is not None and epoch * scenario.samples + high >= stop
            if crossed and lost:  # the interval in flight is lost with the worker, at stop's share of its time
                share = min(max((stop - epoch * scenario.samples - low) / (high - low), 0.0), 1.0)
                result.wall_s += (max(tally.finish) - result.wall_s) * share
                result.samples = result.committed - start
                return result
            merge_s = merge_seconds(scenario.model, world, scenario.link, tensors=schedule.workers > 1)
            result.wall_s = max(tally.finish) + merge_s
            result.comm_s += merge_s
            result.add_steps(tally.compute, tally.samples, tally.updates)
            result.interval_updates.append(tally.updates)
            result.sizes.append(list(schedule.sizes))
            speeds = [probed[rank] if schedule.pending[rank] and ends[rank] <= result.wall_s else
                      batching.updated_speed(speed, tally.samples[rank], tally.compute[rank],
                                             scenario.settings.speed_ema) for rank, speed in enumerate(speeds)]
            table = {"n": tally.samples, "s": speeds, "b": list(schedule.sizes), "updates": tally.updates,
                     "compute": tally.compute, "batch_max": list(schedule.batch_maxes), "comm": [comm] * world}
            if schedule.workers > 1:
                comm = merge_s
            result.notes += describe(schedule.update(table))
            if schedule.joined:  # the admitted workers get the trained model
                handover = merge_seconds(scenario.model, world, scenario.link)
                result.wall_s += handover
                result.comm_s += handover
            result.committed = epoch * scenario.samples + high
            if crossed:  # a device arrives: this launch ends at the merge
                result.samples = result.committed - start
                return result
    result.active, result.rounds, result.round_batch = list(schedule.active), schedule.rounds, schedule.total_batch
    return result


def simulate_single(scenario: Scenario) -> RunResult:
    """The fastest device alone, training every sample in batches of the run's batch_size (no communication)."""
    fastest = min(range(scenario.world), key=lambda r: scenario.devices[r].step_seconds(scenario.total_batch))
    full, rest = divmod(scenario.samples, scenario.total_batch)
    steps = ([scenario.total_batch] * full + ([rest] if rest else [])) * scenario.epochs
    result = RunResult("single", scenario.samples * scenario.epochs)
    seconds = [scenario.devices[fastest].step_seconds(b) for b in steps]
    seconds[0] += scenario.devices[fastest].first_step
    result.wall_s = sum(seconds)
    result.add_steps([sum(seconds) if r == fastest else 0.0 for r in range(scenario.world)],
                     [sum(steps) if r == fastest else 0 for r in range(scenario.world)],
                     [len(steps) if r == fastest else 0 for r in range(scenario.world)])
    return result


def physical_limit(scenario: Scenario) -> float:
    """Σ s_i / max s_i: the most the devices together can train over the fastest alone (speeds at the equal
    share of the run's batch_size)."""
    share = scenario.total_batch / scenario.world
    speeds = [device.speed(share) for device in scenario.devices]
    return sum(speeds) / max(speeds)


def _lockstep(name: str, scenario: Scenario, steps: Sequence[Sequence[float]], comm_s: float) -> RunResult:
    """Synchronous steps (one batch size per worker each): a step lasts as long as its slowest worker, plus the
    gradient all-reduce."""
    result = RunResult(name, scenario.samples * scenario.epochs)
    for index, batches in enumerate(steps):
        seconds = [device.step_seconds(b) + (device.first_step if index == 0 else 0.0)
                   for device, b in zip(scenario.devices, batches)]
        result.wall_s += max(seconds) + comm_s
        result.comm_s += comm_s
        result.add_steps(seconds, batches, [1 if b > 0 else 0 for b in batches])
    return result


def _equal_shard_batches(scenario: Scenario, batch_min: int) -> tuple[int, list[int]]:
    """The static equal split: B/W a step and the batch sizes of one worker's shard of an epoch (static_batches cuts
    it, as the DistributedSampler shard of sync and local_sgd)."""
    batch = max(1, scenario.total_batch // scenario.world)
    shard = torch.arange(math.ceil(scenario.samples / scenario.world))
    return batch, [len(b) for b in batching.static_batches(shard, batch, min(batch_min, batch))]


def simulate_sync(scenario: Scenario) -> RunResult:
    """DDP: every worker trains B/W samples a step on its DistributedSampler shard (static_batches cuts it)."""
    world = scenario.world
    batch, sizes = _equal_shard_batches(scenario, scenario.settings.sync_batch_min)
    comm = gradient_allreduce_seconds(scenario.model, world, scenario.link)
    result = _lockstep("sync", scenario, [[b] * world for b in sizes] * scenario.epochs, comm)
    result.sizes = [[batch] * world]
    return result


def simulate_local_sgd(scenario: Scenario) -> RunResult:
    """Local SGD (trainer=local_sgd): the equal static shards of sync, but every worker steps on its own and all
    average the replicas (a merge) every H = ``local_average_every`` steps and at the end of every epoch; an
    interval lasts as long as its slowest worker's H steps."""
    world, every = scenario.world, scenario.settings.local_average_every
    batch, sizes = _equal_shard_batches(scenario, scenario.settings.local_batch_min)
    merge = merge_seconds(scenario.model, world, scenario.link)
    result = RunResult("local_sgd", scenario.samples * scenario.epochs)
    first = True
    for _ in range(scenario.epochs):
        for start in range(0, len(sizes), every):
            steps = sizes[start:start + every]
            compute = [sum(device.step_seconds(b) for b in steps) + (device.first_step if first else 0.0)
                       for device in scenario.devices]
            first = False
            result.wall_s += max(compute) + merge
            result.comm_s += merge
            result.add_steps(compute, [sum(steps)] * world, [len(steps)] * world)
    result.sizes = [[batch] * world]
    return result


def static_split(scenario: Scenario) -> list[int]:
    """Batch sizes fixed once, in proportion to each device's speed at the equal split (what a short measurement
    before training would give): proportional_targets, then fit_total to multiples that add up to B."""
    s = scenario.settings
    speeds = [device.speed(b) for device, b in zip(scenario.devices, scenario.equal_split)]
    multiple = resolve_multiple(s.static_multiple, scenario.total_batch, scenario.world)
    return batching.speed_proportional_sizes(speeds, scenario.total_batch, s.static_batch_min, s.schedule.batch_max,
                                             multiple)


def simulate_static(scenario: Scenario, measuring_epochs: int = 0) -> RunResult:
    """Speed-proportional fixed batches, no claiming: every step all workers train their b_i, then all-reduce the
    gradients; an epoch's remainder is one last step at the same proportions. The first ``measuring_epochs``
    train at the equal split, as ``trainer=static`` does while it measures the speeds (0: a short measurement
    before training, as the scale tables assume)."""
    sizes = static_split(scenario)

    def epoch(split: list[int]) -> list[list[float]]:
        full, rest = divmod(scenario.samples, sum(split))
        return [split] * full + ([[b * rest / sum(split) for b in split]] if rest else [])

    measuring = min(measuring_epochs, scenario.epochs)
    steps = epoch(scenario.equal_split) * measuring + epoch(sizes) * (scenario.epochs - measuring)
    comm = gradient_allreduce_seconds(scenario.model, scenario.world, scenario.link)
    result = _lockstep("static", scenario, steps, comm)
    result.sizes = [sizes]
    return result


@dataclass
class Comparison:
    """The strategies on one scenario (and the fastest device alone), and the merge interval above which merges
    cost < 5 % of the time."""

    scenario: Scenario
    adaptive: RunResult
    sync: RunResult
    static: RunResult
    single: RunResult
    threshold: int

    @property
    def ideal(self) -> float:
        """Samples/s of the devices at adaptive's last batch sizes with no waiting and no communication."""
        return sum(d.speed(b) for d, b in zip(self.scenario.devices, self.adaptive.sizes[-1]) if b > 0)

    @property
    def limit(self) -> float:
        """The physical limit over the fastest device alone (:func:`physical_limit`)."""
        return physical_limit(self.scenario)


def compare(scenario: Scenario) -> Comparison:
    adaptive = simulate_adaptive(scenario)
    rate = adaptive.samples / (adaptive.wall_s - adaptive.comm_s)
    threshold = comm_threshold_interval(merge_seconds(scenario.model, scenario.world, scenario.link), rate)
    return Comparison(scenario, adaptive, simulate_sync(scenario), simulate_static(scenario),
                      simulate_single(scenario), threshold)
