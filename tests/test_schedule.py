"""The adaptive scheduler's decisions after a merge (rsnet/parallel/schedule.py, schedule_rules.py): B, the size
grid, the cadence, who takes part. Pure functions and the Schedule every worker moves on from the same merged table;
no processes."""

from __future__ import annotations

import pytest
from helpers import trainer_config

from rsnet.parallel.schedule import Schedule, describe
from rsnet.parallel.schedule_rules import (
    ScheduleSettings,
    auto_multiple,
    choose_workers,
    lr_rounds,
    mean_rounds,
    merge_rounds,
    next_interval,
    predicted_rate,
    round_batch,
)


def _settings(batch_size: int = 32, **overrides: object) -> ScheduleSettings:
    """The shipped settings, but a constant 4 rounds between merges and a 5 % cost rule (the figures below are
    worked out for them)."""
    fixed = {"merge_rounds": 4, "merge_rounds_max": None, "merge_cost_max": 0.05}
    return ScheduleSettings.from_config(trainer_config("adaptive", **{**fixed, **overrides}), batch_size)


def _table(speeds: list[float], sizes: list[int], comm: float = 0.0, **fields: list[float]) -> dict[str, list[float]]:
    """One merge's table: every worker trained 64 samples at ``speeds``."""
    world = len(speeds)
    return {"n": [64.0] * world, "s": speeds, "b": [float(b) for b in sizes], "updates": [4.0] * world,
            "compute": [64 / s if s else 0.0 for s in speeds], "batch_max": [1024.0] * world,
            "comm": [comm] * world, **fields}


def test_size_grid_follows_the_share_of_a_worker() -> None:
    assert [auto_multiple(share) for share in (4, 8, 10.7, 16, 24, 32, 63, 64, 512)] == [1, 1, 1, 2, 2, 4, 4, 8, 8]
    settings = _settings(32)
    assert settings.multiple_for(32, 2) == 2 and settings.multiple_for(32, 3) == 1
    assert _settings(256, batch_multiple=8).multiple_for(256, 2) == 8


def test_round_batch_grows_with_the_workers_not_below_batch_size() -> None:
    assert round_batch(32, 2, 16) == 32 and round_batch(32, 3, 16) == 48 and round_batch(32, 4, 16) == 64
    assert round_batch(32, 4, 0) == 32 and round_batch(256, 8, 16) == 256


def test_merge_rounds_keep_the_merge_under_its_share_of_the_interval() -> None:
    assert merge_rounds(4, comm_s=0.0, round_s=0.1, cost_max=0.05) == 4  # nothing measured yet
    assert merge_rounds(4, comm_s=0.01, round_s=0.1, cost_max=0.05) == 4  # 2.5 % of 4 rounds
    assert merge_rounds(4, comm_s=0.06, round_s=0.1, cost_max=0.05) == 12  # 0.06 / (0.05 x 0.1)
    assert merge_rounds(4, comm_s=0.06, round_s=0.1, cost_max=0.0) == 4  # the rule off


def test_with_rounds_that_follow_the_lr_the_cost_rule_budgets_the_whole_run() -> None:
    profile = [1.0] * 4 + [0.5] * 4  # half the run at the peak lr, half at half of it
    assert mean_rounds(2, 16, profile) == pytest.approx(8 / (4 / 2 + 4 / 8))  # 3.2 rounds per merge on average
    assert merge_rounds(2, comm_s=0.01, round_s=0.1, cost_max=0.05, lr_profile=profile, rounds_max=16) == 2  # 3.1 %
    # a merge costs 10 % of a round: 2 rounds on their own would spend 5 % only at 2 rounds per merge on average
    base = merge_rounds(2, comm_s=0.01, round_s=0.2, cost_max=0.05, lr_profile=profile, rounds_max=16)
    assert base == 2 and 0.01 / (mean_rounds(base, 16, profile) * 0.2) <= 0.05
    base = merge_rounds(2, comm_s=0.06, round_s=0.1, cost_max=0.05, lr_profile=profile, rounds_max=16)
    assert 0.06 / (mean_rounds(base, 16, profile) * 0.1) <= 0.05 < 0.06 / (mean_rounds(base - 1, 16, profile) * 0.1)
    assert base < 12  # the constant rule's 12: the late long intervals pay for shorter early ones
    schedule = Schedule(_settings(merge_rounds=2, merge_rounds_max=16), 2)
    schedule.follow_lr(lambda position: 1.0 if position < 4 else 0.5, 8)  # the profile above, sampled 64 times
    notes = describe(schedule.update(_table([200.0, 100.0], schedule.sizes, comm=0.06)))
    assert schedule.rounds == merge_rounds(2, 0.06, 32 / 300, 0.05, profile, 16) > 2
    assert notes[-1].endswith("on average over the run, its rounds following the lr up to 16")


