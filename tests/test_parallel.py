"""The scheduler end to end on two CPU processes over gloo: claiming, adaptation, merging, baselines, faults.

Worker functions live at module level so the spawned processes can unpickle them. Each test runs a
tiny model on random tensors through a loop that mirrors the trainer's.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import signal
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist
from helpers import HANG_S, trainer_config, wait_for, wait_for_exit
from torch import nn

from rsnet.parallel import WorkerContext, WorkerError, build_strategy, launch, launch_options, summarize
from rsnet.parallel.merge import MergeResult, merge_share, merge_tensors, normalized_merge, pack_header
from rsnet.parallel.speed_probe import PROBE_FAILED, SpeedProbe
from rsnet.parallel.strategies import adaptive as adaptive_module
from rsnet.parallel.strategies import base as strategy_base

TIMEOUT = 30.0


def _model(seed: int = 0, batchnorm: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(6, 8)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(8))
    layers += [nn.ReLU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers)


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(123)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _probe_step(model: nn.Module, sample_s: float, hold: threading.Event | None = None):
    """The trainer's speed probe in miniature: a step on a private copy of ``model`` and random inputs that reports
    ``sample_s`` a sample as its own time (a simulated device: the speed is fed, whatever the machine's load; 0: timed
    by the wall clock). ``hold``: every step waits for it (a probe still running when the others start)."""
    replica = copy.deepcopy(model)
    optimizer = torch.optim.SGD(replica.parameters(), lr=0.01)

    def step(batch_size: int) -> float | None:
        if hold is not None:
            hold.wait()
        optimizer.zero_grad()
        replica(torch.randn(batch_size, 6)).sum().backward()
        optimizer.step()
        return sample_s * batch_size or None

    return step


def _broken_probe_step(how: str):
    """A probe step that raises, or that never returns (``hangs``)."""
    never = threading.Event()

    def step(batch_size: int) -> float:
        if how == "raises":
            raise ValueError("a probe step that raises")
        never.wait()
        return 1.0

    return step


def _loop(strategy, optimizer, x, y, epochs: int, lr: float = 0.05, sample_s: float = 0.0, held: bool = False,
          together: bool = False, broken_probe: str | None = None) -> list[list[int]]:
    """The trainer's loop in miniature on a simulated clock: a step of b samples reports ``sample_s`` × b seconds
    (``trainer.slowdown`` stretches them), so the speeds the scheduler sees are fed, not measured. Returns the
    indices this worker got, per epoch.

    The probe ends before the first interval (every worker is in merge 0's table), or where ``held`` it is released
    at merge 1 and ends before merge 2 (the worker is pending for exactly the first interval, its speed reaches merge
    2). ``together``: every worker takes its first batch of an interval before any takes a second (a barrier), so that
    every worker admitted trains in every interval however the processes are scheduled. ``broken_probe``: this
    worker's probe raises or hangs (:func:`_broken_probe_step`), and the loop goes on without waiting for it."""
    seen = []
    hold = threading.Event() if held else None
    merges = 0
    for epoch in range(epochs):
        seen.append([])
        if strategy.wants_probe and broken_probe:
            strategy.probe_speed(_broken_probe_step(broken_probe))
        elif strategy.wants_probe:
            strategy.probe_speed(_probe_step(strategy.model, sample_s, hold))
            if hold is None:
                strategy._probe.wait()
        for interval in strategy.intervals(epoch):
            compute, met = 0.0, not together
            for claim in strategy.claims(interval):
                indices = claim.indices
                for group in optimizer.param_groups:
                    group["lr"] = lr * strategy.lr_scale(len(indices))
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(strategy.model(x[indices]), y[indices])
                loss.backward()
                optimizer.step()
                seconds = sample_s * len(indices)
                compute += seconds
                strategy.after_step(len(indices), seconds)
                seen[-1].extend(indices.tolist())
                if not met:
                    dist.barrier()
                    met = True
            if not met:  # no batch of this interval for this worker: it still meets the others once
                dist.barrier()
            if hold is not None and merges == 1:
                strategy._probe.wait()  # released at merge 1: its speed is in merge 2's table
            strategy.end_interval(compute)
            merges += 1
            if hold is not None and merges == 1:
                hold.set()
        strategy.end_epoch()
    return seen


def _gather(obj):
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


# ----------------------------------------------------------------------------------- worker functions


def _adaptive_worker(ctx, n: int, epochs: int, trainer: dict, sample_s: float, held: int | None = None,
                     together: bool = True):
    """``held``: the rank whose probe ends only after merge 1 (:func:`_loop`)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    strategy = build_strategy(trainer, ctx, model, n, 48, seed=7)
    x, y = _data(n)
    seen = _loop(strategy, optimizer, x, y, epochs, sample_s=sample_s, held=ctx.rank == held, together=together)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    claim_counters = [f"{strategy.prefix}/e{epoch}/i{interval}" for epoch in range(epochs) for interval in range(64)]
    return {"seen": _gather(seen), "rows": strategy.stats(), "state": _gather(state),
            "summary": strategy.summary(), "strategy_state": strategy.state_dict(),
            "lr_scale": strategy.lr_scale(strategy.batch_size),
            "counters_left": [key for key in claim_counters if ctx.store.check([key])]}


def _host_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _merge_worker(ctx, weights: list[float], elastic: float = 1.0, members: list[int] | None = None):
    model = _model(seed=10 + ctx.rank).to(ctx.device)  # a different replica per worker
    model.train()
    for _ in range(ctx.rank + 1):  # different BN statistics and num_batches_tracked
        model(torch.randn(5, 6, device=ctx.device) * (ctx.rank + 1))
    before = _host_state(model)
    result = normalized_merge(model, weights[ctx.rank], meta=torch.full((2,), float(ctx.rank + 1)),
                              comm_device=ctx.comm_device, members=members, elastic=elastic)
    return {"before": _gather(before), "after": _gather(_host_state(model)), "meta": result.meta,
            "total": result.total_weight}


def _static_worker(ctx, trainer: dict, n: int, batch: int, epochs: int, staged: bool = False):
    # staged: every worker takes the host-staged collectives of a group with GPU and CPU workers (the GPU check
    # runs them on a GPU; here they run on CPU tensors, where staging is a no-op and must change nothing)
    joined_staged = ctx.stage_through_host
    ctx = dataclasses.replace(ctx, stage_through_host=staged)
    model = _model(batchnorm=trainer["name"] == "local_sgd")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy(trainer, ctx, model, n, batch, seed=5)
    x, y = _data(n)
    seen = _loop(strategy, optimizer, x, y, epochs, lr=0.1)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return {"seen": _gather(seen), "state": _gather(state), "rows": strategy.stats(),
            "lr_scale": strategy.lr_scale(batch // ctx.world_size), "joined_staged": joined_staged,
            "torch_averager": getattr(strategy, "use_torch_averager", None)}


def _regression_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(n, 6, generator=generator)
    return x, x @ torch.arange(1.0, 7.0).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=generator)


def _first_order_worker(ctx, lr: float):
    """One adaptive interval of 64 samples at batches 24 / 8 (B = 32) on a linear model, claimed in lockstep
    rounds so that each worker does 2 updates; returns the replicas before and after the merge."""
    torch.manual_seed(0)
    model = nn.Linear(6, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = trainer_config("adaptive", merge_rounds=2, merge_cost_max=0, log_intervals=False)
    strategy = build_strategy(trainer, ctx, model, 64, 32, seed=1)
    strategy.schedule.sizes[:] = [24, 8]
    strategy.speed, strategy.schedule.started = 1.0, True  # known: no speed probe
    x, y = _regression_data(64)
    start = copy.deepcopy(model.state_dict())
    claimed = []
    intervals = strategy.intervals(0)
    assert next(intervals) == 0
    for claim in strategy.claims(0):
        _local_step(strategy, optimizer, model, x, y, claim.indices.tolist(), lr)
        claimed.append(claim.indices.tolist())
        dist.barrier()  # both workers claim once per round
    local = copy.deepcopy(model.state_dict())
    strategy.end_interval(0.02)
    assert next(intervals, None) is None  # 64 = 2 rounds of 32: one interval
    return {"start": start, "local": _gather(local), "claimed": _gather(claimed),
            "merged": copy.deepcopy(model.state_dict()), "rows": strategy.stats()}


def _local_step(strategy, optimizer, model: nn.Module, x: torch.Tensor, y: torch.Tensor, indices: list[int],
                lr: float) -> None:
    """One worker's SGD step on ``indices`` at lr × the strategy's lr scale, counted by the strategy."""
    for group in optimizer.param_groups:
        group["lr"] = lr * strategy.lr_scale(len(indices))
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x[indices]), y[indices]).backward()
    optimizer.step()
    strategy.after_step(len(indices), 0.01)


# Three workers' batches in one interval: worker 0 four of 16, worker 1 six of 8, worker 2 two of 8 (update balance
# 2 / 6); 128 samples, four sync steps of B = 32.
UNBALANCED = [[16] * 4, [8] * 6, [8] * 2]


def _unbalanced_worker(ctx, lr: float, merge_weight: str):
    """The interval of UNBALANCED on a linear model, merged by the strategy with ``merge_weight``."""
    torch.manual_seed(0)
    model = nn.Linear(6, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = trainer_config("adaptive", merge_weight=merge_weight, log_intervals=False)
    strategy = build_strategy(trainer, ctx, model, 128, 32, seed=1)
    x, y = _regression_data(128)
    start = copy.deepcopy(model.state_dict())
    first = sum(sum(sizes) for sizes in UNBALANCED[:ctx.rank])
    for size in UNBALANCED[ctx.rank]:
        _local_step(strategy, optimizer, model, x, y, list(range(first, first + size)), lr)
        first += size
    strategy.end_interval(0.02)
    return {"start": start, "merged": copy.deepcopy(model.state_dict()), "rows": strategy.stats()}


def _crash_worker(ctx, how: str):
    tensor = torch.ones(1)
    for step in range(10_000):
        if ctx.rank == 1 and step == 3:
            if how == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if how == "exit":
                os._exit(3)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("boom in worker one")
        dist.all_reduce(tensor)
    return "unreachable"


# ----------------------------------------------------------------------------------------------- tests


def test_adaptive_claims_every_index_once_and_adapts_to_a_slow_worker() -> None:
    """Two processes over gloo at fed speeds 2 : 1 (the simulated clock of :func:`_loop`): every index claimed once
    per epoch, identical replicas after every merge, batch sizes 32 / 16 (B = 48 in multiples of 2) from the probes
    on, the lr scale and the merge's bookkeeping. How the claims split an interval at those speeds, the update
    balance and the sizes settling are the simulator's tests (test_sim.py), which drive the same claim rules on a
    simulated clock."""
    n, epochs = 960, 3
    trainer = trainer_config("adaptive", merge_rounds=4, merge_cost_max=0, warmup_intervals=1, leave_out=False)
    out = launch(_adaptive_worker, ["cpu", "cpu"], n, epochs, trainer, 0.001, slowdown=[1.0, 2.0], timeout_s=TIMEOUT)
    # Dynamic claiming: each epoch's indices are covered exactly once across the two workers.
    for epoch in range(epochs):
        claimed = out["seen"][0][epoch] + out["seen"][1][epoch]
        assert sorted(claimed) == list(range(n))
    # After every merge the replicas are identical.
    assert all(torch.equal(out["state"][0][k], out["state"][1][k]) for k in out["state"][0])
    rows = out["rows"]
    assert len(rows) == epochs * n // 192  # intervals of 4 rounds of B = 48
    # every interval whole, both workers in every one (both probes were in merge 0's table)
    assert all(row["n/0"] + row["n/1"] == 192 and row["updates/0"] >= 1 and row["updates/1"] >= 1 for row in rows)
    # The speeds the workers fed (1 ms a sample, the second stretched 2x) reach every merge exactly, and the batch
    # sizes follow them: the equal split through the warm-up interval, then 32 / 16 for good.
    assert all(row["s/0"] == pytest.approx(1000.0) and row["s/1"] == pytest.approx(500.0) for row in rows)
    sizes = [(row["b/0"], row["b/1"], row["b_next/0"], row["b_next/1"]) for row in rows]
    assert sizes == [(24, 24, 24, 24), (24, 24, 32, 16)] + [(32, 16, 32, 16)] * (len(rows) - 2)
    for row in rows:
        assert row["p/0"] + row["p/1"] == pytest.approx(1.0)
        assert row["b/0"] % 2 == 0 and row["b/1"] % 2 == 0  # the grid for 24 samples a worker
        assert row["merge_time"] > 0
    # Every worker's idle and merge times reach the rows (gathered once an epoch), and no claim counter is left.
    # (the idle time is the wait in the merge's first all-reduce: a part of the worker's merge)
    assert all(0 < row[f"merge_time/{rank}"] and row[f"idle/{rank}"] <= row[f"merge_time/{rank}"]
               for row in rows for rank in (0, 1))
    assert all(row["merge_time"] == max(row["merge_time/0"], row["merge_time/1"]) for row in rows)
    assert out["counters_left"] == []
    assert "simulated" in out["summary"] or "slowdown" in out["summary"]
    assert out["strategy_state"]["batch_sizes"] == [32, 16]
    assert out["lr_scale"] == pytest.approx(32 / 24)  # b_i / (B / W), B = 48, W = 2


def test_merge_weights_by_samples_are_the_ablation_of_weights_by_updates() -> None:
    # leave_out=false: admission weighs each worker against the measured cost of a merge (on a busy machine the 1 : 3
    # worker may be left out); the rule here is the merge's weights
    trainer = trainer_config("adaptive", merge_rounds=2, merge_cost_max=0, merge_weight="samples",
                             log_intervals=False, leave_out=False)
    rows = launch(_adaptive_worker, ["cpu", "cpu"], 192, 2, trainer, 0.001, slowdown=[1.0, 3.0],
                  timeout_s=TIMEOUT)["rows"]
    assert len(rows) == 4  # intervals of 2 rounds of B = 48, both workers in every one
    assert all(row["n/0"] > 0 and row["n/1"] > 0 for row in rows)
    for row in rows:  # p_i = n_i / (n_0 + n_1), Σ p = 1 over the merge's members
        assert row["p/0"] == pytest.approx(row["n/0"] / (row["n/0"] + row["n/1"]))
        assert row["p/0"] + row["p/1"] == pytest.approx(1.0)
    assert any(row["n/0"] / row["n/1"] != row["updates/0"] / row["updates/1"] for row in rows)  # the rules differ
    with pytest.raises(ValueError, match="trainer.merge_weight='steps': use one of uniform, updates, samples"):
        build_strategy(trainer_config("adaptive", merge_weight="steps"), _offline_context(), _model(), 64, 32, seed=0)


def _assert_weighted_mean(out: dict, weights: list[float], members: list[int]) -> None:
    """Each member's floating tensors are the members' mean weighted by ``weights``, its integer buffers the first
    member's; the header's meta is summed over every worker."""
    before, after = out["before"], out["after"]
    p = {rank: weights[rank] / sum(weights[r] for r in members) for rank in members}
    for key, value in before[members[0]].items():
        for rank in members:
            if value.is_floating_point():
                expected = sum(p[r] * before[r][key] for r in members)
                assert torch.allclose(after[rank][key], expected, atol=1e-6), key
            else:  # num_batches_tracked: the first member's
                assert torch.equal(after[rank][key], before[members[0]][key]), key
    assert any("running_var" in key for key in before[0])
    assert before[0]["1.num_batches_tracked"] != before[1]["1.num_batches_tracked"]
    assert out["total"] == pytest.approx(sum(weights[r] for r in members))
    world = len(before)
    assert out["meta"].tolist() == [world * (world + 1) / 2] * 2


def test_normalized_merge_equals_weighted_average_by_hand() -> None:
    weights = [3.0, 1.0]
    _assert_weighted_mean(launch(_merge_worker, ["cpu", "cpu"], weights, timeout_s=TIMEOUT), weights, [0, 1])


def test_a_merge_over_members_leaves_the_others_replicas_alone() -> None:
    """Workers 1 and 2 train, worker 0 is left out: they merge among themselves (weights 1 : 3, integer buffers
    worker 1's), worker 0 keeps its replica and still receives the summed table."""
    weights = [5.0, 1.0, 3.0]
    out = launch(_merge_worker, ["cpu", "cpu", "cpu"], weights, 1.0, [1, 2], timeout_s=TIMEOUT)
    _assert_weighted_mean(out, weights, [1, 2])
    assert all(torch.equal(out["after"][0][k], v) for k, v in out["before"][0].items())

def test_elastic_merge_moves_each_replica_part_of_the_way() -> None:
    """θ_i ← θ_i + α(θ̄ − θ_i) with α = 0.25 and uniform weights: the replicas stay apart, their mean is θ̄."""
    out = launch(_merge_worker, ["cpu", "cpu"], [1.0, 1.0], 0.25, timeout_s=TIMEOUT)
    before, after = out["before"], out["after"]
    for key, value in before[0].items():
        if not value.is_floating_point():
            assert torch.equal(after[1][key], before[0][key]), key  # num_batches_tracked: rank 0's
            continue
        mean = (before[0][key] + before[1][key]) / 2
        for rank in range(2):
            assert torch.allclose(after[rank][key], before[rank][key] + 0.25 * (mean - before[rank][key]),
                                  atol=1e-6), key
        assert torch.allclose((after[0][key] + after[1][key]) / 2, mean, atol=1e-6), key
    assert not torch.equal(after[0]["0.weight"], after[1]["0.weight"])


def _leave_out_worker(ctx, n: int, trainer: dict, held: int | None = None):
    out = _adaptive_worker(ctx, n, 2, trainer, 0.001, held)
    out["active"] = out["strategy_state"]["active"]
    return out


def test_a_slow_worker_is_pending_then_left_out_and_costs_the_other_nothing() -> None:
    """At 1 : 20 the slow worker's speed probe is still running when the fast worker's grace ends (held until merge
    1): it is pending, and the fast worker trains every sample of the first interval. Its probe's speed arrives at
    merge 2; its share of B is below batch_min, so it is left out for the rest of the run (whatever the merges'
    measured cost: test_schedule.py), it never trains and gets no copy of the model (it evaluates nothing).
    trainer.leave_out=false admits it there, with the merged model."""
    n, trainer = 960, trainer_config("adaptive", merge_rounds=4, merge_cost_max=0)
    out = launch(_leave_out_worker, ["cpu", "cpu"], n, trainer, 1, slowdown=[1.0, 20.0], timeout_s=TIMEOUT)
    rows = out["rows"]
    assert out["active"] == [True, False] and out["strategy_state"]["pending"] == [False, False]
    assert all(row["n/1"] == 0 and row["b_next/1"] == 0 and row["active/1"] == 0.0 for row in rows)
    assert rows[0]["s/1"] == 0 and rows[1]["s/1"] == pytest.approx(50.0)  # the probe's speed reached merge 2
    assert all(row["b_next/0"] == 48 for row in rows) and out["lr_scale"] == 1.0
    for epoch in range(2):
        assert sorted(out["seen"][0][epoch]) == list(range(n)) and out["seen"][1][epoch] == []
    assert not all(torch.equal(out["state"][0][k], out["state"][1][k]) for k in out["state"][0])  # no hand-off
    assert "(left out)" in out["summary"]
    kept = launch(_leave_out_worker, ["cpu", "cpu"], n, {**trainer, "leave_out": False}, 1, slowdown=[1.0, 20.0],
                  timeout_s=TIMEOUT)
    assert kept["active"] == [True, True] and sum(row["n/1"] for row in kept["rows"]) > 0
    # admitted at merge 2 (rows[1]), it trains in every interval after it
    assert [row["n/1"] for row in kept["rows"][:2]] == [0, 0] and all(row["n/1"] > 0 for row in kept["rows"][2:])
    assert all(torch.equal(kept["state"][0][k], kept["state"][1][k]) for k in kept["state"][0])


def _broken_probe_worker(ctx, n: int, trainer: dict, broken: int, how: str):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    strategy = build_strategy(trainer, ctx, model, n, 48, seed=7)
    if ctx.rank == broken and how == "hangs":
        strategy.probe_timeout_s = 0.0  # past its time as soon as it has started (a probe that never returns)
    seen = _loop(strategy, optimizer, *_data(n), 2, sample_s=0.001, together=True,
                 broken_probe=how if ctx.rank == broken else None)
    return {"seen": _gather(seen), "rows": strategy.stats(), "state": strategy.state_dict()}


@pytest.mark.parametrize("how", ["raises", "hangs"])
def test_a_probe_that_raises_or_hangs_leaves_out_its_worker_not_the_run(how: str) -> None:
    """Three workers; worker 1's speed probe raises, or never returns (past trainer.probe_timeout_s): it is left out
    at merge 0 (not pending), the run trains on with the two others, and every sample is claimed once an epoch."""
    n = 288
    out = launch(_broken_probe_worker, ["cpu", "cpu", "cpu"], n, trainer_config("adaptive", merge_rounds=2), 1, how,
                 timeout_s=TIMEOUT)
    state, rows = out["state"], out["rows"]
    assert state["active"] == [True, False, True] and state["pending"] == [False, False, False]
    assert all(row["n/1"] == 0 and row["b_next/1"] == 0 and row["s/1"] == -1.0 for row in rows)
    assert all(row["n/0"] > 0 and row["n/2"] > 0 for row in rows)
    for epoch in range(2):
        assert out["seen"][1][epoch] == []
        assert sorted(out["seen"][0][epoch] + out["seen"][2][epoch]) == list(range(n))


def test_a_probe_reports_its_error_or_its_overrun_on_an_injected_clock() -> None:
    """SpeedProbe.failure: a step's error at once; a probe still running only once the clock has passed the
    timeout; none for a probe done with its speed (which it then reports)."""
    now = [0.0]
    raising = SpeedProbe(_broken_probe_step("raises"), 8, torch.device("cpu"), clock=lambda: now[0]).start()
    raising.wait()
    assert raising.result() == PROBE_FAILED
    assert raising.failure(600.0) == "failed: ValueError: a probe step that raises"
    hold = threading.Event()
    running = SpeedProbe(_probe_step(_model(), 0.01, hold), 8, torch.device("cpu"), clock=lambda: now[0]).start()
    now[0] = 5.0
    assert running.failure(5.0) is None and running.result() == 0.0
    now[0] = 5.5
    assert running.failure(5.0) == "has run for more than trainer.probe_timeout_s=5 s"
    hold.set()
    running.wait()
    assert running.failure(5.0) is None and running.result() == pytest.approx(100.0)  # 0.01 s a sample


def test_a_primary_left_out_gets_the_trained_model_at_every_epochs_end() -> None:
    """The primary saves the checkpoints: left out (here the slow worker is rank 0, at merge 0 from its probe), it
    gets the trained replica at the end of every epoch, the one hand-off a worker left out costs."""
    out = launch(_leave_out_worker, ["cpu", "cpu"], 480, trainer_config("adaptive", merge_rounds=4, merge_cost_max=0),
                 slowdown=[20.0, 1.0], timeout_s=TIMEOUT)
    assert out["active"] == [False, True] and all(row["n/0"] == 0 for row in out["rows"])
    assert all(torch.equal(out["state"][0][k], out["state"][1][k]) for k in out["state"][0])


def test_merged_interval_equals_sync_sgd_to_first_order() -> None:
    """With uniform p_i and lr ∝ b the merged interval is sync SGD (B = 32) on the same 64 samples up to
    second-order terms (tolerance 1 % of the step); weights p_i ∝ samples with lr ∝ b would count the batch size
    twice (1.25x sync's step at batches 24 / 8)."""
    lr = 5e-4
    out = launch(_first_order_worker, ["cpu", "cpu"], lr, timeout_s=TIMEOUT)
    claimed = out["claimed"]
    assert [len(c) for c in claimed[0]] == [24, 24] and [len(c) for c in claimed[1]] == [8, 8]
    row = out["rows"][0]
    assert row["updates/0"] == row["updates/1"] == 2 and row["p/0"] == row["p/1"] == 0.5
    x, y = _regression_data(64)
    everything = [i for worker in claimed for batch in worker for i in batch]
    assert sorted(everything) == list(range(64))
    model = nn.Linear(6, 1)
    model.load_state_dict(out["start"])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for batch in (everything[:32], everything[32:]):  # sync SGD: 2 steps of B = 32
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        optimizer.step()

    def flat(state: dict) -> torch.Tensor:
        return torch.cat([state[key].reshape(-1) for key in ("weight", "bias")])

    start, sync, merged = flat(out["start"]), flat(model.state_dict()), flat(out["merged"])
    step = (sync - start).norm()
    assert (merged - sync).norm() <= 0.01 * step
    # Weights by samples (48 / 16) on the same replicas are off by about a quarter.
    samples = [sum(len(c) for c in claimed[rank]) for rank in range(2)]
    by_samples = start + sum(n / 64 * (flat(out["local"][rank]) - start) for rank, n in enumerate(samples))
    assert (by_samples - sync).norm() >= 0.1 * step


@pytest.mark.parametrize("merge_weight", ["uniform", "updates"])
def test_uniform_merge_is_sync_sgd_whatever_the_update_balance(merge_weight: str) -> None:
    """Batches 16 / 8 / 8 with 4 / 6 / 2 updates against 4 sync steps (B = 32) on the same 128 samples: with lr ∝ b,
    uniform weights give every sample lr / B (0.05 % of the sync step off: second-order terms only); weights by
    updates, the reference's rule, over-weight the worker with the most updates (10.5 % of the step off)."""
    lr = 5e-4
    out = launch(_unbalanced_worker, ["cpu"] * 3, lr, merge_weight, timeout_s=TIMEOUT)
    row = out["rows"][0]
    assert [row[f"updates/{r}"] for r in range(3)] == [4, 6, 2]
    model = nn.Linear(6, 1)
    model.load_state_dict(out["start"])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = _regression_data(128)
    for step in range(4):
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x[step * 32:(step + 1) * 32]), y[step * 32:(step + 1) * 32]).backward()
        optimizer.step()

    def flat(state: dict) -> torch.Tensor:
        return torch.cat([state[key].reshape(-1) for key in ("weight", "bias")])

    start, sync, merged = flat(out["start"]), flat(model.state_dict()), flat(out["merged"])
    error = float((merged - sync).norm() / (sync - start).norm())
    if merge_weight == "uniform":
        assert [row[f"p/{r}"] for r in range(3)] == pytest.approx([1 / 3] * 3)
        assert error < 0.01
    else:
        assert [row[f"p/{r}"] for r in range(3)] == pytest.approx([4 / 12, 6 / 12, 2 / 12])
        assert error > 0.05


