"""Time training steps without making the host wait for the GPU after every step."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


class StepTimer:
    """Sums the compute time of the steps between two :meth:`pop_total` calls; on a GPU the CUDA events are read there
    (one sync per merge interval), unless ``every_step`` asks for each step's time at once. ``clock``: the host's
    clock of the CPU path (seconds; ``time.perf_counter``)."""

    def __init__(self, device: torch.device, every_step: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.every_step = every_step
        self.clock = clock
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._started = 0.0
        self._total = 0.0

    def start(self) -> None:
        """Mark the beginning of a step's compute."""
        if self.cuda:
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self._events[-1][0].record()
        else:
            self._started = self.clock()

    def stop(self) -> float | None:
        """Mark the end of the step; its seconds when known without waiting (CPU, or ``every_step``), else None."""
        if not self.cuda:
            seconds = self.clock() - self._started
            self._total += seconds
            return seconds
        start, end = self._events[-1]
        end.record()
        if not self.every_step:
            return None
        end.synchronize()
        self._events.pop()
        seconds = start.elapsed_time(end) / 1000.0
        self._total += seconds
        return seconds

    def pop_total(self) -> float:
        """Seconds of compute since the last call (waits for the GPU's last recorded step); resets."""
        if self._events:
            self._events[-1][1].synchronize()
            self._total += sum(start.elapsed_time(end) for start, end in self._events) / 1000.0
            self._events = []
        total, self._total = self._total, 0.0
        return total
