"""The scheduler simulator (benchmarks/simulator/): cost models, and the strategies it drives through the real
scheduling functions of rsnet.parallel.batching."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

import simulator as sim
from simulator import runs
from helpers import CONF, trainer_config, training_config

from rsnet.parallel import batching, schedule
from rsnet.parallel.schedule import Schedule

FAST = sim.Link("test link", 1e15, 0.0)  # communication that costs nothing
# The shipped settings but a constant 4 rounds between merges: the figures of the tests below are worked out for 4.
SETTINGS = sim.SimSettings.from_configs(trainer_config("adaptive", merge_rounds=4, merge_rounds_max=None),
                                        trainer_config("sync"), trainer_config("static"),
                                        training_config()["batch_size"])


def pair(slowdown: float, a: float = 0.0, c: float = 0.01, intervals: int = 30, link: sim.Link = FAST,
         worker_batch: int = 16) -> sim.Scenario:
    """Two CPU-like workers, the second ``slowdown`` times slower; B = 32 (the conf default)."""
    device = sim.DeviceProfile("dev", a, c)
    devices = [device, device.slowed(slowdown) if slowdown != 1 else device]
    return sim.build_scenario("pair", devices, sim.TEST_RESNET_21, link, worker_batch, SETTINGS, intervals,
                              store_rtt=0.0)


def test_ring_allreduce_formula():
    link = sim.Link("l", bandwidth=1e9, latency=1e-3)
    assert sim.ring_allreduce_seconds(1e9, 4, link) == pytest.approx(2 * 3 / 4 + 4e-3)
    assert sim.ring_allreduce_seconds(1e9, 2, link) == pytest.approx(1.0 + 2e-3)
    assert sim.ring_allreduce_seconds(1e9, 1, link) == 0.0
    # 2.5 buckets: the bandwidth term is the same, the latency is paid once per bucket
    assert sim.bucketed_allreduce_seconds(2.5e8, 4, link, int(1e8)) == pytest.approx(2 * 3 / 4 * 0.25 + 3 * 4e-3)


def test_merge_sends_parameters_buffers_and_header():
    link = sim.Link("l", bandwidth=1e9, latency=0.0)
    model = sim.ModelSpec("m", params=1000, float_buffers=24, int_buffers=2)
    header = 8 * (2 + 8 * 3 + 2)  # weight, count, 8 meta fields per worker, integer buffers (float64)
    assert sim.merge_seconds(model, 3, link) == pytest.approx(2 * 2 / 3 * (header + 4 * 1024) / 1e9)
    assert sim.gradient_allreduce_seconds(model, 3, link) == pytest.approx(2 * 2 / 3 * 4000 / 1e9)


def test_profiles():
    gpu = sim.gpu_profile("g", 2000, 256, "figure")
    assert gpu.speed(256) == pytest.approx(2000)
    assert gpu.a == sim.GPU_STEP_OVERHEAD_S
    slow = gpu.slowed(4)
    assert slow.step_seconds(100) == pytest.approx(4 * gpu.step_seconds(100))
    assert sim.CPU_RESNET18_64.c > 0 and sim.STORE_RTT_LOCAL_S > 0
    fitted = sim.fit_profile("f", [8, 16, 32], [0.01 + 0.02 * b for b in (8, 16, 32)])
    assert (fitted.a, fitted.c) == (pytest.approx(0.01), pytest.approx(0.02))


def test_settings_come_from_the_yaml_files():
    adaptive = OmegaConf.load(CONF / "trainer" / "adaptive.yaml")
    settings = sim.SimSettings.from_configs(trainer_config("adaptive"), trainer_config("sync"),
                                            trainer_config("static"), 32)
    schedule = settings.schedule
    assert (schedule.merge_rounds, schedule.batch_min, schedule.batch_max, schedule.damping, schedule.share_min) == (
        adaptive.merge_rounds, adaptive.batch_min, adaptive.batch_max, adaptive.damping, adaptive.share_min)
    assert settings.speed_ema == adaptive.speed_ema
    assert settings.sync_batch_min == OmegaConf.load(CONF / "trainer" / "sync.yaml").batch_min
    assert settings.static_batch_min == OmegaConf.load(CONF / "trainer" / "static.yaml").batch_min


def test_identical_devices_adaptive_matches_sync():
    result = sim.compare(pair(1.0, a=0.005))
    ratio = result.adaptive.samples_per_s / result.sync.samples_per_s
    assert 0.95 < ratio <= 1.0
    assert result.static.samples_per_s == pytest.approx(result.sync.samples_per_s)


def test_one_to_two_pair_gains_half():
    """Speeds 1 : 1/2 — sync runs at the slow worker's pace (2 × 1/2), adaptive at 1 + 1/2: 1.5 × sync's samples/s,
    less the merges and the wait at each interval's end."""
    result = sim.compare(pair(2.0, link=sim.ETHERNET_10G))
    ratio = result.adaptive.samples_per_s / result.sync.samples_per_s
    assert 1.40 < ratio < 1.5 / (1 - result.sync.comm_share) + 0.01
    assert result.adaptive.comm_share < 0.02
    # idle: the speed probes' second (3.5 % of the run) and the grid of 2 (22 / 10 for 21.3 / 10.7)
    assert max(result.adaptive.idle) < 0.15 and max(result.sync.idle) > 0.45


