"""The speed probe: a worker times its training step on a private copy of the model and synthetic batches, on a
background thread, while its main thread stays free for the group's collectives. No one waits for a slow device's
probe: the workers whose probes are done start training, and a late prober is admitted (or left out) at the first
merge after its speed is known (docs/scheduler-algorithm.md, "The speed probe")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

# One training step on ``batch_size`` synthetic samples, on the worker's device; it returns the seconds its own work
# took where it times itself (a simulated device, or events on a stream of its own), None to be timed by the wall clock.
ProbeStep = Callable[[int], float | None]

PROBE_TIMED_STEPS = 2  # steps timed after the first (whose one-time costs are no measure of the speed)
PROBE_FAILED = -1.0  # the speed a worker reports whose probe raised or ran past its time: it is left out


class SpeedProbe:
    """Times ``step`` at ``batch_size`` on a background thread: one untimed first step (allocations, cuDNN's
    autotuning of the shape), then :data:`PROBE_TIMED_STEPS` timed ones, each stretched by a SIMULATED ``slowdown``.
    A CUDA out-of-memory error halves the batch (not below ``batch_min``) and starts again."""

    def __init__(self, step: ProbeStep, batch_size: int, device: torch.device, batch_min: int = 1,
                 slowdown: float = 1.0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.step, self.batch_size, self.device, self.clock = step, max(int(batch_size), 1), device, clock
        self.batch_min, self.slowdown = max(int(batch_min), 1), float(slowdown)
        self.speed = 0.0  # samples/s, once done
        self.step_seconds = 0.0  # the mean time of a timed step, once done
        self.seconds = 0.0  # the whole probe's wall time, once done
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rsnet-speed-probe", daemon=True)

    def start(self) -> SpeedProbe:
        self._started = self.clock()
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        """Whether the probe has finished (with a speed, or with :attr:`error`)."""
        return self._done.is_set()

    def result(self) -> float:
        """The measured samples/s; 0 while running, :data:`PROBE_FAILED` after an error."""
        if self.error is not None:
            return PROBE_FAILED
        return self.speed if self.done else 0.0

    def failure(self, timeout_s: float) -> str | None:
        """Why this probe gives no speed — its error, or that it has run for more than ``timeout_s`` — or None (done
        with a speed, or still within its time). A probe past its time runs on on its daemon thread; its result is
        no longer taken."""
        if self.error is not None:
            return f"failed: {type(self.error).__name__}: {self.error}"
        if not self.done and self.clock() - self._started > timeout_s:
            return f"has run for more than trainer.probe_timeout_s={timeout_s:g} s"
        return None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the probe is done or ``timeout`` seconds have passed; whether it is done."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            self.speed = self._measure()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread by result()
            self.error = error
        finally:
            self.seconds = self.clock() - self._started
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
