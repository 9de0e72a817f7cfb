"""The batch prefetcher and the step timer of the training loop (CPU paths; the CUDA paths run in
``make gpu-check``). Time is an injected clock that moves only when a load or a step says so, and the threads are
ordered by events: no outcome depends on how fast the machine is."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from helpers import HANG_S

import rsnet.data.loader
from rsnet.data import BatchPrefetcher
from rsnet.engine.step_timer import StepTimer
from rsnet.parallel.strategies import Claim


class _Clock:
    """Seconds that pass only when :meth:`advance` says so (a load's, a step's), on whichever thread."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _claims(count: int, threads: list[str]):
    for step in range(count):
        threads.append(threading.current_thread().name)
        yield Claim(torch.arange(step * 4, step * 4 + 4), float(step))


def _load(claim: Claim) -> tuple[torch.Tensor, torch.Tensor]:
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


def test_prefetch_hides_loading_behind_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each load takes 0.02 s and each step's compute 0.04 s of an injected clock. Inline, the next batch is loaded
    only when the loop asks for it, and the loop waits for every load; prefetched, it loads while the step computes
    (the step ends only once it has loaded), and the loop waits for the first load at most."""
    clock = _Clock()
    monkeypatch.setattr(rsnet.data.loader, "time", SimpleNamespace(perf_counter=clock))  # the prefetcher's clock
    steps = 6
    stalls = {}
    for enabled in (True, False):
        loaded = [threading.Event() for _ in range(steps)]

        def load(claim: Claim, loaded: list[threading.Event] = loaded) -> tuple[torch.Tensor, torch.Tensor]:
            clock.advance(0.02)  # decoding and augmentation
            loaded[int(claim.position)].set()
            return _load(claim)

        prefetcher = BatchPrefetcher(load, torch.device("cpu"), enabled=enabled)
        for step, _ in enumerate(prefetcher.batches(_claims(steps, []))):
            if step + 1 < steps:
                if enabled:  # the step's compute runs beside the next load, and ends after it
                    assert loaded[step + 1].wait(HANG_S), f"batch {step + 1} was not loaded during step {step}"
                else:
                    assert not loaded[step + 1].is_set()  # inline: nothing is loaded ahead
            clock.advance(0.04)  # compute, longer than loading
        prefetcher.close()
        stalls[enabled] = prefetcher.wait_s
    assert stalls[False] == pytest.approx(steps * 0.02)  # every load is waited for inline
    assert stalls[True] <= 0.02 + 1e-9  # only the first load is (none of it, where it was done before the loop asked)


def test_stopping_early_leaves_no_claim_in_flight() -> None:
    threads: list[str] = []
    prefetcher = BatchPrefetcher(_load, torch.device("cpu"))
    stream = prefetcher.batches(_claims(10, threads))
    next(stream)
    stream.close()  # the loop raised
    claimed = len(threads)
    prefetcher.close()  # the prefetch thread has ended: a claim still queued or in flight would have run by now
    assert claimed == len(threads) <= 2  # the claim ahead was cancelled or finished, never more


def test_step_timer_sums_steps_and_resets() -> None:
    clock = _Clock()
    timer = StepTimer(torch.device("cpu"), clock=clock)
    for seconds in (0.01, 0.02, 0.03):
        timer.start()
        clock.advance(seconds)
        assert timer.stop() == pytest.approx(seconds)
    assert timer.pop_total() == pytest.approx(0.06) and timer.pop_total() == 0.0


def test_a_stopped_loop_releases_a_claim_that_waits_for_its_step() -> None:
    """The claims wait for the loop's step before claiming again (as adaptive's do); when the loop stops (an error),
    ``on_stop`` releases the wait before the prefetcher waits for the claim in flight, so the error is not held."""
    waiting, stopped = threading.Event(), threading.Event()
    ends: list[str] = []

    def waiting_claims():
        yield Claim(torch.arange(4), 0.0)
        waiting.set()
        ends.append("released" if stopped.wait(timeout=HANG_S) else "never released")

    prefetcher = BatchPrefetcher(_load, torch.device("cpu"))
    stream = prefetcher.batches(waiting_claims(), on_stop=stopped.set)
    next(stream)
    assert waiting.wait(timeout=HANG_S)  # the next claim is in flight, waiting for the step
    stream.close()  # the loop raised
    prefetcher.close()
    assert ends == ["released"]
    prefetcher = BatchPrefetcher(_load, torch.device("cpu"))
    finished = prefetcher.batches(_claims(2, []), on_stop=lambda: ends.append("on_stop"))
    assert len(list(finished)) == 2 and ends == ["released"]  # run to the end: nothing to release
    prefetcher.close()
