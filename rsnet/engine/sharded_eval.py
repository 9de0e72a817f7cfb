"""Evaluation sharded over the workers in proportion to their measured speeds, gathered by the primary: none waits at a
barrier while the primary evaluates alone (longer than the process-group timeout on a CPU primary)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from rsnet.evaluation import EvalFeed, EvalResult, evaluate
from rsnet.parallel import WorkerContext


def shard_bounds(num_samples: int, shares: Sequence[float]) -> list[int]:
    """Where each worker's slice of ``num_samples`` starts, and the end: worker r takes samples
    ``bounds[r]:bounds[r + 1]``, about ``shares[r] / sum(shares)`` of them (equal shares when they sum to 0)."""
    weights = np.asarray(shares, dtype=np.float64).clip(min=0)
    if not weights.sum() > 0:
        weights = np.ones(len(weights))
    cumulative = np.concatenate([[0.0], np.cumsum(weights)]) / weights.sum()
    return [int(round(fraction * num_samples)) for fraction in cumulative]


def sharded_evaluate(ctx: WorkerContext, model: nn.Module, dataset: Dataset, batch_size: int,
                     feed: EvalFeed = EvalFeed(), shares: Sequence[float] | None = None) -> EvalResult | None:
    """A collective :func:`rsnet.evaluation.evaluate` of ``dataset`` fed as ``feed`` says, each worker its
    :func:`shard_bounds` slice for ``shares``: the primary gets every prediction in order, the others None."""
    device = next(model.parameters()).device
    bounds = shard_bounds(len(dataset), shares if shares is not None else [1.0] * ctx.world_size)
    shard = np.arange(bounds[ctx.rank], bounds[ctx.rank + 1])
    part = evaluate(model, dataset, device, batch_size, indices=shard, feed=feed) if len(shard) else None
    if ctx.world_size == 1:
        return part
    parts: list[EvalResult | None] | None = [None] * ctx.world_size if ctx.is_primary else None
    dist.gather_object(part, parts, dst=0)
    return concatenate(parts) if parts is not None else None


def concatenate(parts: list[EvalResult | None]) -> EvalResult:
    """The slices' results of :func:`sharded_evaluate`, in rank order (empty slices as None), as one result in the
    dataset's order."""
    present = [part for part in parts if part is not None]
    first = present[0]

    def joined(get) -> np.ndarray:
        return np.concatenate([get(part) for part in present])

    heads = list(first.predictions)
    return EvalResult(predictions={head: joined(lambda p, h=head: p.predictions[h]) for head in heads},
                      probabilities={head: joined(lambda p, h=head: p.probabilities[h]) for head in heads},
                      targets=joined(lambda p: p.targets), reported_head=first.reported_head)
