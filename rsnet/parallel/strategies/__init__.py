"""Training strategies and their registry: ``adaptive`` (dynamic scheduling, adaptive batch sizes, normalized merging),
``sync`` (DDP), ``local_sgd`` (periodic averaging) and ``static`` (DDP with speed-proportional fixed batches). Each
drives the same worker loop (docs/scheduler-algorithm.md, "The worker loop"): every worker issues the same collectives
in the same order, and ``claim.position`` is the run's one lr clock."""

from __future__ import annotations

from typing import Any

from torch import nn

from rsnet.parallel.strategies.adaptive import AdaptiveStrategy
from rsnet.parallel.strategies.base import STRATEGIES, Claim, Strategy, register_strategy
from rsnet.parallel.strategies.local_sgd import LocalSGDStrategy
from rsnet.parallel.strategies.reports import format_row, scheduler_report, summarize
from rsnet.parallel.strategies.simulated_loss import losing, loss_point
from rsnet.parallel.strategies.slowdown import slowed
from rsnet.parallel.strategies.static_split import StaticSplitStrategy
from rsnet.parallel.strategies.sync import SyncStrategy
from rsnet.parallel.worker_setup import WorkerContext

__all__ = ["STRATEGIES", "AdaptiveStrategy", "Claim", "LocalSGDStrategy", "StaticSplitStrategy", "Strategy",
           "SyncStrategy", "build_strategy", "format_row", "register_strategy", "scheduler_report", "summarize"]


def build_strategy(trainer_cfg: Any, ctx: WorkerContext, model: nn.Module, num_samples: int, batch_size: int,
                   seed: int) -> Strategy:
    """The strategy named by ``trainer_cfg.name`` (registered in :data:`STRATEGIES` by ``@register_strategy``);
    on a worker that ``trainer.slowdown`` slows, with the simulated slowdown mixed in (:func:`slowed`), and on the one
    that ``trainer.lose_worker`` names, the simulated loss (:func:`losing`)."""
    name = STRATEGIES.check(str(trainer_cfg["name"]))
    strategy = STRATEGIES[name] if ctx.slowdown == 1.0 else slowed(STRATEGIES[name])
    if loss_point(trainer_cfg.get("lose_worker"), ctx.rank) is not None:
        strategy = losing(strategy)
    strategy.check_config(trainer_cfg, batch_size, ctx.world_size)
    strategy.check_setup(ctx, model, batch_size)
    return strategy(trainer_cfg, ctx, model, num_samples, batch_size, seed)
