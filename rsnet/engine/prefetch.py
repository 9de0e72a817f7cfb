"""Prepare the next batch on a background thread while the current one computes.

The thread claims the next batch from the strategy (a store round trip at most), decodes and augments it,
and, for a GPU, copies it from pinned host memory on a side stream; the training stream waits for that
copy only when it uses the batch. So the device never idles while the host prepares the next batch, and
the loop's only wait is :attr:`BatchPrefetcher.wait_s` — the data stall.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from rsnet.parallel.strategies import Claim

Loader = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class PreparedBatch:
    """A claimed batch with its images and labels on the training device."""

    claim: Claim
    images: torch.Tensor
    labels: torch.Tensor
    ready: torch.cuda.Event | None = None  # recorded on the copy stream after the host-to-device copy

    def __len__(self) -> int:
        return len(self.claim.indices)


class BatchPrefetcher:
    """Turns claims into batches on ``device``, one batch ahead on a background thread (``enabled``), or
    inline. ``load(indices)`` returns host tensors (images, labels)."""

    def __init__(self, load: Loader, device: torch.device, enabled: bool = True) -> None:
        self.load, self.device = load, torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsnet-prefetch") if enabled else None
        self._copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.wait_s = 0.0  # time the loop spent waiting for a batch (the data stall)

    def batches(self, claims: Iterator[Claim]) -> Iterator[PreparedBatch]:
        """The prepared batches of ``claims``, in order; the next one is prepared while the caller uses the
        current one. ``claims`` is advanced on the background thread only."""
        if self._pool is None:
            while True:
                started = time.perf_counter()
                batch = self._next(claims)
                self.wait_s += time.perf_counter() - started
                if batch is None:
                    return
                yield self._ready(batch)
        pending: Future = self._pool.submit(self._next, claims)
        try:
            while True:
                started = time.perf_counter()
                batch = pending.result()
                self.wait_s += time.perf_counter() - started
                if batch is None:
                    return
                pending = self._pool.submit(self._next, claims)
                yield self._ready(batch)
        finally:
            pending.cancel() or pending.exception()  # never leave the thread inside the claims iterator

    def close(self) -> None:
        """Stop the background thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _next(self, claims: Iterator[Claim]) -> PreparedBatch | None:
        claim = next(claims, None)
        if claim is None:
            return None
        images, labels = self.load(claim.indices)
        if not self.cuda:
            return PreparedBatch(claim, images.to(self.device), labels.to(self.device))
        with torch.cuda.stream(self._copy_stream):
            images = images.pin_memory().to(self.device, non_blocking=True)
            labels = labels.pin_memory().to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return PreparedBatch(claim, images, labels, ready)

    def _ready(self, batch: PreparedBatch) -> PreparedBatch:
        """Make the current stream wait for the batch's copy, and keep its memory alive for that stream."""
        if batch.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(batch.ready)
            batch.images.record_stream(stream)
            batch.labels.record_stream(stream)
        return batch