def test_rounds_grow_with_the_square_of_the_lr_decay_up_to_their_cap() -> None:
    assert [lr_rounds(2, 16, ratio) for ratio in (1.0, 0.9, 0.7, 0.5, 0.3, 0.01)] == [2, 2, 4, 8, 16, 16]
    assert lr_rounds(2, 0, 0.1) == 2 and lr_rounds(8, 8, 0.1) == 8  # no cap above merge_rounds: constant
    schedule = Schedule(_settings(merge_rounds=2, merge_rounds_max=16), 2)
    schedule.follow_lr(lambda position: 1.0 if position < 1 else 0.5, 2)  # the peak lr in epoch 0, half in epoch 1
    assert schedule.interval_at(0.0, 700, 720) == 64 and schedule.interval_at(1.0, 700, 720) == 256
    schedule.rounds = 20  # the cost rule asked for more than the cap: it wins
    assert schedule.interval_at(1.0, 700, 720) == 20 * 32
    schedule.start([100.0, 0.0])  # worker 1's probe still runs: one worker trains, in intervals of an eighth or more
    assert schedule.pending == [False, True] and schedule.interval_at(1.0, 700, 720) == 20 * 32
    schedule.rounds = 2
    assert schedule.interval_at(0.0, 700, 4000) == 500 and schedule.interval_at(0.0, 700, 400) == 64
    schedule.pending = [False, False]  # one worker left training: no drift to bound, one interval to the epoch's end
    assert schedule.interval_at(0.0, 700, 720) == 700


def test_an_interval_never_leaves_a_scrap_of_the_epoch() -> None:
    assert next_interval(0, 720, 128, 64) == (0, 128)
    assert next_interval(640, 720, 128, 64) == (640, 720)
    assert next_interval(512, 720, 128, 64) == (512, 640)  # 80 left >= 64: their own interval
    assert next_interval(576, 720, 128, 64) == (576, 720)  # 16 would be left: they join
    assert next_interval(0, 100, 128, 64) == (0, 100)


def test_predicted_rate_counts_merge_wait_and_the_slowest_share() -> None:
    assert predicted_rate([100.0], 32, 4, 4, 1.0) == 100.0  # alone: no merge, no wait
    # two equal workers: a round of 32 takes 0.16 s; 4 rounds 0.64 s, plus a 0.05 s merge and half a round's wait
    assert predicted_rate([100.0, 100.0], 32, 4, 4, 0.05) == pytest.approx(200 * 0.64 / (0.64 + 0.05 + 0.08))
    # 32 x 5 / 105 = 1.5 < batch_min: the slow worker's batch of 4 takes 0.8 s, more than a round (0.3 s)
    assert predicted_rate([100.0, 5.0], 32, 4, 4, 0.0) == pytest.approx(105 * 1.219 / (1.219 + 0.4), rel=1e-3)


def test_choose_workers_keeps_the_set_that_trains_fastest() -> None:
    settings = _settings(32)
    keep = choose_workers([100.0, 50.0], [True, True], settings, comm_s=0.01)
    assert keep.keep == [True, True] and keep.rates[2] > keep.rates[1]
    keep = choose_workers([100.0, 5.0], [True, True], settings, comm_s=0.01)
    assert keep.keep == [True, False] and keep.rates[2] < 80
    # A worker whose share keeps pace but whose speed does not pay for the merge and the wait is left out too (with
    # the cost rule the interval would grow until the merge is cheap, and the worker would pay for itself).
    keep = choose_workers([100.0, 16.0], [True, True], _settings(32, merge_cost_max=0), comm_s=0.2)
    assert keep.keep == [True, False] and 0 < keep.rates[2] < keep.rates[1] == 100.0
    assert choose_workers([100.0, 16.0], [True, True], settings, comm_s=0.2).keep == [True, True]
    # Among three, the slowest goes first; a worker already out stays out.
    keep = choose_workers([100.0, 90.0, 4.0], [True, True, True], settings, comm_s=0.01)
    assert keep.keep == [True, True, False]
    assert choose_workers([100.0, 90.0, 80.0], [True, False, True], settings, 0.01).keep == [True, False, True]


