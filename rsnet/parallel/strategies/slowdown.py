"""The simulated slowdown (``trainer.slowdown``): :func:`slowed` gives a strategy class whose worker sleeps (factor − 1)
× its own compute time after every step; the strategies see the stretched times as a slower device's."""

from __future__ import annotations

import functools
import time
from typing import Any

from rsnet.parallel.strategies.base import Strategy


class SimulatedSlowdown:
    """Mixed in before a strategy class: every step stretched by ``ctx.slowdown`` (a sleep after the step)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slept = 0.0  # seconds slept in the current interval

    @property
    def needs_step_seconds(self) -> bool:
        """Always: the sleep is in proportion to each step's own compute time."""
        return True

    def _timed_step(self, batch_size: int, seconds: float, own: float) -> None:
        extra = (self.ctx.slowdown - 1.0) * own  # own: the step less its waits for the others (sync's all-reduce)
        if extra > 0:
            time.sleep(extra)
            self._slept += extra
        super()._timed_step(batch_size, seconds + extra, own + extra)

    def end_interval(self, compute_seconds: float) -> None:
        slept, self._slept = self._slept, 0.0
        super().end_interval(compute_seconds + slept)


@functools.cache
def slowed(strategy: type[Strategy]) -> type[Strategy]:
    """``strategy`` with :class:`SimulatedSlowdown` mixed in (same name and registry entry; one class per strategy)."""
    return type(strategy.__name__, (SimulatedSlowdown, strategy), {"__doc__": strategy.__doc__})
