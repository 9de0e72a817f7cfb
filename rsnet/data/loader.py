"""Prepare the next batch on a background thread while the current one computes (on a GPU, on a side stream); the loop's
only wait is :attr:`BatchPrefetcher.wait_s`, the data stall."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.profiler import record_function

from .device_augment import DeviceAugment

__all__ = ["BatchPrefetcher", "PreparedBatch", "eval_prefetcher", "gather_stored_batch",
           "index_chunks"]

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

    def batches(self, requests: Iterator[Request], on_stop: Callable[[], None] | None = None
                ) -> Iterator[PreparedBatch[Request]]:
        """The prepared batches of ``requests``, in order; the next one is prepared while the caller uses the
        current one. ``requests`` is advanced on the background thread only (when enabled). ``on_stop``: called
        where the caller stops before the requests end (an error), before waiting for the request in flight, so
        that a ``requests`` blocked on the caller's progress can return."""
        if self._pool is None:
            while (batch := self._timed(lambda: self._next(requests))) is not None:
                yield self._ready(batch)
            return
        pending: Future = self._pool.submit(self._next, requests)
        ended = False
        try:
            while (batch := self._timed(pending.result)) is not None:
                pending = self._pool.submit(self._next, requests)
                yield self._ready(batch)
            ended = True
        finally:
            if not ended and on_stop is not None:
                on_stop()
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


def index_chunks(indices: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    """``indices`` in order, ``batch_size`` at a time (the last chunk may be smaller)."""
    return (indices[start:start + batch_size] for start in range(0, len(indices), batch_size))


def gather_stored_batch(dataset: Any, indices: np.ndarray, pin_memory: bool = True
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """``dataset.stored_batch(indices)`` copied once, from its uint8 cache straight into a new (pinned) tensor, where
    gathering and then pinning copy twice: the host's work per batch that bounds a GPU's evaluation (pinned blocks
    are reused, so no page is touched for the first time). A cache of other pixels, or none in memory:
    ``stored_batch`` itself."""
    array = dataset.store.array
    if array is None or array.dtype != np.uint8:
        return dataset.stored_batch(indices)
    idx = np.asarray(indices, np.int64).reshape(-1)
    images = torch.empty((len(idx), *array.shape[1:]), dtype=torch.uint8, pin_memory=pin_memory)
    np.take(array, dataset.rows[idx], axis=0, out=images.numpy(), mode="clip")  # "raise" copies through a buffer
    return images, torch.from_numpy(dataset.labels[idx])


def eval_prefetcher(dataset: Any, device: torch.device, on_device: DeviceAugment | None,
                    memory_format: torch.memory_format = torch.contiguous_format, enabled: bool = True
                    ) -> BatchPrefetcher[np.ndarray]:
    """Evaluation batches of a ``SceneDataset``'s items, one index chunk per request, fed as training feeds the
    device: the cache's uint8 batch (on a GPU gathered straight into pinned memory, :func:`gather_stored_batch`)
    made the model's input by ``on_device`` on ``device``, or (None) the host's batched eval transform
    (``get_batch``, equal to the per-image items), in ``memory_format``."""
    if on_device is None:
        return BatchPrefetcher(dataset.get_batch, device, enabled,
                               lambda images, _: images.contiguous(memory_format=memory_format))
    # on a GPU the batch comes pinned, and BatchPrefetcher leaves a pinned batch as it is
    load = partial(gather_stored_batch, dataset) if torch.device(device).type == "cuda" else dataset.stored_batch
    return BatchPrefetcher(load, device, enabled,
                           lambda images, chunk: on_device.apply(images, chunk, memory_format=memory_format))
