"""A run whose devices change (docs/scheduler.md, "Devices that come and go"): a device lost or joining at a share of
the run's samples. Each set of devices is a launch of the adaptive strategy (:func:`~.runs.simulate_adaptive`, its
speed probes included) from the last commit: a loss costs the merge interval in flight and a restart, an arrival is
taken at the next merge and costs a restart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .costs import DeviceProfile
from .runs import simulate_adaptive
from .scenario import RunResult, Scenario


@dataclass(frozen=True)
class Change:
    """At ``at`` (a share of the run's samples), ``device`` leaves the run (``joins`` False) or joins it."""

    at: float
    device: DeviceProfile
    joins: bool = False


@dataclass(frozen=True)
class MembershipRun:
    """The run through its changes: its total wall time, the samples trained again after losses, every launch."""

    wall_s: float
    retrained: int
    launches: tuple[RunResult, ...]

    def samples_per_s(self, samples: int) -> float:
        return samples / self.wall_s


def simulate_membership(scenario: Scenario, changes: Sequence[Change], restart_s: float) -> MembershipRun:
    """``scenario``'s run with its devices changed by ``changes`` (in order of ``at``); each change costs
    ``restart_s`` (the survivors' or the group's start again: measured by benchmarks/bench_lost_worker.py)."""
    total = scenario.samples * scenario.epochs
    devices, start, wall, retrained, launches = list(scenario.devices), 0, 0.0, 0, []
    for change in sorted(changes, key=lambda c: c.at):
        launch = simulate_adaptive(replace(scenario, devices=tuple(devices)), start=start, stop=int(change.at * total),
                                   lost=not change.joins)
        launches.append(launch)
        retrained += 0 if change.joins else int(change.at * total) - launch.committed
        wall += launch.wall_s + restart_s
        start = launch.committed
        if change.joins:
            devices.append(change.device)
        else:
            devices.remove(change.device)
    last = simulate_adaptive(replace(scenario, devices=tuple(devices)), start=start)
    launches.append(last)
    return MembershipRun(wall + last.wall_s, retrained, tuple(launches))