def test_merge_header_is_built_on_the_backend_device() -> None:
    """The header joins host tensors (weight, meta) with integer buffers that live on the model's GPU: every part
    must be moved to the backend's device first. 'meta' stands in for the second device here."""
    model = _model().to("meta")
    _, integer = merge_tensors(model)
    assert integer and all(t.device.type == "meta" for t in integer)  # num_batches_tracked on the "GPU"
    meta = torch.arange(4, dtype=torch.float64)
    header = pack_header(3.0, True, meta, integer, True, torch.device("meta"))
    assert header.device.type == "meta" and header.dtype == torch.float64 and header.numel() == 2 + 4 + 1
    host = pack_header(3.0, True, meta, [torch.tensor(7)], True, torch.device("cpu"))
    assert host.tolist() == [3.0, 1.0, 0.0, 1.0, 2.0, 3.0, 7.0]  # the source sends its integer buffers
    other = pack_header(3.0, True, meta, [torch.tensor(7)], False, torch.device("cpu"))
    assert other.tolist() == [3.0, 1.0, 0.0, 1.0, 2.0, 3.0, 0.0]  # the other members send zeros
    outside = pack_header(3.0, False, meta, [torch.tensor(7)], False, torch.device("cpu"))
    assert outside.tolist() == [0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.0]  # a non-member: its table only


