"""The speed probe: a worker times its training step on a private copy of the model and synthetic batches, on a
background thread, while its main thread stays free for the group's collectives. No one waits for a slow device's
probe: the workers whose probes are done start training, and a late prober is admitted (or left out) at the first
merge after its speed is known (docs/scheduler.md, "The speed probe")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

# One training step on ``batch_size`` synthetic samples, on the worker's device; it returns the seconds its own work
# took where it times itself (a simulated device, or events on a stream of its own), None to be timed by the wall clock.
ProbeStep = Callable[[int], float | None]

PROBE_TIMED_STEPS = 2  # steps timed after the first (whose one-time costs are no measure of the speed)


class SpeedProbe:
    """Times ``step`` at ``batch_size`` on a background thread: one untimed first step (allocations, cuDNN's
    autotuning of the shape), then :data:`PROBE_TIMED_STEPS` timed ones, each stretched by a SIMULATED ``slowdown``.
    A CUDA out-of-memory error halves the batch (not below ``batch_min``) and starts again."""

    def __init__(self, step: ProbeStep, batch_size: int, device: torch.device, batch_min: int = 1,
                 slowdown: float = 1.0) -> None:
        self.step, self.batch_size, self.device = step, max(int(batch_size), 1), device
        self.batch_min, self.slowdown = max(int(batch_min), 1), float(slowdown)
        self.speed = 0.0  # samples/s, once done
        self.step_seconds = 0.0  # the mean time of a timed step, once done
        self.seconds = 0.0  # the whole probe's wall time, once done
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rsnet-speed-probe", daemon=True)

    def start(self) -> SpeedProbe:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        """Whether the probe has finished (with a speed, or with :attr:`error`)."""
        return self._done.is_set()

    def result(self) -> float:
        """The measured samples/s (0 while running); re-raises the probe's error on the caller's thread."""
        if self.error is not None:
            raise RuntimeError(f"the speed probe of this worker ({self.device}) failed: {self.error}") from self.error
        return self.speed if self.done else 0.0

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the probe is done or ``timeout`` seconds have passed; whether it is done."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            self.speed = self._measure()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread by result()
            self.error = error
        finally:
            self.seconds = time.perf_counter() - self._started
            self._done.set()

    def _measure(self) -> float:
        while True:
            try:
                self._timed_step()  # the first step: one-time costs, not timed
                seconds = sum(self._timed_step() for _ in range(PROBE_TIMED_STEPS))
                self.step_seconds = seconds / PROBE_TIMED_STEPS
                return PROBE_TIMED_STEPS * self.batch_size / max(seconds, 1e-9)
            except torch.cuda.OutOfMemoryError:
                if self.batch_size <= self.batch_min:
                    raise
                torch.cuda.empty_cache()
                self.batch_size = max(self.batch_size // 2, self.batch_min)

    def _timed_step(self) -> float:
        started = time.perf_counter()
        seconds = self.step(self.batch_size)
        if seconds is None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - started
        if self.slowdown > 1.0:
            time.sleep((self.slowdown - 1.0) * seconds)
            seconds *= self.slowdown
        return seconds