def test_batch_sizes_converge_to_speed_shares():
    scenario = pair(3.0, worker_batch=32)  # B = 64, speeds 3 : 1
    result = sim.simulate_adaptive(scenario)
    assert all(sum(sizes) == 64 for sizes in result.sizes)
    # the slow worker's probe (3x the fast one's) outlasts the grace: pending for the first interval, then admitted
    # with the sizes of the speeds at once
    assert result.sizes[0] == [64, 0] and result.sizes[1] == [48, 16]
    assert result.sizes[-1] == [48, 16] == sim.static_split(scenario)
    assert result.update_balance > 0.85
    assert sum(result.worker_samples) == scenario.samples  # every position is trained exactly once


def test_a_pair_at_two_to_one_claims_two_to_one_with_equal_updates():
    """test_parallel.py's two processes at 2 : 1 (B = 48, 4 rounds a merge, 960 samples, 3 epochs) on the simulated
    clock, for what real processes show only as fast as the machine lets them: the fast worker claims about twice
    the samples, both do the same number of updates in every interval after the first, and the sizes settle."""
    scenario = replace(pair(2.0, c=0.001, worker_batch=24), samples=960, epochs=3)
    result = sim.simulate_adaptive(scenario)
    assert len(result.sizes) == 3 * 960 // 192 and result.sizes[0] == [24, 24]
    assert result.sizes[1:] == [[32, 16]] * (len(result.sizes) - 1)  # b_0 / b_1 = 2, settled at once
    assert 1.9 <= result.worker_samples[0] / result.worker_samples[1] <= 2.1
    assert all(updates == [4, 4] for updates in result.interval_updates[1:])
    assert sum(result.worker_samples) == 3 * 960


def test_static_split_can_measure_in_its_first_epoch():
    scenario = replace(pair(3.0, worker_batch=32), epochs=3)  # speeds 3 : 1, B = 64
    measured_first = sim.simulate_static(scenario, measuring_epochs=1)
    one = replace(scenario, epochs=1)
    # trainer=static: the first epoch is sync's equal split (32 / 32), then 48 / 16 for the other two
    expected = sim.simulate_sync(one).wall_s + 2 * sim.simulate_static(one).wall_s
    assert measured_first.wall_s == pytest.approx(expected)
    assert sim.simulate_static(scenario).wall_s < measured_first.wall_s
    assert measured_first.worker_samples[0] == pytest.approx(scenario.samples * (0.5 + 2 * 0.75))
    assert measured_first.sizes == [[48, 16]]


def test_the_simulated_cadence_follows_the_lr_like_the_trainers():
    following = replace(SETTINGS, schedule=replace(SETTINGS.schedule, merge_rounds=2, merge_rounds_max=16))
    scenario = replace(pair(1.0), samples=1024, epochs=4, settings=following)
    result = sim.simulate_adaptive(scenario)
    assert sum(result.worker_samples) == 4 * 1024
    # 2 rounds of B = 32 (2 updates a worker) at the peak lr, 16 at its end: 31 merges, not 4 x 16
    assert result.interval_updates[0] == [2, 2] and sum(result.worker_samples) == 4 * 1024
    assert result.interval_updates[1] == [2, 2] and result.interval_updates[-1] == [16, 16]
    assert len(result.sizes) == 31


def test_claims_cover_an_epoch_exactly_once():
    scenario = replace(pair(2.0), samples=1000, epochs=3)  # 4 rounds of 32: 7 intervals of 128 and one of 104
    result = sim.simulate_adaptive(scenario)
    assert sum(result.worker_samples) == 3000
    # the first interval at the equal split (the fast worker claims more batches), then 22 / 10: 4 batches each
    assert result.interval_updates[0] == [5, 3] and result.interval_updates[1] == [4, 4]
    assert len(result.sizes) == 3 * 8


