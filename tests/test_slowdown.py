"""The simulated slowdown (trainer.slowdown) is a mixin on the slowed worker's strategy, not code every strategy
carries: the plain strategies never sleep; a slowed one stretches each step by its factor and reports the
stretched times to the strategy, as a slower device would."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from rsnet.parallel import WorkerContext
from rsnet.parallel.strategies import STRATEGIES, Strategy, SyncStrategy, build_strategy, register_strategy
from rsnet.parallel.strategies import slowdown as slowdown_module
from rsnet.parallel.strategies.slowdown import SimulatedSlowdown, slowed


class Recording(Strategy):
    """Records what the strategy sees: each timed step's (seconds, own) and each interval's compute time."""

    name = "recording"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[float, float]] = []
        self.intervals: list[float] = []

    def _timed_step(self, batch_size: int, seconds: float, own: float) -> None:
        self.steps.append((seconds, own))

    def end_interval(self, compute_seconds: float) -> None:
        super().end_interval(compute_seconds)
        self.intervals.append(compute_seconds)


def context(slowdowns: list[float]) -> WorkerContext:
    return WorkerContext(rank=0, world_size=1, device=torch.device("cpu"), store=None, is_primary=True,
                         slowdowns=slowdowns)


def recording(strategy: type[Strategy], slowdowns: list[float]) -> Recording:
    return strategy({"batch_min": 1}, context(slowdowns), nn.Linear(2, 2), 64, 8, 0)


def _recorded_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The slowdown's sleeps, recorded instead of slept: what the strategy sees is computed from the sleep asked for,
    never measured, so no outcome needs the time to pass."""
    sleeps: list[float] = []
    monkeypatch.setattr(slowdown_module, "time", SimpleNamespace(sleep=sleeps.append))
    return sleeps


def test_a_plain_strategy_sees_the_loops_times_and_never_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = _recorded_sleeps(monkeypatch)
    plain = recording(Recording, [1.0])
    plain.after_step(8, 0.05)
    assert sleeps == []
    plain.end_interval(0.05)
    assert plain.steps == [(0.05, 0.05)] and plain.intervals == [0.05] and not plain.needs_step_seconds


def test_a_slowed_strategy_sleeps_and_sees_its_steps_stretched_by_the_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = _recorded_sleeps(monkeypatch)
    slow = recording(slowed(Recording), [3.0])
    assert isinstance(slow, Recording) and isinstance(slow, SimulatedSlowdown) and slow.name == "recording"
    assert slow.needs_step_seconds  # each step's own time is needed to sleep in proportion to it
    slow.after_step(8, 0.05)
    assert sleeps == [pytest.approx(0.1)]  # (3 - 1) x 0.05 s
    slow.end_interval(0.05)
    assert slow.steps == [pytest.approx((0.15, 0.15))] and slow.intervals == [pytest.approx(0.15)]
    slow.end_interval(0.02)  # the sleep is counted in the interval it happened in, once
    assert slow.intervals[-1] == pytest.approx(0.02) and slow._n == 8


def test_build_strategy_mixes_the_slowdown_in_only_where_a_worker_is_slowed() -> None:
    register_strategy(Recording)
    try:
        trainer = {"name": "recording", "batch_min": 1}
        plain = build_strategy(trainer, context([1.0]), nn.Linear(2, 2), 64, 8, 0)
        slow = build_strategy(trainer, context([2.0]), nn.Linear(2, 2), 64, 8, 0)
    finally:
        del STRATEGIES["recording"]
    assert type(plain) is Recording and type(slow) is slowed(Recording) and slowed(Recording) is slowed(Recording)
    assert not any(issubclass(cls, SimulatedSlowdown) for cls in STRATEGIES.values())  # the registry is untouched
    with pytest.raises(ValueError, match="trainer.batch_min=0"):  # a slowed strategy checks its settings too
        slowed(SyncStrategy).check_config({"name": "sync", "batch_min": 0, "interval_steps": 16}, 32, 1)
