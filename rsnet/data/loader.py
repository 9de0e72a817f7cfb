"""Prepare the next batch on a background thread while the current one computes (on a GPU, on a side stream); the loop's
only wait is :attr:`BatchPrefetcher.wait_s`, the data stall."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.profiler import record_function

from .device_augment import DeviceAugment

__all__ = ["BatchPrefetcher", "PreparedBatch", "device_batches"]

Request = TypeVar("Request")


@dataclass
class PreparedBatch(Generic[Request]):
    """A requested batch with its images and labels on the target device."""

    request: Request
    images: torch.Tensor
    labels: torch.Tensor
    ready: torch.cuda.Event | None = None  # recorded on the copy stream after the host-to-device copy

    def __len__(self) -> int:
        return len(self.labels)


class BatchPrefetcher(Generic[Request]):
    """Turns requests into batches on ``device``, one ahead on a background thread (``enabled``) or inline:
    ``load(request)`` gives host tensors, ``finish(images, request)`` the model's input."""

    def __init__(self, load: Callable[[Request], tuple[torch.Tensor, torch.Tensor]], device: torch.device | str,
                 enabled: bool = True,
                 finish: Callable[[torch.Tensor, Request], torch.Tensor] | None = None) -> None:
        self.load, self.finish, self.device = load, finish, torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsnet-prefetch") if enabled else None
        self._copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.wait_s = 0.0  # time the consumer spent waiting for a batch (the data stall)

    def batches(self, requests: Iterator[Request]) -> Iterator[PreparedBatch[Request]]:
        """The prepared batches of ``requests``, in order; the next one is prepared while the caller uses the
        current one. ``requests`` is advanced on the background thread only (when enabled)."""
        if self._pool is None:
            while (batch := self._timed(lambda: self._next(requests))) is not None:
                yield self._ready(batch)
            return
        pending: Future = self._pool.submit(self._next, requests)
        try:
            while (batch := self._timed(pending.result)) is not None:
                pending = self._pool.submit(self._next, requests)
                yield self._ready(batch)
        finally:
            pending.cancel() or pending.exception()  # never leave the thread inside the requests iterator

    def close(self) -> None:
        """Stop the background thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _timed(self, wait: Callable[[], PreparedBatch | None]) -> PreparedBatch | None:
        started = time.perf_counter()
        try:
            with record_function("rsnet.data_wait"):  # named in a profile (benchmarks/gpu_profile.py)
                return wait()
        finally:
            self.wait_s += time.perf_counter() - started

    def _next(self, requests: Iterator[Request]) -> PreparedBatch | None:
        request = next(requests, None)
        if request is None:
            return None
        images, labels = self.load(request)
        if not self.cuda:
            images, labels = images.to(self.device), labels.to(self.device)
            return PreparedBatch(request, self._finished(images, request), labels)
        with torch.cuda.stream(self._copy_stream):
            images = self._finished(images.pin_memory().to(self.device, non_blocking=True), request)
            labels = labels.pin_memory().to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return PreparedBatch(request, images, labels, ready)

    def _finished(self, images: torch.Tensor, request: Request) -> torch.Tensor:
        return images if self.finish is None else self.finish(images, request)

    def _ready(self, batch: PreparedBatch) -> PreparedBatch:
        """Make the current stream wait for the batch's copy, and keep its memory alive for that stream."""
        if batch.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(batch.ready)
            batch.images.record_stream(stream)
            batch.labels.record_stream(stream)
        return batch


def device_batches(dataset: Any, indices: np.ndarray, batch_size: int, device: torch.device,
                   on_device: DeviceAugment, memory_format: torch.memory_format = torch.contiguous_format
                   ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) batches of ``dataset`` items ``indices`` in order, gathered as uint8 on the host and
    made the model's input by ``on_device`` on ``device``."""
    for start in range(0, len(indices), batch_size):
        chunk = indices[start:start + batch_size]
        images, labels = dataset.stored_batch(chunk)
        yield on_device.apply(images.to(device), chunk, memory_format=memory_format), labels
