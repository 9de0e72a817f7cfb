"""Discrete-event simulator of the parallel strategies (adaptive, sync, a static split, the fastest device alone) for
2 to 64 workers.

It drives the scheduler's real code (:mod:`rsnet.parallel.batching`: claims through ``IntervalClaimer`` over a
simulated store, the speed probe, the paced first claims and the claiming rule, the speed estimate, the batch-size controller,
``fit_total``, ``static_batches``; called through the module, so a test can replace one; and the
:class:`~rsnet.parallel.schedule.Schedule` every adaptive worker moves on after a merge: B, sizes, cadence,
admission) with cost models in place of devices:

* a worker's step on b samples takes t(b) = a + c·b seconds (:class:`DeviceProfile`); a simulated slowdown s
  multiplies a and c (the real one sleeps (s − 1) × the step's compute time after every step);
* every store call (a claim, or a read of the counter) costs one round trip; as in training with ``prefetch: true``,
  a worker claims its next batch when it starts the current one where
  :func:`~rsnet.parallel.batching.may_claim` allows, else when the current one is done (if at all); before its speed is
  known it claims a probe of batch_min, then :func:`~rsnet.parallel.batching.paced_claim_size`; such a probe interval
  offers the rest of the epoch and ends once every prober has timed a step (the others train meanwhile);
* an all-reduce of n bytes over W workers costs 2(W − 1)/W · n / bandwidth + W · latency per bucket (a ring over
  the slowest :class:`Link`); computation and communication never overlap (DDP overlaps its gradient all-reduce
  with the backward pass, so sync's figures here are a lower bound);
* a merge interval ends when the last worker finishes its last batch; everyone waits for it, then merges.

The run is deterministic: no noise is added to the step times.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rsnet.parallel import batching
from rsnet.parallel.merge import BUCKET_BYTES
from rsnet.parallel.schedule import Schedule, ScheduleSettings, claimed_span, next_interval, resolve_multiple
from rsnet.parallel.strategies.adaptive import META_FIELDS

DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's default bucket_cap_mb
GPU_STEP_OVERHEAD_S = 0.005  # assumed fixed cost of a GPU step (launches, optimizer step, host sync) besides images
COMM_SHARE_TARGET = 0.05


@dataclass(frozen=True)
class DeviceProfile:
    """One worker's step time t(b) = a + c·b seconds, and ``first_step`` more for its first step of the run (memory
    allocation, kernel selection); ``source`` says where the figures come from."""

    name: str
    a: float
    c: float
    source: str = ""
    first_step: float = 0.0

    def step_seconds(self, batch: float) -> float:
        return self.a + self.c * batch if batch > 0 else 0.0

    def speed(self, batch: float) -> float:
        """Samples per second at batch size ``batch``."""
        return batch / self.step_seconds(batch)

    def slowed(self, factor: float) -> DeviceProfile:
        """This device with the simulated slowdown ``factor`` (``trainer.slowdown``): 1/factor of its speed."""
        return replace(self, name=f"{self.name} at 1/{factor:g}", a=self.a * factor, c=self.c * factor,
                       first_step=self.first_step * factor)


def gpu_profile(name: str, images_per_s: float, batch: int, source: str) -> DeviceProfile:
    """A GPU from a published training throughput at ``batch``: t(b) = a + c·b with the assumed overhead a
    (GPU_STEP_OVERHEAD_S) and c chosen so that t(batch) = batch / images_per_s."""
    return DeviceProfile(name, GPU_STEP_OVERHEAD_S, 1.0 / images_per_s - GPU_STEP_OVERHEAD_S / batch, source)


def fit_profile(name: str, batches: Sequence[float], seconds: Sequence[float], source: str = "") -> DeviceProfile:
    """Least-squares t(b) = a + c·b through measured step times (a is kept >= 0)."""
    mean_b, mean_t = statistics.mean(batches), statistics.mean(seconds)
    c = (sum((b - mean_b) * (t - mean_t) for b, t in zip(batches, seconds))
         / sum((b - mean_b) ** 2 for b in batches))
    return DeviceProfile(name, max(mean_t - c * mean_b, 0.0), c, source)


# Measured here on 2026-11-23 01:26 UTC with `python benchmarks/sim_scheduler.py --measure-cpu` (2 cores, otherwise
# idle at the time): the real training step (rsnet's baseline model, 21 classes, its loss, the timm SGD of
# conf/config.yaml) on random images, one torch thread, least squares over the fastest of 5 (3) steps per batch size.
CPU_RESNET18_64 = DeviceProfile("cpu resnet18 64px", a=0.03139, c=0.006819,
                                source="measured here: resnet18 at 64 px, 1 thread, batches 8/16/24/32 (2026-11-25)")
CPU_RESNET50_224 = DeviceProfile("cpu resnet50 224px", a=0.1204, c=0.4227,
                                 source="measured here: resnet50 at 224 px, 1 thread, batches 1/2/3/4")
STORE_RTT_LOCAL_S = 22e-6  # measured here: median round trip of TCPStore.add on 127.0.0.1
STORE_RTT_LAN_S = 200e-6  # assumed: the store on another host of the cluster's network

# ResNet-50 v1.5 training, 1 GPU, mixed precision, batch 256: NVIDIA DeepLearningExamples,
# PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance results" (pytorch-21.03 NGC
# container): DGX A100 80GB 2470 img/s, DGX-1 V100 16GB 1200 img/s.
_NVIDIA_RN50 = "NVIDIA DeepLearningExamples resnet50v1.5 PyTorch README, AMP, batch 256"
A100 = gpu_profile("A100", 2470, 256, f"{_NVIDIA_RN50}: 2470 img/s")
V100 = gpu_profile("V100", 1200, 256, f"{_NVIDIA_RN50}: 1200 img/s")


@dataclass(frozen=True)
class Link:
    """The slowest link of the all-reduce ring: bandwidth in bytes/s (per direction), latency per hop in s."""

    name: str
    bandwidth: float
    latency: float


# Assumptions (not measured here): effective all-reduce bandwidths, below the links' nominal rates.
NVLINK = Link("NVLink in one 8-GPU node", 200e9, 10e-6)
INFINIBAND = Link("100 Gb/s InfiniBand between nodes", 12.5e9, 5e-6)
ETHERNET_10G = Link("10 Gb/s Ethernet between hosts", 1.25e9, 50e-6)
LOOPBACK = Link("gloo over TCP on one host", 2e9, 50e-6)
# Measured here on 2026-11-23 07:13 UTC with `python benchmarks/sim_scheduler.py --measure-cpu` (measure_loopback):
# 2 gloo processes with one torch thread each on the 2-core development host, median all-reduce of 1 / 4 / 12 / 25 MiB
# in 1.4 / 4.8 / 10.2 / 21.5 ms, least squares. The validations against the benchmarks run there use it; LOOPBACK
# stays the assumption for a host with cores to spare.
LOOPBACK_2_CORES = Link("gloo, 2 processes on the 2-core development host", 2.47e9, 423e-6)


def ring_allreduce_seconds(nbytes: float, world: int, link: Link) -> float:
    """One ring all-reduce of ``nbytes``: 2(W − 1)/W · nbytes / bandwidth + W · latency (0 for one worker)."""
    if world <= 1:
        return 0.0
    return 2 * (world - 1) / world * nbytes / link.bandwidth + world * link.latency


def bucketed_allreduce_seconds(nbytes: float, world: int, link: Link, bucket_bytes: int) -> float:
    """All-reduces of ``nbytes`` cut into buckets of at most ``bucket_bytes``, one after the other."""
    full, rest = divmod(int(nbytes), bucket_bytes)
    buckets = [bucket_bytes] * full + ([rest] if rest else [])
    return sum(ring_allreduce_seconds(size, world, link) for size in buckets)


@dataclass(frozen=True)
class ModelSpec:
    """What a model sends: float32 parameters and floating buffers (merged), integer buffers (in the header)."""

    name: str
    params: int
    float_buffers: int
    int_buffers: int

    @property
    def merge_bytes(self) -> int:
        return 4 * (self.params + self.float_buffers)

    @property
    def gradient_bytes(self) -> int:
        return 4 * self.params


# Counted with timm 1.0.31: the ImageNet models (1000 classes) that the GPU figures are for, and rsnet's baseline
# (backbone, pooling, linear head) with the 21 classes of UC Merced.
RESNET50 = ModelSpec("resnet50 (1000 classes)", 25_557_032, 53_120, 53)
RESNET18_21 = ModelSpec("baseline resnet18 (21 classes)", 11_187_285, 9_600, 20)
TEST_RESNET_21 = ModelSpec("baseline test_resnet (21 classes)", 374_725, 2_080, 15)


def merge_seconds(model: ModelSpec, world: int, link: Link, tensors: bool = True) -> float:
    """One normalized merge (rsnet.parallel.merge): the float64 header (weight, count, the per-worker meta table,
    integer buffers), then (``tensors``) the parameters and floating buffers in buckets of at most
    merge.BUCKET_BYTES."""
    header = 8 * (2 + len(META_FIELDS) * world + model.int_buffers)
    return (ring_allreduce_seconds(header, world, link)
            + (bucketed_allreduce_seconds(model.merge_bytes, world, link, BUCKET_BYTES) if tensors else 0.0))


def gradient_allreduce_seconds(model: ModelSpec, world: int, link: Link) -> float:
    """DDP's all-reduce of the gradients of one step (buckets of DDP_BUCKET_BYTES)."""
    return bucketed_allreduce_seconds(model.gradient_bytes, world, link, DDP_BUCKET_BYTES)


