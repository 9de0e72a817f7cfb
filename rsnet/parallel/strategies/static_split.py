"""``static``: DDP with per-worker batch sizes fixed once, in proportion to the speeds measured in the first epoch."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from rsnet.parallel import batching
from rsnet.parallel.schedule_rules import resolve_multiple
from rsnet.parallel.strategies.base import register_strategy
from rsnet.parallel.strategies.sync import SyncStrategy

log = logging.getLogger(__name__)


@register_strategy
class StaticSplitStrategy(SyncStrategy):
    """The static speed-proportional split, an ablation of adaptive: the first epoch trains as ``sync`` and measures
    each worker's own speed; from the second on the sizes b_i ∝ speed stay fixed (gradients weighted by b_i / B)."""

    name = "static"
    # The measured speeds must be each worker's own: no buffer broadcast before every forward (a wait outside the
    # timed all-reduce); end_epoch still makes every replica's buffers rank 0's.
    sync_buffers_every_step = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.multiple = resolve_multiple(self.cfg["batch_multiple"], self.total_batch, self.world)
        self.batch_max = int(self.cfg["batch_max"])
        self.sizes = batching.initial_batch_sizes(self.total_batch, self.world, self.batch_min, self.batch_max,
                                                  self.multiple)
        self.measured = False
        self._own = 0.0  # own compute seconds of the measured epoch's steps

    @property
    def needs_step_seconds(self) -> bool:
        return not self.measured or super().needs_step_seconds

    def start_epoch(self, epoch: int) -> int:
        self.epoch = epoch
        self._batches = batching.proportional_batches(self.num_samples, self.seed, epoch, self.sizes, self.rank)
        self._step_samples = sum(self.sizes)
        self._padded = len(self._batches) * self._step_samples
        self._comm.weight = self.sizes[self.rank] / self._step_samples
        return -(-len(self._batches) // self.steps_per_interval)

    def _timed_step(self, batch_size: int, seconds: float, own: float) -> None:
        if not self.measured:
            self._own += own

    def _static_batch(self) -> int:
        return self.sizes[self.rank]

    def end_epoch(self) -> None:
        speeds = None if self.measured else self._measured_speeds()
        super().end_epoch()  # the epoch's row, at the sizes it trained with
        if speeds is not None:
            self.sizes = batching.speed_proportional_sizes(speeds, self.total_batch, self.batch_min, self.batch_max,
                                                           self.multiple)
            self.measured = True
            if self.ctx.is_primary:
                log.info("static split: measured %s samples/s -> batch sizes %s, fixed from now on",
                         ", ".join(f"{s:.1f}" for s in speeds), self.sizes)

    def _measured_speeds(self) -> list[float]:
        """Every worker's samples per second of its own time in this epoch (a collective)."""
        busy = self._own
        speeds: list[Any] = [None] * self.world
        dist.all_gather_object(speeds, self._n / busy if busy > 0 else 0.0)
        return [float(s) for s in speeds]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "batch_sizes": list(self.sizes), "measured": self.measured}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        sizes = state.get("batch_sizes") if state.get("name") == self.name else None
        if sizes is not None and len(sizes) == self.world:  # another number of workers measures afresh
            self.sizes = [int(b) for b in sizes]
            self.measured = bool(state.get("measured", True))
