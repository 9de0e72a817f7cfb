"""``local_sgd``: static equal shares, uniform model averaging every H local steps."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from rsnet.parallel.merge import average_buffers, normalized_merge
from rsnet.parallel.strategies.base import StaticStrategy, register_strategy


@register_strategy
class LocalSGDStrategy(StaticStrategy):
    """Static equal partition; uniform model averaging, BatchNorm statistics included, every H = ``average_every`` local
    steps and at the end of every epoch."""

    name = "local_sgd"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps_per_interval = int(self.cfg["average_every"])
        # Decided for the whole group (a GPU worker among CPU workers stages everything through host memory):
        # the two ways issue different collectives.
        self.use_torch_averager = not self.ctx.stage_through_host and bool(self.cfg["torch_averager"])
        self._merge_s = 0.0
        self._averages = 0

    @classmethod
    def check_config(cls, trainer: Mapping[str, Any], batch_size: int, workers: int) -> None:
        super().check_config(trainer, batch_size, workers)
        if int(trainer["average_every"]) < 1:
            raise ValueError(f"trainer.average_every must be >= 1, got {trainer['average_every']}")

    def lr_scale(self, batch_size: int) -> float:
        """batch_size / ref_batch: 1.0 for the static batch B/W by default, as averaging W replicas that each stepped on
        B/W moves the model like one sync step on B."""
        return batch_size / self.ref_batch

    def end_interval(self, compute_seconds: float) -> None:
        """Average the replicas: parameters with torch's model-averaging all-reduce where they sit on the backend's
        device, else everything through :func:`normalized_merge`."""
        super().end_interval(compute_seconds)
        started = time.perf_counter()
        if self.use_torch_averager:
            average_parameters(iter([p for p in self.model.parameters() if p.requires_grad]), dist.group.WORLD)
            average_buffers(self.model.buffers(), comm_device=self.ctx.comm_device)
        else:
            normalized_merge(self.model, 1.0, comm_device=self.ctx.comm_device)
        self._merge_s += time.perf_counter() - started
        self._averages += 1

    def end_epoch(self) -> None:
        self._gather_epoch_row(self.epoch, {"averages": self._averages, "merge_time": self._merge_s})
        self._averages, self._merge_s = 0, 0.0
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "average_every": self.steps_per_interval}