def test_merge_share_by_hand() -> None:
    """p_i = w_i / Σ w; every weight 0 (no member updated): the uniform 1 / members."""
    assert merge_share(3.0, 4.0, 2.0) == 0.75 and merge_share(1.0, 4.0, 2.0) == 0.25
    assert merge_share(0.0, 4.0, 3.0) == 0.0  # a member that joins (weight 0) contributes nothing
    assert merge_share(0.0, 0.0, 3.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="at least one member"):
        merge_share(1.0, 1.0, 0.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check runs the GPU paths)")
def test_merge_on_cuda_with_batchnorm() -> None:
    """A GPU replica (BatchNorm statistics and num_batches_tracked on the GPU) merged with a CPU one."""
    weights = [3.0, 1.0]
    _assert_weighted_mean(launch(_merge_worker, ["cuda:0", "cpu"], weights, timeout_s=TIMEOUT), weights, [0, 1])


def _assert_equals_one_step_on_the_union(out: dict, n: int) -> None:
    """The trained state equals one single-process SGD step (lr 0.1) on both workers' first batches together."""
    model = _model(batchnorm=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data(n)
    indices = torch.tensor(out["seen"][0][0] + out["seen"][1][0])
    nn.functional.cross_entropy(model(x[indices]), y[indices]).backward()
    optimizer.step()
    for key, value in model.state_dict().items():
        assert torch.allclose(out["state"][0][key], value, atol=1e-6), key


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "host-staged"])
def test_sync_one_step_equals_single_process_step_on_concatenated_batch(staged: bool) -> None:
    n, batch = 16, 16  # one step: each worker gets 8 samples
    out = launch(_static_worker, ["cpu", "cpu"], trainer_config("sync"), n, batch, 1, staged, timeout_s=TIMEOUT)
    seen = out["seen"]
    assert len(seen[0][0]) == len(seen[1][0]) == 8
    for key in out["state"][0]:
        assert torch.equal(out["state"][0][key], out["state"][1][key])
    _assert_equals_one_step_on_the_union(out, n)
    assert out["lr_scale"] == 1.0
    assert out["rows"][0]["n/0"] == 8 and out["rows"][0]["updates/1"] == 1


