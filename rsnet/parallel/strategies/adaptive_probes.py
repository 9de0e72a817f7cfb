"""An adaptive worker's speed probe: started before the first interval, awaited at merge 0, its speed taken."""

from __future__ import annotations

import logging
import time

from rsnet.parallel.speed_probe import PROBE_FAILED, ProbeStep, SpeedProbe

log = logging.getLogger("rsnet.parallel.strategies.adaptive")  # the adaptive strategy's log lines

# At the start, once the first probe is done, every worker waits this many of that worker's timed probe steps (at least
# PROBE_GRACE_MIN_S) for the others' probes: similar devices all train from the first interval, a worker whose probe
# is still running then is pending. A grace counted in steps, not in the probe's time, which a GPU's autotuning of the
# first step may make seconds long.
PROBE_GRACE_STEPS = 4
PROBE_GRACE_MIN_S = 0.1
_POLL_S = 0.005  # how often a waiting worker reads the store's count of finished probes


class SpeedProbing:
    """Mixed in before :class:`~rsnet.parallel.strategies.base.Strategy` by ``AdaptiveStrategy``: its speed probe."""

    @property
    def wants_probe(self) -> bool:
        """Whether this worker needs a speed probe (:meth:`probe_speed`): with others, before its speed is known."""
        return (self.world > 1 and self.speed <= 0 and self._probe is None
                and (self.schedule.pending[self.rank] or not self.schedule.started))

    def probe_speed(self, step: ProbeStep) -> None:
        """Time ``step`` (a training step on synthetic samples, on a private copy of the model) on a background
        thread; its speed reaches the others at merge 0 or a later merge. A GPU probes at B, the batch it trains at
        where it is the one device kept (a GPU beside CPUs: no second shape to tune), a CPU at its equal share."""
        if self.wants_probe:
            total = self.schedule.total_batch
            batch = total if self.ctx.device.type == "cuda" else total // self.world
            self._probe = SpeedProbe(step, min(batch, self.batch_max), self.ctx.device,
                                     self.schedule.settings.batch_min, self.ctx.slowdown).start()

    def _await_probes(self) -> None:
        """Block until every worker's probe is done, or for :data:`PROBE_GRACE_STEPS` timed steps of the first worker
        done (the grace it publishes in the store) after this worker learnt of it."""
        probe, store = self._probe, self.ctx.store
        assert probe is not None
        done_key, measured_key = f"{self.prefix}/probes_done", f"{self.prefix}/probes_measured"
        grace_key = f"{self.prefix}/probes_grace"
        counted, grace_end = False, None
        while True:
            failed = probe.failure(self.probe_timeout_s) is not None
            if (probe.done or failed) and not counted:  # a failed probe leaves its worker out, not the run
                counted = True
                store.add(done_key, 1)
                if not failed and int(store.add(measured_key, 1)) == 1:
                    store.set(grace_key, repr(max(PROBE_GRACE_STEPS * probe.step_seconds, PROBE_GRACE_MIN_S)))
            if int(store.add(done_key, 0)) >= self.world:
                return
            if grace_end is None and int(store.add(measured_key, 0)):
                grace_end = time.perf_counter() + float(store.get(grace_key))
            if grace_end is not None and time.perf_counter() >= grace_end:
                return
            probe.wait(_POLL_S)

    def _take_probe_result(self) -> None:
        """Once this worker's probe is done: its speed becomes the worker's, and the probe (its model copy) goes. A
        probe that raised or ran past ``trainer.probe_timeout_s`` gives :data:`PROBE_FAILED`: this worker is left out
        at the merge that carries it, with one log line here saying why."""
        probe = self._probe
        if probe is None:
            return
        failure = probe.failure(self.probe_timeout_s)
        if failure is not None:
            log.warning("worker %d (%s): its speed probe %s; it is left out, the others train on", self.rank,
                        self.ctx.device, failure)
            self.speed, self._probe = PROBE_FAILED, None
        elif probe.done:
            self.speed, self._probe = probe.result(), None