def comm_threshold_interval(merge_s: float, rate: float, share: float = COMM_SHARE_TARGET) -> int:
    """The smallest merge interval M (samples) whose merge takes less than ``share`` of the wall time when the
    workers together train ``rate`` samples/s between merges: merge_s / (M / rate + merge_s) < share."""
    return math.floor(merge_s * rate * (1 - share) / share) + 1


@dataclass(frozen=True)
class SimSettings:
    """The trainers' settings as a run composes them: adaptive's schedule (conf/trainer/adaptive.yaml), its speed EMA,
    sync's batch_min (conf/trainer/sync.yaml) and the static split's bounds and grid (conf/trainer/static.yaml)."""

    schedule: ScheduleSettings
    speed_ema: float
    sync_batch_min: int
    static_batch_min: int
    static_multiple: str | int

    @classmethod
    def from_configs(cls, adaptive: Mapping[str, Any], sync: Mapping[str, Any], static: Mapping[str, Any],
                     batch_size: int) -> SimSettings:
        return cls(ScheduleSettings.from_config(adaptive, batch_size), float(adaptive["speed_ema"]),
                   int(sync["batch_min"]), int(static["batch_min"]), static["batch_multiple"])

    def with_batch(self, batch_size: int) -> SimSettings:
        """The same settings for a run of ``batch_size``."""
        return replace(self, schedule=replace(self.schedule, batch_size=int(batch_size)))


