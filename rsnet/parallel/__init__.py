"""Parallel training on heterogeneous devices: launcher, adaptive scheduler, model merging, baselines. See
docs/scheduler.md for the algorithm, the configs and the torchrun command for several machines."""

from rsnet.parallel.batching import next_batch_sizes
from rsnet.parallel.launcher import WorkerContext, WorkerError, choose_backend, launch, launch_options
from rsnet.parallel.merge import normalized_merge
from rsnet.parallel.strategies import (STRATEGIES, AdaptiveStrategy, LocalSGDStrategy, Strategy, SyncStrategy,
                                       build_strategy, format_row, summarize)

__all__ = ["STRATEGIES", "AdaptiveStrategy", "LocalSGDStrategy", "Strategy", "SyncStrategy", "WorkerContext",
           "WorkerError", "build_strategy", "choose_backend", "format_row", "launch", "launch_options",
           "next_batch_sizes", "normalized_merge", "summarize"]