@pytest.mark.parametrize("staged", [False, True], ids=["direct", "host-staged"])
def test_local_sgd_averages_replicas_uniformly_every_h_steps(staged: bool) -> None:
    n, batch, period = 24, 8, 2  # shards of 12, batches of 4: 3 local steps, averages after step 2 and at the end
    trainer = trainer_config("local_sgd", average_every=period, ref_batch=8)
    out = launch(_static_worker, ["cpu", "cpu"], trainer, n, batch, 1, staged, timeout_s=TIMEOUT)
    seen = out["seen"]
    for key in out["state"][0]:
        assert torch.equal(out["state"][0][key], out["state"][1][key])
    x, y = _data(n)
    replicas = [_model(batchnorm=True) for _ in range(2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1 * 4 / 8) for m in replicas]

    def average() -> None:
        states = [m.state_dict() for m in replicas]
        mean = {k: (states[0][k] + states[1][k]) / 2 if states[0][k].is_floating_point() else states[0][k]
                for k in states[0]}
        for m in replicas:
            m.load_state_dict(mean)

    for step in range(3):
        for rank in range(2):
            indices = torch.tensor(seen[rank][0][step * 4:(step + 1) * 4])
            optimizers[rank].zero_grad()
            nn.functional.cross_entropy(replicas[rank](x[indices]), y[indices]).backward()
            optimizers[rank].step()
        if step == period - 1:
            average()
    average()
    for key, value in replicas[0].state_dict().items():
        assert torch.allclose(out["state"][0][key].float(), value.float(), atol=1e-6), key
    assert out["lr_scale"] == pytest.approx(0.5)
    assert out["rows"][0]["averages/0"] == 2
    assert out["torch_averager"] is not staged
    assert out["joined_staged"] is False  # CPU workers only: nothing to stage