def test_threshold_is_monotone_in_bandwidth():
    thresholds = []
    for bandwidth in (1e8, 1e9, 1e10, 1e11):
        link = sim.Link("l", bandwidth, 20e-6)
        thresholds.append(sim.compare(pair(2.0, a=0.01, link=link, intervals=10)).threshold)
    assert thresholds == sorted(thresholds, reverse=True) and thresholds[0] > thresholds[-1]


def test_threshold_meets_the_share():
    merge_s, rate = 0.2, 1000.0
    m = sim.comm_threshold_interval(merge_s, rate)
    assert merge_s / (m / rate + merge_s) < 0.05 <= merge_s / ((m - 1) / rate + merge_s)


def test_drives_the_real_controller(monkeypatch):
    """With frozen equal sizes the fast worker still claims about twice as often (dynamic claiming alone balances the
    time), but it then does about twice the updates; the controller's sizes bring the updates together."""
    scenario = pair(2.0)
    adapted = sim.simulate_adaptive(scenario)
    monkeypatch.setattr(schedule, "next_batch_sizes", lambda current, *args, **kwargs: list(current))
    frozen = sim.simulate_adaptive(scenario)
    assert adapted.sizes[-1] == [22, 10] and frozen.sizes[-1] == [16, 16]
    assert frozen.interval_updates[-2] == [5, 3]
    assert adapted.update_balance > 0.95 and frozen.update_balance < 0.65


def test_identical_workers_end_intervals_together_with_equal_updates():
    """Intervals are whole rounds of B and every claim is a full batch: identical workers train the same number of
    batches and reach each merge together."""
    scenario = sim.build_scenario("four", [sim.DeviceProfile("d", 0.01, 0.01)] * 4, sim.TEST_RESNET_21, FAST, 16,
                                  SETTINGS, 10, store_rtt=0.0)
    result = sim.simulate_adaptive(scenario)
    assert all(updates == [4, 4, 4, 4] for updates in result.interval_updates)
    probing = sim.speed_probes(scenario, 16)[2] / result.wall_s  # before the first interval, idle for everyone
    assert result.update_balance > 0.97 and max(result.idle) < probing + 0.01


def test_drives_the_real_claim_ahead_rule(monkeypatch):
    """A 1 : 8 pair kept together (leave_out=false): the slow worker claims its next batch of 4 only where the fast one
    cannot finish the interval meanwhile. Claiming ahead always, it holds a batch at the interval's end that the
    fast worker could have trained, and the fast worker waits for it at the merge (idle 21 % instead of 7 %)."""
    scenario = pair(8.0, a=0.005, intervals=10)
    kept = replace(scenario.settings.schedule, leave_out=False)
    scenario = replace(scenario, settings=replace(scenario.settings, schedule=kept))
    ruled = sim.simulate_adaptive(scenario)
    monkeypatch.setattr(batching, "may_claim_ahead", lambda *args, **kwargs: True)
    ahead = sim.simulate_adaptive(scenario)
    assert ruled.sizes[-1] == ahead.sizes[-1] == [28, 4]
    assert ruled.wall_s < 0.9 * ahead.wall_s and ruled.idle[0] < ahead.idle[0] - 0.1


def test_a_device_that_costs_more_than_it_adds_is_left_out():
    """1 : 20: the slow worker's speed probe outlasts the fast one's grace, so it is pending while the fast worker
    trains; its probe's speed arrives at a merge, its share of B is below batch_min, and it is left out without
    having trained: 0.98 of the fastest device alone over 60 intervals (the fast worker's probe and grace, 1.2 s)."""
    result = sim.compare(pair(20.0, a=0.005, intervals=60))
    assert result.adaptive.active == [True, False] and "worker 1 is pending" in result.adaptive.notes[0]
    assert any(note.startswith("leaving out worker 1") for note in result.adaptive.notes)
    assert result.adaptive.sizes[-1] == [32, 0] and all(sizes == [32, 0] for sizes in result.adaptive.sizes)
    assert result.adaptive.updates[1] == 0
    assert 0.98 < result.adaptive.samples_per_s / result.single.samples_per_s < 1.0


def test_a_slow_workers_probe_never_holds_the_others(monkeypatch):
    """1 : 20, each device's first step 0.4 s longer (allocations, kernel choice; × 20 on the slow one: its probe
    takes 18 s): the fast worker trains from the end of its grace, 0.99× the fastest device alone. Waiting for every
    probe before the first interval would cost it those 18 s of a 250 s run: 0.93×. Fails if the probe holds the
    others."""
    scenario = pair(20.0, a=0.005, intervals=60)
    devices = [replace(device, first_step=0.4 * factor) for device, factor in zip(scenario.devices, (1, 20))]
    scenario = replace(scenario, devices=devices, epochs=3)
    graced = sim.compare(scenario)
    monkeypatch.setattr(runs, "PROBE_GRACE_STEPS", 10**6)
    waiting = sim.compare(scenario)
    assert graced.adaptive.samples_per_s / graced.single.samples_per_s > 0.98
    assert waiting.adaptive.samples_per_s / waiting.single.samples_per_s < 0.95