@dataclass(frozen=True)
class Scenario:
    """Devices, model, link and schedule of one simulated run (``samples`` per epoch; the batch size is
    ``settings.schedule.batch_size``)."""

    name: str
    devices: tuple[DeviceProfile, ...]
    model: ModelSpec
    link: Link
    samples: int
    epochs: int
    settings: SimSettings
    store_rtt: float = STORE_RTT_LAN_S
    prefetch: bool = True

    @property
    def world(self) -> int:
        return len(self.devices)

    @property
    def total_batch(self) -> int:
        """The run's batch_size (sync's B; adaptive's B may be larger, :func:`schedule.round_batch`)."""
        return self.settings.schedule.batch_size

    @property
    def equal_split(self) -> list[int]:
        """The static strategies' initial equal split of B (batching.initial_batch_sizes)."""
        s = self.settings
        multiple = resolve_multiple(s.static_multiple, self.total_batch, self.world)
        return batching.initial_batch_sizes(self.total_batch, self.world, s.static_batch_min, s.schedule.batch_max,
                                            multiple)


def build_scenario(name: str, devices: Sequence[DeviceProfile], model: ModelSpec, link: Link, worker_batch: int,
                   settings: SimSettings, intervals: int = 40, store_rtt: float = STORE_RTT_LAN_S) -> Scenario:
    """B = worker_batch · W, one epoch of ``intervals`` merge intervals of the configured rounds of B."""
    total = worker_batch * len(devices)
    return Scenario(name, tuple(devices), model, link, total * settings.schedule.merge_rounds * intervals, 1,
                    settings.with_batch(total), store_rtt)


def update_balance(updates: Sequence[float], active: Sequence[bool] | None = None) -> float | None:
    """Fewest over most optimizer updates among the workers active at the end (all where ``active`` is not given)
    that trained: a worker left out is not counted, whatever it trained before. None where no one trained. The
    simulator and bench_scheduler.py both count it so."""
    flags = active or [True] * len(updates)
    trained = [u for u, on in zip(updates, flags) if on and u > 0]
    return min(trained) / max(trained) if trained else None


