"""Evaluation sharded over the workers: each predicts every W-th sample, the primary gathers the predictions.

Without it the primary evaluated the whole test set alone while the other workers waited at a barrier (on a
CPU primary and a large test set, longer than the process-group timeout).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, Subset

from rsnet.data import DeviceAugment, device_batches
from rsnet.evaluation import EvalResult, evaluate
from rsnet.parallel import WorkerContext


def sharded_evaluate(ctx: WorkerContext, model: nn.Module, dataset: Dataset, batch_size: int,
                     on_device: DeviceAugment | None = None,
                     memory_format: torch.memory_format = torch.contiguous_format) -> EvalResult | None:
    """:func:`rsnet.evaluation.evaluate` of ``dataset`` with the work split over the workers: worker r predicts
    samples r, r + W, r + 2W, ... The primary gets the predictions of the whole dataset in its order (what one
    process evaluating all of it gets), the other workers None. Every worker must call it (a collective).
    ``on_device``: normalise uint8 batches (``dataset.uint8_batch``) on the model's device instead of
    transforming images on the host."""
    device = next(model.parameters()).device
    shard = range(ctx.rank, len(dataset), ctx.world_size)
    if on_device is not None:
        data = device_batches(dataset, np.asarray(shard), batch_size, device, on_device, memory_format)
    else:
        data = dataset if ctx.world_size == 1 else Subset(dataset, shard)
    part = evaluate(model, data, device, batch_size) if len(shard) else None
    if ctx.world_size == 1:
        return part
    parts: list[EvalResult | None] | None = [None] * ctx.world_size if ctx.is_primary else None
    dist.gather_object(part, parts, dst=0)
    return interleave(parts, len(dataset)) if parts is not None else None


def interleave(parts: list[EvalResult | None], num_samples: int) -> EvalResult:
    """The shards' results of :func:`sharded_evaluate` (shard r holds samples r, r + W, ...) as one result in the
    dataset's order."""
    world = len(parts)
    present = [(rank, part) for rank, part in enumerate(parts) if part is not None]
    first = present[0][1]

    def merged(get) -> np.ndarray:
        sample = get(first)
        out = np.empty((num_samples, *sample.shape[1:]), sample.dtype)
        for rank, part in present:
            out[rank::world] = get(part)
        return out

    heads = list(first.predictions)
    return EvalResult(predictions={head: merged(lambda p, h=head: p.predictions[h]) for head in heads},
                      probabilities={head: merged(lambda p, h=head: p.probabilities[h]) for head in heads},
                      targets=merged(lambda p: p.targets), reported_head=first.reported_head)