def _cli(monkeypatch):
    """benchmarks/sim_scheduler.py as an importable module (spawned processes unpickle its functions by name)."""
    return importlib.import_module("sim_scheduler")


def test_loopback_link_is_measured_with_two_gloo_processes(monkeypatch, capsys):
    link = _cli(monkeypatch).measure_loopback(sizes=(1 << 16, 32 << 20), repeats=5)
    # 32 MiB takes longer than 64 KiB through gloo, also on a loaded machine: a positive, finite bandwidth
    assert 0 < link.bandwidth < float("inf")
    assert "loopback all-reduce (2 gloo processes, 1 thread each): 0.0625 MiB" in capsys.readouterr().out


def test_cli_prints_the_tables(monkeypatch, capsys):
    cli = _cli(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["sim_scheduler.py", "--quick"])
    cli.main()
    out = capsys.readouterr().out
    assert out.count("| scenario | W | B | rounds | limit Σs/s_max | single /s |") == 3
    assert "| 8 x A100 (identical) | 8 | 2048 |" in out


def test_local_sgd_waits_for_the_slowest_every_h_steps_and_merges_then():
    """trainer=local_sgd: sync's equal shards, but one merge per H local steps (and at each epoch's end) instead of a
    gradient all-reduce every step; an interval lasts as long as the slowest worker's H steps."""
    settings = sim.SimSettings.from_configs(trainer_config("adaptive"), trainer_config("sync"),
                                            trainer_config("static"), 32, trainer_config("local_sgd", average_every=4))
    assert settings.local_average_every == 4
    even = replace(pair(1.0), settings=settings)
    local, sync = sim.simulate_local_sgd(even), sim.simulate_sync(even)
    assert local.samples_per_s == pytest.approx(sync.samples_per_s)  # no communication cost, equal devices
    assert local.updates == sync.updates and local.worker_samples == sync.worker_samples
    link = sim.Link("slow", 1e8, 1e-3)
    costly = replace(pair(2.0, link=link), settings=settings)
    local = sim.simulate_local_sgd(costly)
    steps = len(batching.static_batches(torch.arange(-(-costly.samples // 2)), 16, 8))
    merges = costly.epochs * -(-steps // 4)
    assert local.comm_s == pytest.approx(merges * sim.merge_seconds(costly.model, 2, link))
    assert local.idle[0] > 0.4 and local.idle[1] == pytest.approx(0.0, abs=1e-9)  # the fast worker waits
    assert sim.simulate_sync(costly).comm_s > local.comm_s  # one merge per 4 steps vs an all-reduce per step


def test_a_run_that_loses_a_device_trains_every_sample_and_pays_the_interval_in_flight():
    """Three equal devices, one lost at 31 % of the samples: the survivors go on from the last merge (every sample
    merged once in the end, the lost interval's trained again), slower than the three together by at least the
    restart, faster than the two alone from the start; with nothing changing it is the undisturbed run."""
    device = sim.DeviceProfile("dev", 0.0, 0.01)
    scenario = sim.build_scenario("three", [device] * 3, sim.TEST_RESNET_21, FAST, 16, SETTINGS, 30, store_rtt=0.0)
    total = scenario.samples * scenario.epochs
    whole = sim.simulate_adaptive(scenario)
    assert sim.simulate_membership(scenario, [], restart_s=5.0).wall_s == pytest.approx(whole.wall_s)
    lost = sim.simulate_membership(scenario, [sim.Change(0.31, device)], restart_s=5.0)
    first, rest = lost.launches
    assert first.committed < 0.31 * total < first.committed + 4 * 48  # the interval in flight (4 rounds of B = 48)
    assert rest.committed == total and first.samples + rest.samples == total  # every sample merged once
    assert lost.retrained == int(0.31 * total) - first.committed > 0
    assert len(rest.worker_samples) == 2  # the survivors
    alone = sim.simulate_adaptive(replace(scenario, devices=(device, device)))
    assert whole.wall_s + 5.0 < lost.wall_s < alone.wall_s + 5.0
    joined = sim.simulate_membership(scenario, [sim.Change(0.31, device), sim.Change(0.5, device, joins=True)], 5.0)
    assert [len(launch.worker_samples) for launch in joined.launches] == [3, 2, 3]
    assert joined.launches[1].committed >= 0.5 * total and joined.retrained == lost.retrained  # an arrival loses none
    assert sum(launch.samples for launch in joined.launches) == total
