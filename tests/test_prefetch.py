"""The batch prefetcher and the step timer of the training loop (CPU paths; the CUDA paths run in
``make gpu-check``)."""

from __future__ import annotations

import threading
import time

import torch

from rsnet.data import BatchPrefetcher
from rsnet.engine.step_timer import StepTimer
from rsnet.parallel.strategies import Claim


def _claims(count: int, threads: list[str]):
    for step in range(count):
        threads.append(threading.current_thread().name)
        yield Claim(torch.arange(step * 4, step * 4 + 4), float(step))


def _load(claim: Claim) -> tuple[torch.Tensor, torch.Tensor]:
    time.sleep(0.02)  # decoding and augmentation
    return claim.indices.float().unsqueeze(1).repeat(1, 3), claim.indices


def test_prefetched_batches_equal_inline_ones_and_are_claimed_on_the_thread() -> None:
    results = {}
    for enabled in (True, False):
        threads: list[str] = []
        prefetcher = BatchPrefetcher(_load, torch.device("cpu"), enabled=enabled)
        batches = list(prefetcher.batches(_claims(5, threads)))
        prefetcher.close()
        results[enabled] = batches
        assert all(name.startswith("rsnet-prefetch") == enabled for name in threads), threads
    assert [b.request.position for b in results[True]] == [0.0, 1.0, 2.0, 3.0, 4.0]
    for ahead, inline in zip(results[True], results[False]):
        assert torch.equal(ahead.images, inline.images) and torch.equal(ahead.labels, inline.labels)


def test_prefetch_hides_loading_behind_compute() -> None:
    stalls = {}
    for enabled in (True, False):
        prefetcher = BatchPrefetcher(_load, torch.device("cpu"), enabled=enabled)
        for _ in prefetcher.batches(_claims(6, [])):
            time.sleep(0.04)  # compute, longer than loading
        prefetcher.close()
        stalls[enabled] = prefetcher.wait_s
    assert stalls[False] >= 6 * 0.02  # every load is waited for inline
    assert stalls[True] < stalls[False] / 2  # only the first load is (plus scheduling noise)


def test_stopping_early_leaves_no_claim_in_flight() -> None:
    threads: list[str] = []
    prefetcher = BatchPrefetcher(_load, torch.device("cpu"))
    stream = prefetcher.batches(_claims(10, threads))
    next(stream)
    stream.close()  # the loop raised
    claimed = len(threads)
    time.sleep(0.1)
    assert claimed == len(threads) <= 2  # the claim ahead was cancelled or finished, never more
    prefetcher.close()


def test_step_timer_sums_steps_and_resets() -> None:
    timer = StepTimer(torch.device("cpu"))
    for _ in range(3):
        timer.start()
        time.sleep(0.01)
        assert timer.stop() >= 0.01
    total = timer.pop_total()
    assert 0.03 <= total < 1.0 and timer.pop_total() == 0.0


def test_a_stopped_loop_releases_a_claim_that_waits_for_its_step() -> None:
    """The claims wait for the loop's step before claiming again (as adaptive's do); when the loop stops (an error),
    ``on_stop`` releases the wait before the prefetcher waits for the claim in flight, so the error is not held."""
    waiting, stopped = threading.Event(), threading.Event()
    ends: list[str] = []

    def waiting_claims():
        yield Claim(torch.arange(4), 0.0)
        waiting.set()
        ends.append("released" if stopped.wait(timeout=60) else "timed out")

    prefetcher = BatchPrefetcher(_load, torch.device("cpu"))
    stream = prefetcher.batches(waiting_claims(), on_stop=stopped.set)
    next(stream)
    assert waiting.wait(timeout=60)  # the next claim is in flight, waiting for the step
    stream.close()  # the loop raised
    prefetcher.close()
    assert ends == ["released"]
    prefetcher = BatchPrefetcher(_load, torch.device("cpu"))
    finished = prefetcher.batches(_claims(2, []), on_stop=lambda: ends.append("on_stop"))
    assert len(list(finished)) == 2 and ends == ["released"]  # run to the end: nothing to release
    prefetcher.close()
