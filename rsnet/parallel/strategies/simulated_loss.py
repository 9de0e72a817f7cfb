"""The simulated loss of a worker (``trainer.lose_worker=[rank, epoch, interval]``): :func:`losing` gives a strategy
class whose worker kills itself (SIGKILL) once it has claimed its first batch of that interval (or, where the faster
workers left it none, at the interval's end, before its merge), as ``kill -9`` from outside would; the studies and tests of a
run that goes on without it use it."""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Iterator
from typing import Any

from rsnet.parallel.strategies.base import Claim, Strategy

log = logging.getLogger(__name__)


def loss_point(setting: Any, rank: int) -> tuple[int, int] | None:
    """``trainer.lose_worker`` (``[rank, epoch, interval]``, 1-based epoch and interval; null: none): the 0-based
    epoch and interval in which worker ``rank`` is lost, or None if it is not the one."""
    if setting is None:
        return None
    lost_rank, epoch, interval = (int(value) for value in setting)
    return (epoch - 1, interval - 1) if lost_rank == rank else None


class SimulatedLoss:
    """Mixed in before a strategy class: the worker SIGKILLs itself with its first batch of the interval claimed, or at
    the interval's end where it claimed none (a slow worker's share of an interval may be none: the loss comes in
    that interval however fast the machine), or in the first interval after it that it reaches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lost_at = loss_point(self.cfg.get("lose_worker"), self.rank)

    def claims(self, interval: int) -> Iterator[Claim]:
        lost_here = self._lost_at is not None and (self.epoch, interval) >= self._lost_at
        for claim in super().claims(interval):
            if lost_here:
                self._die(interval, "with a batch claimed")
            yield claim
        if lost_here:  # the faster workers left it no batch of the interval: it dies before the interval's merge
            self._die(interval, "with no batch claimed")

    def _die(self, interval: int, how: str) -> None:
        log.warning("worker %d (%s): SIMULATED loss (trainer.lose_worker): it kills itself (SIGKILL) in epoch %d, "
                    "interval %d, %s", self.rank, self.ctx.device, self.epoch + 1, interval + 1, how)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


@functools.cache
def losing(strategy: type[Strategy]) -> type[Strategy]:
    """``strategy`` with :class:`SimulatedLoss` mixed in (same name and registry entry; one class per strategy)."""
    return type(strategy.__name__, (SimulatedLoss, strategy), {"__doc__": strategy.__doc__})
