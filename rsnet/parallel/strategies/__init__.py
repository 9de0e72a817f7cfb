"""Training strategies: ``adaptive`` (dynamic scheduling, adaptive batch sizes, normalized merging),
``sync`` (DistributedDataParallel), ``local_sgd`` (periodic uniform averaging) and ``static`` (DDP with batch sizes
fixed from the speeds measured in the first epoch), and their registry.

Every strategy drives the same worker loop (rsnet/engine/trainer.py; docs/scheduler.md, "The worker loop"): each
communication point is a call in it (``start_epoch``, ``claims``, ``after_step``, ``end_interval``, ``end_epoch``),
every worker issues the same collectives in the same order, and ``claim.position`` is the run's one
learning-rate clock whatever a worker's share of the batches.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from rsnet.parallel.strategies.adaptive import AdaptiveStrategy
from rsnet.parallel.strategies.base import STRATEGIES, Claim, Strategy, register_strategy
from rsnet.parallel.strategies.local_sgd import LocalSGDStrategy
from rsnet.parallel.strategies.reports import format_row, scheduler_report, summarize
from rsnet.parallel.strategies.slowdown import slowed
from rsnet.parallel.strategies.static_split import StaticSplitStrategy
from rsnet.parallel.strategies.sync import SyncStrategy
from rsnet.parallel.worker import WorkerContext

__all__ = ["STRATEGIES", "AdaptiveStrategy", "Claim", "LocalSGDStrategy", "StaticSplitStrategy", "Strategy",
           "SyncStrategy", "build_strategy", "format_row", "register_strategy", "scheduler_report", "summarize"]


def build_strategy(trainer_cfg: Any, ctx: WorkerContext, model: nn.Module, num_samples: int, batch_size: int,
                   seed: int) -> Strategy:
    """The strategy named by ``trainer_cfg.name`` (registered in :data:`STRATEGIES` by ``@register_strategy``);
    on a worker that ``trainer.slowdown`` slows, with the simulated slowdown mixed in (:func:`slowed`)."""
    name = STRATEGIES.check(str(trainer_cfg["name"]))
    strategy = STRATEGIES[name] if ctx.slowdown == 1.0 else slowed(STRATEGIES[name])
    strategy.check_config(trainer_cfg, batch_size, ctx.world_size)
    strategy.check_setup(ctx, model, batch_size)
    return strategy(trainer_cfg, ctx, model, num_samples, batch_size, seed)