@dataclass
class RunResult:
    """Totals of one simulated run; per-worker lists are indexed by rank."""

    strategy: str
    samples: int
    wall_s: float = 0.0
    comm_s: float = 0.0
    compute_s: list[float] = field(default_factory=list)
    updates: list[int] = field(default_factory=list)
    worker_samples: list[int] = field(default_factory=list)
    sizes: list[list[int]] = field(default_factory=list)  # batch sizes per merge interval (adaptive) or the fixed ones
    interval_updates: list[list[int]] = field(default_factory=list)  # adaptive: per merge interval and worker
    notes: list[str] = field(default_factory=list)  # adaptive: what the schedule logged (workers left out, cadence)
    active: list[bool] = field(default_factory=list)  # adaptive: the workers still training at the end
    rounds: int = 0  # adaptive: rounds of B between merges at the end
    round_batch: int = 0  # adaptive: B at the end

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s

    @property
    def idle(self) -> list[float]:
        """Each worker's fraction of the wall time spent neither computing nor communicating (waiting)."""
        return [max(self.wall_s - busy - self.comm_s, 0.0) / self.wall_s for busy in self.compute_s]

    @property
    def update_balance(self) -> float:
        """:func:`update_balance` of the run; sync and the static split update every worker at every step: 1."""
        balance = update_balance(self.updates, self.active)
        return 1.0 if balance is None else balance

    @property
    def comm_share(self) -> float:
        return self.comm_s / self.wall_s

    def add_steps(self, compute: Sequence[float], samples: Sequence[float], updates: Sequence[int]) -> None:
        world = len(compute)
        self.compute_s = [x + y for x, y in zip(self.compute_s or [0.0] * world, compute)]
        self.worker_samples = [x + y for x, y in zip(self.worker_samples or [0] * world, samples)]
        self.updates = [x + y for x, y in zip(self.updates or [0] * world, updates)]


class SimStore:
    """The c10d store's atomic counter (``add``), counting calls so that the event loop can charge round trips."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.calls = 0

    def add(self, key: str, amount: int) -> int:
        self.calls += 1
        self.values[key] = self.values.get(key, 0) + int(amount)
        return self.values[key]


@dataclass
class _Interval:
    """Per-worker figures of one merge interval; ``finish``: when the worker is ready to merge; ``warmup``: the
    samples and seconds of the worker's first step of the run if it fell in this interval (not a measure of its
    speed, as in AdaptiveStrategy)."""

    samples: list[int]
    updates: list[int]
    compute: list[float]
    finish: list[float]
    warmup: list[tuple[int, float]]
    end: int = 0  # the end of the last claim (the positions the interval used)

    def measured(self, rank: int) -> tuple[float, float]:
        """Samples and seconds that measure worker ``rank``'s speed: the interval's, less its first step."""
        return self.samples[rank] - self.warmup[rank][0], self.compute[rank] - self.warmup[rank][1]


def _run_interval(scenario: Scenario, sizes: list[int], speeds: list[float], store: SimStore, key: str,
                  size: int, start: float, warmed: list[bool], probers: int = 0) -> _Interval:
    """Every active worker (size > 0) claims and trains batches of one interval (as AdaptiveStrategy.claims with the
    prefetcher: the next claim is made when a batch starts), in the order of the claims' times. ``warmed``: which
    workers have trained their first step (updated); ``probers``: the workers of unknown speed (a probe interval
    ends for everyone once each of them has timed a step)."""
    world, minimum = scenario.world, scenario.settings.schedule.batch_min
    claimers = [batching.IntervalClaimer(store, key, size, minimum) for _ in range(world)]
    tally = _Interval([0] * world, [0] * world, [0.0] * world, [start] * world, [(0, 0.0)] * world)
    probed: dict[int, float] = {}  # prober -> when its first timed step ends
    events = [(start, rank) for rank in range(world) if sizes[rank] > 0]
    while events:
        now, rank = heapq.heappop(events)
        if probers and len(probed) >= probers and max(probed.values()) <= now:
            tally.finish[rank] = max(tally.finish[rank], now)
            continue  # every prober has its measure: the probe interval ends
        calls = store.calls
        free = now >= tally.finish[rank]
        if free and speeds[rank] > 0 and not batching.may_claim(claimers[rank], rank, sizes, speeds, False):
            continue  # the others train the rest sooner
        size = sizes[rank]
        if speeds[rank] <= 0 and sum(1 for b in sizes if b > 0) > 1:  # unknown speed: a probe, then paced claims
            claimer = claimers[rank]
            timed_n, timed_s = tally.measured(rank)
            size = min(minimum, size) if not tally.updates[rank] else batching.paced_claim_size(
                size, minimum, claimer.remaining(), timed_n / timed_s if timed_s > 0 else 0.0,
                (claimer.seen - tally.samples[rank]) / max(now - start, 1e-12))
        span = claimers[rank].claim(size) if size else None
        ready = now + scenario.store_rtt * (store.calls - calls)
        if span is None:
            tally.finish[rank] = max(tally.finish[rank], ready)
            continue
        count, tally.end = span[1] - span[0], max(tally.end, span[1])
        begin = max(ready, tally.finish[rank])
        device = scenario.devices[rank]
        seconds = device.step_seconds(count) + (0.0 if warmed[rank] else device.first_step)
        tally.finish[rank] = begin + seconds
        tally.samples[rank] += count
        tally.updates[rank] += 1
        tally.compute[rank] += seconds
        if not warmed[rank]:
            tally.warmup[rank], warmed[rank] = (count, seconds), True
        elif probers and speeds[rank] <= 0 and rank not in probed:
            probed[rank] = tally.finish[rank]
        ahead = scenario.prefetch and batching.may_claim(claimers[rank], rank, sizes, speeds, computing=True)
        heapq.heappush(events, (begin if ahead else tally.finish[rank], rank))
    return tally


def cosine_lr_ratio(progress: float) -> float:
    """The default lr schedule over its peak at ``progress`` (0..1) of the run: cosine to 1 % (warm-up left out);
    the simulated cadence follows it as the trainer's does (``merge_rounds_max``)."""
    return 0.01 + 0.99 * 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


