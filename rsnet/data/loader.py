"""Overlap batch preparation with the training step: a one-thread prefetcher over ``get_batch``."""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, Sequence

import torch

__all__ = ["prefetch_batches"]

_END = object()


def prefetch_batches(
    dataset,
    index_batches: Iterable[Sequence[int] | torch.Tensor],
    depth: int = 2,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``dataset.get_batch(idx)`` for every ``idx`` of ``index_batches``, prepared by a
    background thread up to ``depth`` batches ahead (augmentation runs in numpy/OpenCV, which
    release the GIL, while the step runs in torch).

    Note: the thread pulls ``index_batches`` ahead of the consumer; with a scheduler that claims
    work when its iterator advances, up to ``depth`` extra batches are claimed early.
    Exceptions raised while preparing a batch are re-raised in the consumer.
    """
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def producer() -> None:
        try:
            for idx in index_batches:
                if stop.is_set():
                    return
                q.put(dataset.get_batch(idx))
        except BaseException as exc:  # hand the error to the consumer
            q.put(exc)
        q.put(_END)

    thread = threading.Thread(target=producer, name="rsnet-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)
