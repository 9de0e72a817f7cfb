"""What the simulator runs and what it reports: the trainers' settings (:class:`SimSettings`), one mix of devices
on a link (:class:`Scenario`), a run's figures (:class:`RunResult`) and the simulated store the workers claim from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rsnet.parallel import batching
from rsnet.parallel.schedule_rules import ScheduleSettings, resolve_multiple
from .costs import STORE_RTT_LAN_S, DeviceProfile, Link, ModelSpec


@dataclass(frozen=True)
class SimSettings:
    """The trainers' settings as a run composes them: adaptive's schedule (conf/trainer/adaptive.yaml), its speed EMA,
    sync's batch_min (conf/trainer/sync.yaml), the static split's bounds and grid (conf/trainer/static.yaml) and
    local SGD's averaging period H and batch_min (conf/trainer/local_sgd.yaml)."""

    schedule: ScheduleSettings
    speed_ema: float
    sync_batch_min: int
    static_batch_min: int
    static_multiple: str | int
    local_average_every: int = 8
    local_batch_min: int = 8

    @classmethod
    def from_configs(cls, adaptive: Mapping[str, Any], sync: Mapping[str, Any], static: Mapping[str, Any],
                     batch_size: int, local_sgd: Mapping[str, Any] | None = None) -> SimSettings:
        local = local_sgd or {"average_every": 8, "batch_min": 8}
        return cls(ScheduleSettings.from_config(adaptive, batch_size), float(adaptive["speed_ema"]),
                   int(sync["batch_min"]), int(static["batch_min"]), static["batch_multiple"],
                   int(local["average_every"]), int(local["batch_min"]))

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
        """The run's batch_size (sync's B; adaptive's B may be larger, :func:`schedule_rules.round_batch`)."""
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
    committed: int = 0  # adaptive: samples of the whole run merged when it ended (a launch of :mod:`.membership`)

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