def simulate_adaptive(scenario: Scenario) -> RunResult:
    """The adaptive strategy: dynamic claims per merge interval, a merge at every interval's end (only the small
    table once a single worker trains, and the model handed over at the end of every epoch then), and the real
    :class:`~rsnet.parallel.schedule.Schedule` moved on by every merge's table."""
    world = scenario.world
    schedule = Schedule(scenario.settings.schedule, world)
    schedule.follow_lr(lambda position: cosine_lr_ratio(position / scenario.epochs), scenario.epochs)
    speeds, comm, warmed = [0.0] * world, 0.0, [False] * world
    store = SimStore()
    result = RunResult("adaptive", scenario.samples * scenario.epochs)
    for epoch in range(scenario.epochs):
        start, index = 0, 0
        while start < scenario.samples:
            size = schedule.interval_at(epoch + start / scenario.samples, scenario.samples - start)
            low, high = next_interval(start, scenario.samples, size, max(schedule.settings.batch_min, size // 2))
            tally = _run_interval(scenario, list(schedule.sizes), schedule.speeds_of_active(), store,
                                  f"e{epoch}/i{index}", high - low, result.wall_s, warmed, schedule.probers)
            start = low + claimed_span(low, high, tally.end)
            index += 1
            merge_s = merge_seconds(scenario.model, world, scenario.link, tensors=schedule.workers > 1)
            result.wall_s = max(tally.finish) + merge_s
            result.comm_s += merge_s
            result.add_steps(tally.compute, tally.samples, tally.updates)
            result.interval_updates.append(tally.updates)
            result.sizes.append(list(schedule.sizes))
            speeds = [batching.updated_speed(speed, *tally.measured(rank), scenario.settings.speed_ema)
                      for rank, speed in enumerate(speeds)]
            table = {"n": tally.samples, "s": speeds, "b": list(schedule.sizes), "updates": tally.updates,
                     "compute": tally.compute, "batch_max": list(schedule.batch_maxes), "comm": [comm] * world}
            if schedule.workers > 1:
                comm = merge_s
            result.notes += schedule.update(table)
        if schedule.workers == 1 and world > 1:  # the trained replica reaches the workers left out
            handover = merge_seconds(scenario.model, world, scenario.link)
            result.wall_s += handover
            result.comm_s += handover
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


def simulate_sync(scenario: Scenario) -> RunResult:
    """DDP: every worker trains B/W samples a step on its DistributedSampler shard (static_batches cuts it)."""
    world = scenario.world
    batch = max(1, scenario.total_batch // world)
    shard = torch.arange(math.ceil(scenario.samples / world))
    sizes = [len(b) for b in batching.static_batches(shard, batch, min(scenario.settings.sync_batch_min, batch))]
    comm = gradient_allreduce_seconds(scenario.model, world, scenario.link)
    result = _lockstep("sync", scenario, [[b] * world for b in sizes] * scenario.epochs, comm)
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
