"""The adaptive scheduler's decisions after every merge, taken alike by every worker from the merged table;
``AdaptiveStrategy`` and the simulator (``benchmarks/simulator/``) both drive it (docs/scheduler.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rsnet.parallel.batching import initial_batch_sizes, next_batch_sizes
from rsnet.parallel.schedule_rules import ScheduleSettings, choose_workers, lr_rounds, merge_rounds, round_batch

LR_PROFILE_POINTS = 64  # points of the run at which the lr profile is sampled for the merge-cost budget
# While a worker is pending (its speed probe still running) and a single worker trains, an interval is at least this
# fraction of the epoch: the pending worker joins within it, and the lone worker does not pay a merge every few rounds.
PENDING_INTERVAL_FRACTION = 1 / 8


def _at_peak(position: float) -> float:
    """The lr ratio before :meth:`Schedule.follow_lr`: the peak everywhere (a constant cadence)."""
    return 1.0


@dataclass(frozen=True)
class Cadence:
    """A new merge cadence: ``rounds`` of ``total_batch`` between merges, from a merge's communication of
    ``comm_s``; ``over_cost``: more rounds than ``base_rounds`` because the merges would cost more than ``cost_max``
    of the compute (``averaged_up_to``: with the rounds following the lr up to that many, 0 without)."""

    rounds: int
    total_batch: int
    comm_s: float
    over_cost: bool
    cost_max: float
    base_rounds: int
    averaged_up_to: int


@dataclass(frozen=True)
class Decision:
    """What one step of the schedule decided (:meth:`Schedule.start`, :meth:`Schedule.update`), for the log
    (:func:`describe`): the workers found pending, admitted or left out, with the speeds and predicted rates that
    decided, and a new cadence where it changed."""

    speeds: tuple[float, ...] = ()
    considered_speed: float = 0.0  # Σ s of the workers admission considered
    pending: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()  # left out: the speed probe raised or ran past its time (speed < 0)
    admitted: tuple[int, ...] = ()
    left_out: tuple[int, ...] = ()
    rate_everyone: float = 0.0  # predicted samples/s with every considered worker
    rate_kept: float = 0.0  # with the ones kept
    cadence: Cadence | None = None


def describe(decision: Decision) -> list[str]:
    """The log lines of a :class:`Decision` (empty where only the batch sizes moved)."""
    lines = [f"worker {r} is pending: its speed probe is still running; it trains from the first merge after its "
             "speed is known, if the admission rule keeps it" for r in decision.pending]
    lines += [f"leaving out worker {r} for the rest of the run: its speed probe failed or ran past "
              "trainer.probe_timeout_s (its own log line says which)" for r in decision.failed]

    def share(rank: int) -> str:
        speed = decision.speeds[rank]
        return f"{speed:.1f} samples/s are {speed / max(decision.considered_speed, 1e-12):.1%} of the workers' speed"

    for rank in sorted(decision.left_out + decision.admitted):
        if rank in decision.left_out:
            lines.append(f"leaving out worker {rank} for the rest of the run: its {share(rank)}, and with it the "
                         f"scheduler would train {decision.rate_everyone:.1f} samples/s against "
                         f"{decision.rate_kept:.1f} without it (merges, waits and equal updates counted; "
                         "trainer.leave_out=false keeps every worker)")
        else:
            lines.append(f"admitting worker {rank} after its speed probe: its {share(rank)}")
    cadence = decision.cadence
    if cadence is not None:
        line = (f"merge every {cadence.rounds} rounds of B = {cadence.total_batch} "
                f"({cadence.rounds * cadence.total_batch} samples): the last merge's communication took "
                f"{cadence.comm_s * 1000:.0f} ms")
        if cadence.over_cost:
            line += f", more than {cadence.cost_max:.0%} of {cadence.base_rounds} rounds' compute"
            if cadence.averaged_up_to:
                line += (" on average over the run, its rounds following the lr up to "
                         f"{cadence.averaged_up_to}")
        lines.append(line)
    return lines


class Schedule:
    """What every worker agrees on between two merges, and the rules that move it (docs/scheduler.md). A worker is
    *active* (it trains), *pending* (its speed probe is still running: it trains nothing yet and is admitted or left
    out at the first merge that carries its speed) or *left out* for the rest of the run."""

    def __init__(self, settings: ScheduleSettings, world: int) -> None:
        settings.check_workers(world)
        self.settings, self.world = settings, world
        self.active = [True] * world
        self.pending = [False] * world
        self.joined: list[int] = []  # the workers admitted by the last update (they need the merged model)
        self.speeds = [0.0] * world
        self.batch_maxes = [settings.batch_max] * world
        self.rounds = settings.merge_rounds
        self.merges = 0
        self.started = False  # whether the speed probes have been exchanged (:meth:`start`)
        self.comm_s = 0.0  # the estimate of a merge's communication seconds
        self.adapted = False  # whether the sizes have followed measured speeds yet
        self.lr_ratio: Callable[[float], float] = _at_peak  # the lr over its peak at a position (epochs; follow_lr)
        self.lr_profile: tuple[float, ...] = ()  # lr_ratio at LR_PROFILE_POINTS evenly spaced points of the run
        self.total_batch = round_batch(settings.batch_size, world, settings.share_min)  # B of the active workers
        self.multiple = settings.multiple_for(self.total_batch, world)  # their batch sizes' grid
        self.sizes = initial_batch_sizes(self.total_batch, world, settings.batch_min, settings.batch_max,
                                         self.multiple)  # every worker's batch size (0: not training)

    @property
    def workers(self) -> int:
        """Active workers W_active."""
        return sum(self.active)

    @property
    def claim_min(self) -> int:
        """The smallest claim the rest of an interval may form: ``batch_min``, or half the batch of a lone worker."""
        return max(self.settings.batch_min, max(self.sizes) // 2) if self.workers == 1 else self.settings.batch_min

    def follow_lr(self, lr_ratio: Callable[[float], float], epochs: float) -> None:
        """Make the intervals follow ``lr_ratio(position)``, the lr over its peak at ``position`` (epochs of
        ``epochs``), and budget the merges over its profile at :data:`LR_PROFILE_POINTS` points of the run."""
        self.lr_ratio = lr_ratio
        self.lr_profile = tuple(float(lr_ratio(epochs * (k + 0.5) / LR_PROFILE_POINTS))
                                for k in range(LR_PROFILE_POINTS))

    def rounds_at(self, lr_ratio: float = 1.0) -> int:
        """Rounds of the next merge interval while the lr is ``lr_ratio`` × its peak (:func:`lr_rounds`)."""
        return lr_rounds(self.rounds, self.settings.merge_rounds_max, lr_ratio)

    def interval_at(self, position: float, rest: int, epoch_samples: int) -> int:
        """Positions of the merge interval that starts at ``position`` (epochs) with ``rest`` of the epoch's
        ``epoch_samples`` left: :meth:`rounds_at` × B; a lone worker takes the rest of the epoch, or while a worker is
        pending at least :data:`PENDING_INTERVAL_FRACTION` of the epoch."""
        size = self.rounds_at(self.lr_ratio(position)) * self.total_batch
        if self.workers > 1:
            return size
        if any(self.pending):
            return max(size, math.ceil(epoch_samples * PENDING_INTERVAL_FRACTION))
        return max(int(rest), 1)

    def speeds_of_active(self) -> list[float]:
        """Every worker's speed estimate, 0 for a worker pending or left out."""
        return [s if a else 0.0 for s, a in zip(self.speeds, self.active)]

    def start(self, speeds: Sequence[float]) -> Decision:
        """The first decision, from the speed probes (0: a probe still running, < 0: one that failed, left out):
        admission among the measured workers, the others are pending; the ones kept train at the equal split until
        the first merge's speeds, measured in training, size their batches (the probes time synthetic batches,
        without the input pipeline; on aid-dev at 1 : 2 sizes from the probes lost 1.6-1.8 points of test accuracy
        in two of three seeds, 0.6 gained in the third)."""
        if not any(s > 0 for s in speeds):
            raise ValueError("Schedule.start needs at least one measured speed")
        self.started = True
        self.speeds = [float(s) for s in speeds]
        self.pending = [s == 0 for s in self.speeds]
        self.active = [s > 0 for s in self.speeds]
        decision = Decision(speeds=tuple(self.speeds),
                            pending=tuple(r for r in range(self.world) if self.pending[r]),
                            failed=tuple(r for r in range(self.world) if self.speeds[r] < 0))
        if self.settings.leave_out and self.workers > 1:
            decision = self._admit(decision, [])
        self.joined = []
        self._resize_equal()
        self.adapted = False  # the first speeds from training go all the way
        return decision

    def update(self, table: Mapping[str, Sequence[float]]) -> Decision:
        """Move on from one merge's table (fields n, s, b, updates, compute, batch_max, comm; one value per worker):
        take its measures, admit or leave out, resize, set the cadence. :attr:`joined` lists the workers admitted
        from pending."""
        self._take_measures(table)
        failed = tuple(r for r in range(self.world) if self.pending[r] and self.speeds[r] < 0)
        for rank in failed:
            self.pending[rank] = False
        decision = Decision(speeds=tuple(self.speeds), failed=failed)
        candidates = [r for r in range(self.world) if self.pending[r] and self.speeds[r] > 0]
        adapting = self.merges > self.settings.warmup_intervals and all(
            s > 0 for s, a in zip(self.speeds, self.active) if a)
        resized = False
        if candidates or (adapting and self.settings.leave_out and self.workers > 1):
            was_active = list(self.active)
            decision = self._admit(decision, candidates)
            resized = self.active != was_active
        if adapting and not resized:
            self._resize_to_measures()
        self.adapted = self.adapted or adapting
        cadence = self._cadence()
        return decision if cadence is None else replace(decision, cadence=cadence)

    def _take_measures(self, table: Mapping[str, Sequence[float]]) -> None:
        """A merge's speeds and batch_max, and the communication estimate: an EMA like the speeds' of the slowest
        worker's last merge (one slow merge does not double the interval)."""
        self.merges += 1
        self.joined = []
        self.speeds = [float(s) for s in table["s"]]
        self.batch_maxes = [max(int(c), 1) for c in table["batch_max"]]
        measured = max(float(c) for c in table["comm"])
        if measured > 0:
            self.comm_s = measured if self.comm_s <= 0 else (measured + self.comm_s) / 2

    def _resize_to_measures(self) -> None:
        """The active workers' sizes follow their measured speeds: all the way the first time (the equal split
        before was a guess), then damped, within the deadband not at all."""
        first = not self.adapted
        active = [r for r in range(self.world) if self.active[r]]
        sizes = next_batch_sizes(
            [self.sizes[r] for r in active], [self.speeds[r] for r in active], self.total_batch,
            self.settings.batch_min, [self.batch_maxes[r] for r in active], self.multiple,
            1.0 if first else self.settings.damping, 0.0 if first else self.settings.deadband)
        self._scatter(sizes)

    def _cadence(self) -> Cadence | None:
        """The rounds between merges for the measured speeds and communication (:func:`merge_rounds`); the new
        cadence where it changed, else None."""
        rounds = self.settings.merge_rounds
        if self.workers > 1:
            round_s = self.total_batch / max(sum(self.speeds_of_active()), 1e-12)
            rounds = merge_rounds(self.settings.merge_rounds, self.comm_s, round_s, self.settings.merge_cost_max,
                                  self.lr_profile, self.settings.merge_rounds_max)
        if rounds == self.rounds:
            return None
        self.rounds = rounds
        follows_lr = self.lr_profile and self.settings.merge_rounds_max > self.settings.merge_rounds
        return Cadence(rounds, self.total_batch, self.comm_s, rounds > self.settings.merge_rounds,
                       self.settings.merge_cost_max, self.settings.merge_rounds,
                       self.settings.merge_rounds_max if follows_lr else 0)

    def _admit(self, decision: Decision, candidates: Sequence[int]) -> Decision:
        """Admission over the active workers and the pending ``candidates`` whose speed just arrived: the set of the
        fastest with the highest predicted rate trains (every one of them with ``leave_out`` off). Where the set
        changes the sizes follow the speeds at once."""
        considered = [self.active[r] or r in candidates for r in range(self.world)]
        if self.settings.leave_out:
            admission = choose_workers(self.speeds, considered, self.settings, self.comm_s, self.lr_profile)
            keep, rates = admission.keep, admission.rates
        else:
            keep, rates = considered, {}
        left_out = tuple(r for r in range(self.world) if considered[r] and not keep[r])
        admitted = tuple(r for r in candidates if keep[r])
        self.joined = list(admitted)
        for rank in candidates:
            self.pending[rank] = False
        changed = keep != self.active
        self.active = list(keep)
        if changed:
            self._resize_to_speeds()
        return replace(decision, admitted=admitted, left_out=left_out,
                       considered_speed=sum(s for s, c in zip(self.speeds, considered) if c),
                       rate_everyone=rates.get(sum(considered), 0.0), rate_kept=rates.get(sum(keep), 0.0))

    def _grid_for_active(self) -> list[int]:
        """B and the grid for the active workers (checked: their batches can add up to B); their ranks."""
        workers = self.workers
        self.total_batch = round_batch(self.settings.batch_size, workers, self.settings.share_min)
        self.multiple = self.settings.multiple_for(self.total_batch, workers)
        self.settings.check_workers(workers)
        self.sizes = [0] * self.world
        return [r for r in range(self.world) if self.active[r]]

    def _resize_equal(self) -> None:
        """B, the grid and the equal split for the active workers."""
        active = self._grid_for_active()
        self._scatter(initial_batch_sizes(self.total_batch, len(active), self.settings.batch_min,
                                          self.settings.batch_max, self.multiple))

    def _resize_to_speeds(self) -> None:
        """B, the grid and the speed-proportional split for the active workers (after admission changed them)."""
        active = self._grid_for_active()
        self._scatter(next_batch_sizes(
            [self.total_batch // len(active)] * len(active), [self.speeds[r] for r in active], self.total_batch,
            self.settings.batch_min, [self.batch_maxes[r] for r in active], self.multiple, damping=1.0,
            deadband=0.0))

    def _scatter(self, sizes: Sequence[int]) -> None:
        active = [r for r in range(self.world) if self.active[r]]
        for rank, size in zip(active, sizes):
            self.sizes[rank] = int(size)

    def lower_batch_max(self, rank: int, batch_max: int) -> None:
        """Worker ``rank`` ran out of memory: its batch and ``batch_max`` drop to ``batch_max`` until the next merge
        hands the freed share to the others."""
        self.batch_maxes[rank] = batch_max
        self.sizes[rank] = batch_max

    def state_dict(self) -> dict[str, Any]:
        return {"batch_sizes": list(self.sizes), "speeds": list(self.speeds), "active": list(self.active),
                "pending": list(self.pending), "rounds": self.rounds, "merges": self.merges, "comm_s": self.comm_s,
                "adapted": self.adapted}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state saved by :meth:`state_dict` with the same number of workers."""
        self.active = [bool(a) for a in state.get("active", [True] * self.world)]
        self.pending = [bool(p) for p in state.get("pending", [False] * self.world)]
        self._resize_equal()
        self.sizes = [int(b) for b in state["batch_sizes"]]
        self.speeds = [float(s) for s in state["speeds"]]
        self.rounds = int(state.get("rounds", self.settings.merge_rounds))
        self.merges = int(state.get("merges", 0))
        self.comm_s = float(state.get("comm_s", 0.0))
        self.adapted = bool(state.get("adapted", self.merges > 0))
        self.started = True
