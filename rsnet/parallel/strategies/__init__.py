"""Training strategies: ``adaptive`` (dynamic scheduling, adaptive batch sizes, normalized merging),
``sync`` (DistributedDataParallel) and ``local_sgd`` (periodic uniform averaging).

Every strategy drives the same worker loop (rsnet/engine/trainer.py); every communication point is a
call in that loop::

    for epoch in ...:
        for interval in range(strategy.start_epoch(epoch)):
            for claim in strategy.claims(interval):      # store round trips at most, never a collective
                lr = schedule(claim.position) * strategy.lr_scale(len(claim.indices))
                loss = criterion(strategy.model(x[claim.indices]), y); loss.backward(); optimizer.step()
                strategy.after_step(len(claim.indices), step_seconds)
            strategy.end_interval(compute_seconds)      # adaptive: the merge; local_sgd: the average
        strategy.end_epoch()                            # afterwards every replica is identical

``claim.position`` is the run's one learning-rate clock (epochs since the start, at the batch's first
sample in the epoch's shared order): every worker reads the same clock, whatever its share of the batches.
All workers issue the same collectives in the same order: the adaptive strategy merges at every interval
boundary on every worker (a worker that claimed nothing merges with weight 0).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rsnet.parallel.strategies.adaptive import AdaptiveStrategy
from rsnet.parallel.strategies.base import Claim, Strategy
from rsnet.parallel.strategies.local_sgd import LocalSGDStrategy
from rsnet.parallel.strategies.reports import format_row, scheduler_report, summarize
from rsnet.parallel.strategies.sync import SyncStrategy
from rsnet.parallel.worker import WorkerContext

__all__ = ["STRATEGIES", "AdaptiveStrategy", "Claim", "LocalSGDStrategy", "Strategy", "SyncStrategy",
           "build_strategy", "format_row", "scheduler_report", "summarize"]

# The registry: trainer.name -> strategy class.
STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (AdaptiveStrategy, SyncStrategy, LocalSGDStrategy)}


def build_strategy(trainer_cfg: Any, ctx: WorkerContext, model: nn.Module, num_samples: int, batch_size: int,
                   seed: int) -> Strategy:
    """The strategy named by ``trainer_cfg.name`` (a key of :data:`STRATEGIES`; default adaptive)."""
    name = str(trainer_cfg["name"])
    if name not in STRATEGIES:
        raise ValueError(f"unknown trainer.name {name!r}; valid: {', '.join(STRATEGIES)}")
    STRATEGIES[name].check_setup(ctx, model, batch_size)
    return STRATEGIES[name](trainer_cfg, ctx, model, num_samples, batch_size, seed)