def _static_split_worker(ctx, n: int, epochs: int, sample_s: list[float], sizes: list[int] | None):
    """trainer=static, each worker's steps reporting ``sample_s[rank]`` a sample (fed speeds: the waits DDP's hooks
    take out are milliseconds against seconds); ``sizes``: skip the measurement and train with these batch sizes
    from the start. The model has BatchNorm when measuring (its buffers must not make the fast worker wait outside
    the timed all-reduce)."""
    model = _model(batchnorm=sizes is None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy(trainer_config("static", batch_multiple=8), ctx, model, n, 32 if sizes else 48, seed=5)
    if sizes:
        strategy.sizes, strategy.measured = sizes, True
    x, y = _data(n)
    seen = _loop(strategy, optimizer, x, y, epochs, lr=0.1, sample_s=sample_s[ctx.rank])
    return {"seen": _gather(seen), "state": _gather({k: v.clone() for k, v in model.state_dict().items()}),
            "rows": strategy.stats(), "strategy_state": strategy.state_dict()}


def test_static_split_fixes_batch_sizes_from_the_first_epochs_speeds() -> None:
    n, epochs = 192, 3  # 4 steps of 48 an epoch, at fed speeds 2 : 1
    out = launch(_static_split_worker, ["cpu", "cpu"], n, epochs, [0.5, 1.0], None, timeout_s=TIMEOUT)
    rows = out["rows"]
    assert [(r["b/0"], r["b/1"]) for r in rows] == [(24, 24), (32, 16), (32, 16)]  # measured 2:1, then fixed
    for epoch in range(epochs):  # every sample every epoch, in four steps of 48
        claimed = out["seen"][0][epoch] + out["seen"][1][epoch]
        assert sorted(claimed) == list(range(n))
        assert rows[epoch]["updates/0"] == rows[epoch]["updates/1"] == 4
    assert all(torch.equal(out["state"][0][k], out["state"][1][k]) for k in out["state"][0])
    assert out["strategy_state"]["batch_sizes"] == [32, 16] and out["strategy_state"]["measured"]


def test_static_split_step_equals_single_process_step_on_the_union_batch() -> None:
    """Unequal batches 24 + 8: the all-reduce weights each worker's mean gradient by its batch share."""
    n = 32
    out = launch(_static_split_worker, ["cpu", "cpu"], n, 1, [0.0, 0.0], [24, 8], timeout_s=TIMEOUT)
    seen = out["seen"]
    assert (len(seen[0][0]), len(seen[1][0])) == (24, 8)
    _assert_equals_one_step_on_the_union(out, n)


def _sync_wait_worker(ctx, steps: int, delay: float, batchnorm: bool):
    """sync with slowdown [1, 2] where rank 0 (not slowed) computes ``delay`` s longer per step, begun only once rank 1
    has begun the same step (a store key): rank 1 waits at least ``delay`` for it in the all-reduce, or with BatchNorm
    already in DDP's broadcast of rank 0's buffers before the forward, and that wait must not count as rank 1's
    compute time."""
    model = _model(batchnorm=batchnorm)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy(trainer_config("sync"), ctx, model, 8 * steps, 8, seed=5)
    x, y = _data(8 * steps)
    step_seconds = []
    assert strategy.start_epoch(0) == 1  # steps <= interval_steps (16): one interval
    for step, claim in enumerate(strategy.claims(0)):
        started = time.perf_counter()
        if ctx.rank == 1:
            ctx.store.set(f"sync-wait/step{step}", "begun")
        else:
            ctx.store.wait([f"sync-wait/step{step}"])
            time.sleep(delay)  # slower compute before the backward's all-reduce, while rank 1 waits for it
        loss = nn.functional.cross_entropy(strategy.model(x[claim.indices]), y[claim.indices])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_seconds.append(time.perf_counter() - started)
        strategy.after_step(len(claim.indices), step_seconds[-1])
    strategy.end_interval(sum(step_seconds))
    strategy.end_epoch()
    # The epoch's compute time per worker is its step time plus its simulated-slowdown sleep.
    row = strategy.stats()[0]
    return _gather({"sleep": row[f"compute/{ctx.rank}"] - sum(step_seconds), "steps": step_seconds})


@pytest.mark.parametrize("batchnorm", [False, True], ids=["wait-in-all-reduce", "wait-in-buffer-broadcast"])
def test_sync_slowdown_sleeps_for_own_compute_not_for_waiting(batchnorm: bool) -> None:
    """Rank 1's steps hold a wait of at least ``delay`` each (by the order of the store key, not by timing); the
    slowdown (x2: a sleep as long as the step's own time) sleeps for its own compute only. The bound leaves rank 1
    half a second a step for its own compute of a 6-8-3 network on 8 samples: only a stalled process reaches it."""
    steps, delay = 2, 1.0
    out = launch(_sync_wait_worker, ["cpu", "cpu"], steps, delay, batchnorm, slowdown=[1.0, 2.0], timeout_s=TIMEOUT)
    slow = out[1]
    assert sum(slow["steps"]) >= steps * delay  # rank 1's steps did include waiting for rank 0 ...
    assert 0.0 < slow["sleep"] < sum(slow["steps"]) - 0.5 * steps * delay, slow  # ... but it slept only for its own
    assert out[0]["sleep"] == 0.0


def _offline_context() -> WorkerContext:
    """Rank 0 of two CPU workers, without a process group: enough to build a strategy offline."""
    return WorkerContext(rank=0, world_size=2, device=torch.device("cpu"), store=None, is_primary=True)


def test_lr_scale_is_relative_to_the_equal_split_by_default() -> None:
    model = _model()
    adaptive = build_strategy(trainer_config("adaptive"), _offline_context(), model, 100, 48, 0)
    assert adaptive.lr_scale(24) == 1.0  # equal split 24 / 24
    assert adaptive.lr_scale(32) == pytest.approx(32 / 24)
    assert adaptive.lr_scale(9) == pytest.approx(9 / 24)  # a short batch steps with its real size
    adaptive = build_strategy(trainer_config("adaptive", ref_batch=48), _offline_context(), model, 100, 48, 0)
    assert adaptive.lr_scale(32) == pytest.approx(32 / 48)


def test_adaptive_warns_once_when_its_batch_multiple_is_coarse(caplog) -> None:
    with caplog.at_level("WARNING", logger="rsnet.parallel.strategies.adaptive"):
        build_strategy(trainer_config("adaptive"), _offline_context(), _model(), 100, 32, 0)  # auto: 2 at 16
        build_strategy(trainer_config("adaptive", batch_multiple=8), _offline_context(), _model(), 100, 32, 0)
        build_strategy(trainer_config("adaptive", batch_multiple=4), _offline_context(), _model(), 100, 32, 0)
        secondary = dataclasses.replace(_offline_context(), rank=1, is_primary=False)
        build_strategy(trainer_config("adaptive", batch_multiple=8), secondary, _model(), 100, 32, 0)
    assert [r.getMessage()[:44] for r in caplog.records] == ["adaptive: batch_size=32 over 2 workers is 16"]


def test_one_worker_runs_in_process() -> None:
    trainer = trainer_config("adaptive", merge_rounds=1)
    out = launch(_adaptive_worker, ["cpu"], 128, 2, trainer, 0.0, timeout_s=TIMEOUT)
    assert sorted(out["seen"][0][0]) == list(range(128))
    assert out["lr_scale"] == 1.0
    # one worker: one interval an epoch whatever merge_rounds says (no replica to drift from), and no merge
    assert len(out["rows"]) == 2 and all(r["p/0"] == 1.0 and r["merge_time"] == 0.0 for r in out["rows"])
    assert not dist.is_initialized()


def test_strategy_state_round_trip() -> None:
    model = _model()
    strategy = build_strategy(trainer_config("adaptive"), _offline_context(), model, 100, 48, 0)
    schedule = strategy.schedule
    schedule.sizes[:], schedule.speeds, schedule.merges, schedule.rounds = [32, 16], [2.0, 1.0], 7, 6
    strategy.epoch = 3
    state = strategy.state_dict()
    fresh = build_strategy(trainer_config("adaptive"), _offline_context(), model, 100, 48, 0)
    fresh.load_state_dict(state)
    assert fresh.sizes == [32, 16] and fresh.schedule.speeds == [2.0, 1.0] and fresh.epoch == 3
    assert (fresh.schedule.merges, fresh.schedule.rounds, fresh.speed) == (7, 6, 2.0)
    assert fresh.on_out_of_memory() == 16 and fresh.state_dict()["batch_max"] == 16
    left = build_strategy(trainer_config("adaptive"), _offline_context(), model, 100, 48, 0)
    left.load_state_dict({**state, "active": [True, False], "batch_sizes": [48, 0]})
    assert left.schedule.active == [True, False] and left.schedule.total_batch == 48 and left.lr_scale(48) == 1.0
    with pytest.raises(ValueError, match="trainer.name='nope' is not known; valid: adaptive, local_sgd, static, sync"):
        build_strategy({**trainer_config("adaptive"), "name": "nope"}, _offline_context(), model, 100, 48, 0)


def _launch_crash(how: str, timeout_s: float) -> WorkerError:
    """The error that launching :func:`_crash_worker` on two CPU workers raises."""
    with pytest.raises(WorkerError) as caught:
        launch(_crash_worker, ["cpu", "cpu"], how, timeout_s=timeout_s)
    return caught.value


def test_failed_worker_stops_the_others_and_is_named() -> None:
    """SIGKILL, os._exit and an exception in worker 1: launch returns (no hang) with an error naming it."""
    for how, reason in (("kill", "killed by signal SIGKILL"), ("exit", "exited with code 3"),
                        ("raise", "ValueError: boom in worker one")):
        error = _launch_crash(how, timeout_s=20)
        assert (error.rank, error.device) == (1, "cpu"), error
        assert str(error).startswith(f"worker rank 1 (cpu) failed: {reason}"), error


_ORPHAN_SCRIPT = """
import os, sys, threading
from rsnet.parallel import launch

def wait_forever(ctx, folder):
    open(os.path.join(folder, f"worker{ctx.rank}.pid"), "w").write(str(os.getpid()))
    threading.Event().wait()  # as a worker blocked in a collective: only its heartbeat thread runs

if __name__ == "__main__":
    launch(wait_forever, ["cpu", "cpu"], sys.argv[1], timeout_s=600)
"""


def test_workers_end_when_their_launcher_is_killed(tmp_path) -> None:
    """SIGKILL the launching process (no chance to stop its workers): the workers notice and end themselves."""
    import subprocess
    import sys

    script = tmp_path / "launcher.py"
    script.write_text(_ORPHAN_SCRIPT)
    launcher = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        pid_files = [tmp_path / f"worker{rank}.pid" for rank in range(2)]
        wait_for(lambda: all(path.exists() and path.read_text() for path in pid_files), "the workers' pid files",
                 alive=launcher)
        workers = [int(path.read_text()) for path in pid_files]
    finally:
        launcher.kill()
        launcher.wait()
    for pid in workers:
        wait_for_exit(pid, "a worker of the killed launcher")
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped by init, counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_stopped_worker_is_named_not_the_healthy_one_that_timed_out() -> None:
    """SIGSTOP worker 1 mid-run: its heartbeat stops, so the launcher names it, not worker 0, which times out waiting
    for it (the watchdog's rule on an injected clock: the test below)."""
    error = _launch_crash("stop", timeout_s=6)
    assert (error.rank, error.device) == (1, "cpu"), error
    assert str(error).startswith("worker rank 1 (cpu) failed: stopped responding: no heartbeat for"), error


def test_the_watchdog_names_and_kills_the_first_worker_silent_for_the_timeout() -> None:
    """On a clock the test moves: a worker is named once its last beat is ``timeout_s`` old, not before; one that
    never beat (still starting) is not; only the first silent worker is named (the others waited for it); a worker
    that ended meanwhile is left to the agent."""
    import subprocess

    from rsnet.parallel.elastic import _Watchdog

    now = [100.0]
    victims = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    try:
        watchdog = _Watchdog([99.5, 94.5, 90.0, 0.0], [1, victims[0].pid, victims[1].pid, 1], 6.0,
                             clock=lambda: now[0])
        watchdog.check()  # worker 1 silent 5.5 s, worker 2 10 s: worker 2 named and killed
        assert list(watchdog.stopped) == [2] and "no heartbeat for 10 s" in watchdog.stopped[2]
        assert victims[1].wait(timeout=HANG_S) == -signal.SIGKILL
        now[0] = 101.0  # worker 1 silent 6.5 s now, but one worker named is the run's end
        watchdog.check()
        assert list(watchdog.stopped) == [2] and victims[0].poll() is None
        fresh = _Watchdog([94.5], [victims[1].pid], 6.0, clock=lambda: now[0])  # silent, but already ended
        fresh.check()
        assert fresh.stopped == {}
    finally:
        for victim in victims:
            victim.kill()
            victim.wait()


def test_a_worker_not_joined_a_minute_after_the_launch_is_named_once_with_its_stage(caplog) -> None:
    """On a clock the test moves: before ARRIVE_S nothing is said; then each worker not yet joined is named once,
    with where its start-up stands; a joined one is not; the run is not stopped for it (only timeout_s does that)."""
    from rsnet.parallel.elastic import ARRIVE_S, _Watchdog
    from rsnet.parallel.worker_setup import JOINED

    now = [1000.0]
    stages = [JOINED, 0, 2, JOINED]
    watchdog = _Watchdog([0.0] * 4, [0] * 4, 600.0, clock=lambda: now[0], stages=stages,
                         devices=["cpu", "cpu", "cuda:0", "cpu"])
    now[0] += ARRIVE_S - 1
    with caplog.at_level(logging.WARNING, logger="rsnet.parallel.elastic"):
        watchdog.check()
        assert caplog.messages == []
        now[0] += 1
        watchdog.check()
        watchdog.check()  # said once
    assert caplog.messages == [
        "worker rank 1 (cpu) has not joined the others 60 s after the launch: its process has not started yet (the "
        "fork server may still be importing); the run waits on (trainer.timeout_s=600 ends it)",
        "worker rank 2 (cuda:0) has not joined the others 60 s after the launch: it is connecting to the store at "
        "MASTER_ADDR:MASTER_PORT; the run waits on (trainer.timeout_s=600 ends it)"]
    assert watchdog.stopped == {}


def _say_on_stderr(ctx, text: str) -> int:
    os.write(2, f"{text} from worker {ctx.rank}\n".encode())
    return ctx.rank


def test_workers_write_where_the_launcher_writes_now(tmp_path) -> None:
    """The fork server keeps the stderr of the launch that started it; a later launch whose stderr was redirected
    since still gets its workers' lines (they follow the launcher's fd 2 of now)."""
    launch(_say_on_stderr, ["cpu", "cpu"], "first", timeout_s=TIMEOUT)  # the fork server starts here (or earlier)
    target, saved = tmp_path / "stderr.txt", os.dup(2)
    with open(target, "wb") as handle:
        os.dup2(handle.fileno(), 2)
        try:
            launch(_say_on_stderr, ["cpu", "cpu"], "second", timeout_s=TIMEOUT)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    said = target.read_text()
    assert "second from worker 0" in said and "second from worker 1" in said, said


def test_launch_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"launch needs at least one device"):
        launch(_crash_worker, [], "raise")
    with pytest.raises(ValueError, match=r"trainer.slowdown=\[0.5, 1.0\]: every factor must be a number >= 1.0"):
        launch(_crash_worker, ["cpu", "cpu"], "raise", slowdown=[0.5, 1.0])
    with pytest.raises(ValueError, match=r"has 1 factor\(s\) for 2 worker\(s\)"):
        launch(_crash_worker, ["cpu", "cpu"], "raise", slowdown=[2.0])