def test_a_twentieth_of_the_speed_is_left_out_whatever_a_merge_costs() -> None:
    """The end-to-end leave-out tests (test_parallel.py, speeds fed at 1 : 20, either rank slow) rely on this: the
    admission weighs the measured cost of a merge, which a busy machine stretches, but at 1 : 20 the slow worker's
    share is below batch_min and it is left out at any cost from 0 to 10 s; at 1 : 3 the cost decides."""
    settings = ScheduleSettings.from_config(trainer_config("adaptive", merge_rounds=4, merge_cost_max=0), 48)
    for comm_s in (0.0, 1e-4, 0.01, 1.0, 10.0):
        assert choose_workers([1000.0, 50.0], [True, True], settings, comm_s).keep == [True, False]
        assert choose_workers([50.0, 1000.0], [True, True], settings, comm_s).keep == [False, True]
    assert choose_workers([1000.0, 333.3], [True, True], settings, 0.01).keep == [True, True]
    assert choose_workers([1000.0, 333.3], [True, True], settings, 1.0).keep == [True, False]


def test_schedule_leaves_out_a_slow_worker_once_and_says_why() -> None:
    schedule = Schedule(_settings(32), 3)
    assert (schedule.total_batch, schedule.multiple, schedule.sizes) == (48, 2, [16, 16, 16])  # B = 3 x 16
    notes = describe(schedule.update(_table([100.0, 100.0, 3.0], [16, 16, 16], comm=0.01)))  # the first merge decides
    assert schedule.active == [True, True, False] and schedule.workers == 2
    assert schedule.total_batch == 32 and schedule.sizes == [16, 16, 0]  # B back to batch_size for two
    assert len(notes) == 1 and notes[0].startswith("leaving out worker 2 for the rest of the run: its 3.0 samples/s")
    assert "trainer.leave_out=false keeps every worker" in notes[0]
    assert describe(schedule.update(_table([100.0, 100.0, 3.0], [16, 16, 0], comm=0.01))) == []
    assert schedule.active == [True, True, False]
    measured = Schedule(_settings(32), 3)  # from the speed probes, before any interval
    notes = describe(measured.start([100.0, 100.0, 3.0]))
    assert measured.active == [True, True, False] and measured.sizes == [16, 16, 0] and len(notes) == 1
    kept = Schedule(_settings(32, leave_out=False), 3)
    for _ in range(4):
        kept.update(_table([100.0, 100.0, 3.0], kept.sizes, comm=0.01))
    assert kept.active == [True, True, True] and kept.sizes == [22, 22, 4]  # held at batch_min


def test_schedule_sizes_follow_speeds_and_the_cadence_follows_the_merge_cost() -> None:
    schedule = Schedule(_settings(32), 2)
    schedule.update(_table([200.0, 100.0], schedule.sizes))
    # the first measured speeds: straight to the grid point nearest 21.3 / 10.7 (the equal split was a guess)
    assert schedule.sizes == [22, 10] and schedule.rounds == 4  # no merge measured yet
    schedule.update(_table([100.0, 200.0], schedule.sizes))
    assert schedule.sizes == [16, 16]  # then damped (0.5): 6 of the 11.3 toward 10.7 / 21.3
    notes = describe(schedule.update(_table([200.0, 100.0], schedule.sizes, comm=0.06)))
    # a round of 32 at 300 samples/s is 0.107 s: 0.06 s is 5 % of 12 rounds
    assert schedule.rounds == 12 and schedule.interval_at(0.0, 1000, 1000) == 384
    assert notes == ["merge every 12 rounds of B = 32 (384 samples): the last merge's communication took 60 ms, more "
                     "than 5% of 4 rounds' compute"]
    schedule.update(_table([200.0, 100.0], schedule.sizes, comm=0.0))  # no new measurement: the estimate stays
    assert schedule.rounds == 12


def test_schedule_state_round_trip() -> None:
    schedule = Schedule(_settings(32), 4)
    schedule.start([100.0, 100.0, 3.0, 0.0])
    for _ in range(2):
        schedule.update(_table([100.0, 100.0, 3.0, 0.0], schedule.sizes, comm=0.02))
    assert schedule.active == [True, True, False, False] and schedule.pending == [False, False, False, True]
    restored = Schedule(_settings(32), 4)
    restored.load_state_dict(schedule.state_dict())
    assert (restored.active, restored.pending, restored.sizes, restored.total_batch, restored.speeds, restored.rounds,
            restored.merges, restored.comm_s, restored.started) == (
        schedule.active, schedule.pending, schedule.sizes, schedule.total_batch, schedule.speeds, schedule.rounds,
        schedule.merges, schedule.comm_s, True)