def test_launch_options_and_summary_text() -> None:
    options = launch_options(trainer_config("adaptive", timeout_s=30, slowdown=[1, 2]))
    assert options == {"timeout_s": 30.0, "slowdown": [1.0, 2.0], "backend": None, "cpu_threads": None}
    rows = [{"epoch": 0, "interval": 1, "merge_time": 0.01, "n/0": 64, "n/1": 32, "updates/0": 2, "updates/1": 2,
             "b/0": 32, "b/1": 16, "b_next/0": 32, "b_next/1": 16, "s/0": 200.0, "s/1": 100.0,
             "idle/0": 0.1, "idle/1": 0.0, "merge_time/0": 0.01, "merge_time/1": 0.01}]
    text = summarize(rows, 2, "adaptive", "simulated heterogeneity: slowdown per worker x1, x2")
    assert "simulated" in text and "0.67" in text and "0.33" in text


def test_a_cpu_worker_leaves_each_gpu_worker_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU workers share the cores a GPU worker's launching and prefetch threads leave (16 cores: a CPU worker
    beside one GPU takes 14 threads, two CPU workers beside two GPUs 6 each), at least one thread each."""
    from rsnet.parallel import launcher

    monkeypatch.setattr(launcher, "_available_cores", lambda: 16)
    assert launcher._cpu_threads_for(["cpu"]) == 16
    assert launcher._cpu_threads_for(["cpu", "cpu"]) == 8
    assert launcher._cpu_threads_for(["cuda:0", "cpu"]) == 14
    assert launcher._cpu_threads_for(["cuda:0", "cuda:1", "cpu", "cpu"]) == 6
    monkeypatch.setattr(launcher, "_available_cores", lambda: 2)
    assert launcher._cpu_threads_for(["cuda:0", "cpu"]) == 1


def _speed_after_new_sizes(ctx: WorkerContext) -> tuple[list[bool], float]:
    strategy = build_strategy(trainer_config("adaptive"), ctx, nn.Linear(2, 2), 64, 16, 0)
    timed = []
    for batch, seconds in [(16, 5.0), (16, 0.1), (8, 3.0), (8, 0.05), (16, 0.1)]:  # 5 s, 3 s: a shape's tuning
        timed.append(strategy.times_step(batch))
        strategy.after_step(batch, seconds)
    strategy.end_interval(8.25)
    return timed, strategy.speed


def test_the_first_step_at_each_batch_size_is_left_out_of_the_speed() -> None:
    """A GPU tunes every new shape (cuDNN's autotuning: seconds for ResNet-50), and the adaptive scheduler resizes
    its batch at merges: the first step at each size is timed on its own and left out of the worker's speed."""
    timed, speed = launch(_speed_after_new_sizes, ["cpu"], timeout_s=60)
    assert timed == [True, False, True, False, False]  # each size's first step is timed on its own
    assert speed == pytest.approx((16 + 8 + 16) / (0.1 + 0.05 + 0.1))  # 160 samples/s, not 56 / 8.25 = 6.8


_AFTER_THREADS_SCRIPT = """
import timm, torch
from rsnet.parallel import launch
from rsnet.parallel.elastic import start_method

def train_a_step(ctx):
    torch.set_num_threads(2)  # a backward and convolutions on several threads, in every worker
    timm.create_model("test_resnet")(torch.randn(4, 3, 32, 32)).sum().backward()
    return "trained"

if __name__ == "__main__":
    torch.set_num_threads(2)  # the launcher's OpenMP pool and autograd have run, as after a training or a map in
    timm.create_model("test_resnet")(torch.randn(8, 3, 64, 64)).sum().backward()  # the same session
    print(start_method(train_a_step), launch(train_a_step, ["cpu", "cpu"], timeout_s=120))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is tested on Linux")
def test_workers_start_from_a_fork_server_whatever_threads_the_launcher_runs(tmp_path) -> None:
    """Workers forked from a launcher that had run a multi-threaded forward hung in their first convolution (its
    OpenMP pool does not survive a fork; with "fork" this test hangs there), after a compiled backward they could not
    run autograd, and a fork while another thread holds a lock (the agent's store, the watchdog) can hang in that
    lock. Started from the fork server (a fresh single-threaded interpreter that never runs the launcher's threads),
    the workers train whatever the launcher has run."""
    import subprocess

    script = tmp_path / "launcher.py"  # a file: the workers import its function by name
    script.write_text(_AFTER_THREADS_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["forkserver", "trained"]


def _start_worker(ctx) -> dict:
    """Rank 1's count of the strategies it built is ahead of rank 0's (as after a strategy built before the process
    group), and every worker draws its own initial weights; returns the prefix and the weights once the run's first
    interval is planned."""
    if ctx.rank == 1:
        strategy_base._instances += 1
    model = _model(seed=ctx.rank)
    strategy = build_strategy(trainer_config("adaptive"), ctx, model, 64, 16, 0)
    strategy.probe_speed(_probe_step(model, 0.0))
    next(iter(strategy.intervals(0)))
    return {"prefix": _gather(strategy.prefix), "state": _gather(_host_state(model))}


def test_the_replicas_start_from_rank_0s_weights_and_share_its_store_prefix() -> None:
    out = launch(_start_worker, ["cpu", "cpu"], timeout_s=TIMEOUT)
    assert out["prefix"][0] == out["prefix"][1]
    initial = _model(seed=0).state_dict()
    for rank in range(2):
        assert all(torch.equal(out["state"][rank][k], v) for k, v in initial.items())


def _claiming_strategy():
    strategy = build_strategy(trainer_config("adaptive"), _offline_context(), _model(), 100, 48, 0)
    return strategy, strategy._interval


def test_a_prefetch_thread_waiting_to_claim_returns_when_the_loop_stops() -> None:
    """An error in the training loop stops the interval: the prefetch thread waiting for the current step (to claim
    the next batch) returns at once instead of holding the error back."""
    strategy, interval = _claiming_strategy()
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(strategy._wait_for_steps(interval, 1)))
    waiter.start()
    strategy.stop_claiming()
    waiter.join(timeout=60)
    assert waited == [False] and interval.stopped


def test_a_step_longer_than_the_log_limit_is_logged_and_still_waited_for(monkeypatch, caplog) -> None:
    strategy, interval = _claiming_strategy()
    monkeypatch.setattr(adaptive_module, "SLOW_STEP_LOG_S", 0.01)
    logged = threading.Event()
    tap = logging.Handler()
    tap.emit = lambda record: logged.set()
    waited: list[bool] = []
    logger = logging.getLogger(adaptive_module.__name__)
    logger.addHandler(tap)
    try:
        with caplog.at_level("WARNING", logger=adaptive_module.__name__):
            waiter = threading.Thread(target=lambda: waited.append(strategy._wait_for_steps(interval, 1)))
            waiter.start()
            assert logged.wait(HANG_S)  # the wait outlasts the limit: one line ...
            assert waited == []  # ... and the claim still waits
            strategy.after_step(16, None)
            waiter.join(timeout=HANG_S)
    finally:
        logger.removeHandler(tap)
    assert waited == [True]
    assert [r.getMessage() for r in caplog.records] == [
        "worker 0 (cpu): a step has run for more than 0 s; its next claim waits for it"]


def test_a_merge_where_no_member_trained_records_the_uniform_shares_it_applied() -> None:
    """merge_weight=samples and an interval in which neither worker trained (a slow worker under load can take
    none): the merge averages uniformly, and the row says so instead of p = 0 for both (or a division by zero)."""
    strategy = build_strategy(trainer_config("adaptive", merge_weight="samples"), _offline_context(), _model(),
                              100, 48, 0)
    table = {field: [0.0, 0.0] for field in adaptive_module.META_FIELDS}
    result = MergeResult(meta=torch.zeros(0), total_weight=0.0, idle_s=0.0, merge_s=0.01)
    strategy._record(table, result, 1, [0, 1])
    strategy._record({**table, "w": [30.0, 10.0]}, result, 1, [0, 1])
    strategy._record({**table, "w": [0.0, 10.0]}, result, 1, [0])  # worker 1 pending: not a member
    assert [(row["p/0"], row["p/1"]) for row in strategy.stats()] == [(0.5, 0.5), (0.75, 0.25), (1.0, 0.0)]