def test_a_pending_worker_is_admitted_or_left_out_once_its_probe_speed_arrives() -> None:
    """A worker whose speed probe outlasts the others' grace is pending: it trains nothing, and the first merge that
    carries its speed admits it (the sizes follow the speeds at once, :attr:`Schedule.joined` names it: it needs the
    merged model) or leaves it out for the rest of the run."""
    schedule = Schedule(_settings(32), 2)
    notes = describe(schedule.start([100.0, 0.0]))
    assert (schedule.active, schedule.pending, schedule.sizes) == ([True, False], [False, True], [32, 0])
    assert notes == ["worker 1 is pending: its speed probe is still running; it trains from the first merge after its "
                     "speed is known, if the admission rule keeps it"]
    assert (describe(schedule.update(_table([100.0, 0.0], schedule.sizes))) == []
            and schedule.joined == [])  # still probing
    notes = describe(schedule.update(_table([100.0, 50.0], schedule.sizes)))
    assert schedule.joined == [1] and schedule.active == [True, True] and schedule.pending == [False, False]
    assert schedule.sizes == [22, 10] and notes[0].startswith("admitting worker 1 after its speed probe: its 50.0")
    schedule.update(_table([100.0, 50.0], schedule.sizes))
    assert schedule.joined == []
    slow = Schedule(_settings(32), 2)
    slow.start([100.0, 0.0])
    notes = describe(slow.update(_table([100.0, 1.0], slow.sizes)))
    assert slow.joined == [] and slow.active == [True, False] and slow.pending == [False, False]
    assert notes[0].startswith("leaving out worker 1 for the rest of the run: its 1.0 samples/s")
    kept = Schedule(_settings(32, leave_out=False), 2)
    kept.start([100.0, 0.0])
    kept.update(_table([100.0, 1.0], kept.sizes))
    assert kept.joined == [1] and kept.active == [True, True] and kept.sizes == [28, 4]  # held at batch_min


def test_a_worker_whose_probe_failed_is_left_out_at_the_merge_that_carries_it() -> None:
    """Speed < 0: the probe raised or ran past its time. At merge 0 the worker is left out (not pending); a pending
    worker whose probe fails later is left out at the merge that carries the failure, and the others' sizes hold."""
    failed_line = ("leaving out worker 1 for the rest of the run: its speed probe failed or ran past "
                   "trainer.probe_timeout_s (its own log line says which)")
    schedule = Schedule(_settings(32), 3)
    assert describe(schedule.start([100.0, -1.0, 100.0])) == [failed_line]
    assert (schedule.active, schedule.pending, schedule.sizes) == ([True, False, True], [False, False, False],
                                                                   [16, 0, 16])
    later = Schedule(_settings(32), 3)
    later.start([100.0, 0.0, 100.0])
    assert later.pending == [False, True, False]
    notes = describe(later.update(_table([100.0, -1.0, 100.0], later.sizes)))
    assert notes == [failed_line] and later.joined == []
    assert (later.active, later.pending, later.sizes) == ([True, False, True], [False, False, False], [16, 0, 16])
    assert describe(later.update(_table([100.0, -1.0, 100.0], later.sizes))) == []  # said once


def test_bad_settings_are_refused_naming_the_key() -> None:
    for key, value, message in (("merge_rounds", 0, "trainer.merge_rounds=0"),
                                ("merge_cost_max", 1.5, "trainer.merge_cost_max=1.5"),
                                ("share_min", -1, "trainer.share_min=-1"),
                                ("batch_multiple", "eight", "trainer.batch_multiple='eight': use auto"),
                                ("damping", 0.0, "trainer.damping")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
            _settings(32, **{key: value})
    with pytest.raises(ValueError, match="batch_size=32 is too small for 9 workers"):
        Schedule(_settings(32, share_min=0), 9)


def test_a_single_workers_rest_joins_its_last_claim_below_half_its_batch() -> None:
    """The smallest claim the rest of an interval may form: half the batch where a single worker trains (its epoch
    never ends in a scrap of a batch: test_scheduler_properties), batch_min with several (a slow worker's longer
    claim would hold up the merge)."""
    assert (Schedule(_settings(32), 1).claim_min, Schedule(_settings(32), 2).claim_min) == (16, 4)
    assert Schedule(_settings(32, batch_min=20), 1).claim_min == 20
