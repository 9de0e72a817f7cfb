"""The time-to-accuracy study's arithmetic (benchmarks/bench_scheduler.py --report-only) and the simulator's
validation against it (sim_scheduler.py --validate --study), on hand-made run records."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import pytest
from helpers import REPO
from PIL import Image


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(bench, scenario: str, strategy: str, seed: int, curve: list[tuple[float, float, float]],
            updates: list[int] | None = None) -> dict:
    key = bench.run_key(scenario, strategy, seed, argparse.Namespace(epochs=3, image_size=64, batch=32))
    return {"key": key, "scenario": bench.run_scenario(scenario, strategy), "strategy": strategy, "seed": seed,
            "curve": curve, "train_samples": 720, "epochs": 3, "updates": updates or [30, 20],
            "worker_samples": [1440, 720], "active": [True, True]}


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    bench = _load("bench_scheduler")
    sync = [(10.0, 20.0, 21.0), (20.0, 40.0, 41.0), (30.0, 50.0, 52.0)]  # target: 95 % of 50 = 47.5, at 30 s
    single = [(15.0, 30.0, 30.0), (30.0, 46.0, 46.0), (45.0, 50.0, 51.5)]  # the fastest worker alone: 47.5 at 45 s
    records = [_record(bench, "1:2", "sync", 0, sync), _record(bench, "1:2", "sync", 1, sync),
               _record(bench, "1:2", "single", 0, single, [90, 0]), _record(bench, "1:2", "single", 1, single, [90, 0]),
               _record(bench, "1:2", "adaptive", 0, [(6.0, 25.0, 24.0), (12.0, 48.0, 47.0), (18.0, 51.0, 51.5)]),
               _record(bench, "1:2", "adaptive", 1, [(8.0, 30.0, 30.0), (16.0, 45.0, 44.0), (24.0, 47.9, 49.0)]),
               _record(bench, "1:1", "sync", 0, sync), _record(bench, "1:1", "adaptive", 0, sync, [25, 25])]
    results = tmp_path / "study.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    return bench, results


def test_report_gives_time_to_target_ratios_and_verdicts(study, tmp_path, monkeypatch, capsys):
    bench, results = study
    png = tmp_path / "curves.png"
    monkeypatch.setattr(sys, "argv", ["bench_scheduler.py", "--report-only", "--results", str(results), "--epochs", "3",
                                      "--seeds", "2", "--scenarios", "1:2", "1:1", "--strategies", "sync", "single",
                                      "adaptive", "--plot", str(png)])
    bench.main()
    out = capsys.readouterr().out
    assert "### 1:2 (slowdowns 1, 2; physical limit Σs/s_max = 1.50; 2 paired seeds, 3 epochs)" in out
    # adaptive reaches 47.5 at 12 s and 24 s: single's 45 s over them is 3.75x and 1.875x, shares of the limit 1.5
    # 2.5 and 1.25; sync's 30 s: 2.5x and 1.25x; final test -0.5 and -3.0 points; 120 and 90 samples/s against
    # single's 48; balance 20 / 30; nobody left out.
    assert ("| adaptive | 18.00 ± 8.49 | 2.81 ± 1.33 | 1.88 ± 0.88 | 1.88 ± 0.88 | 50.25 ± 1.77 | -1.75 ± 1.77 | "
            "105.00 ± 21.21 | 2.19 ± 0.44 | 0.67 ± 0.00 | 0.00 ± 0.00 |") in out
    assert "| single | 45.00 ± 0.00 | 1.00 ± 0.00 | 0.67 ± 0.00 | 0.67 ± 0.00 |" in out
    verdicts = [line for line in out.splitlines() if line.startswith(("1:2: ", "1:1: "))]
    assert verdicts[0].startswith("1:2: adaptive 2.81x single to the target (target >= 1.2")
    assert verdicts[0].endswith("update balance 0.67 (target >= 0.9): NOT MET (accuracy, balance)")
    assert verdicts[1].startswith("1:1: adaptive 1.50x single to the target (target >= 1.00x)")
    assert verdicts[1].endswith(": MET")  # sync's curve, balanced, 1.5x the single worker on identical workers
    assert "1 paired seed, 3 epochs)" in out  # 1:1 has seed 0 only
    assert Image.open(png).size == (600, 460)  # one panel


def test_update_balance_counts_only_the_workers_active_at_the_end(study):
    bench, _ = study
    left_out = {"updates": [300, 7], "active": [True, False]}  # trained 7 updates before it was left out
    assert bench.update_balance(left_out) == 1.0
    assert bench.update_balance({"updates": [300, 270, 7], "active": [True, True, False]}) == 0.9
    assert bench.update_balance({"updates": [30, 20]}) == pytest.approx(2 / 3)  # no "active": everyone counts


def test_simulator_validates_against_the_study(study, monkeypatch, capsys):
    bench, results = study
    static = _record(bench, "1:1:2", "static", 0, [(10.0, 20.0, 21.0), (20.0, 40.0, 41.0), (36.0, 50.0, 52.0)])
    local_sgd = _record(bench, "1:1:2", "local_sgd", 0, [(1.0, 20.0, 21.0), (2.0, 40.0, 41.0), (3.0, 50.0, 52.0)])
    with results.open("a") as out:
        out.write(json.dumps(static) + "\n" + json.dumps(local_sgd) + "\n")
    sim_cli = _load("sim_scheduler")
    monkeypatch.setattr(sys, "argv", ["sim_scheduler.py", "--validate", str(results)])
    sim_cli.main()
    out = capsys.readouterr().out
    assert f"### Validation: the time-to-accuracy study ({results})" in out
    # measured samples/s: 720 x 3 / 30 s = 72 for sync at 1:2; adaptive's mean of 120 and 90; static 720 x 3 / 36
    assert "| 1:2 | sync | 72.0 |" in out and "| 1:2 | adaptive | 105.0 |" in out
    assert "| 1:1:2 | local_sgd | 720.0 |" in out  # simulated too (sim.simulate_local_sgd): 720 x 3 / 3 s
    assert "| 1:1:2 | static | 60.0 |" in out and "| n/a (no sync run) |" in out  # nothing to divide by
    study_part = out[out.index("the time-to-accuracy study"):]
    assert "of 6 runs as logged" in study_part and "of 6 runs calibrated" in study_part  # local_sgd included
    assert "measured 1440 / 720; updates simulated" in out


def test_independent_runs_every_worker_alone_for_epochs_in_proportion_to_its_speed(study, monkeypatch, tmp_path):
    bench, _ = study
    args = argparse.Namespace(epochs=12, image_size=64, batch=32, root=tmp_path, timeout=60)
    launched = []

    def fake_metrics(overrides, run_dir, what, args):
        settings = dict(o.split("=", 1) for o in overrides if "=" in o)
        epochs, factor = int(settings["epochs"]), float(settings["trainer.slowdown"].strip("[]"))
        assert settings["trainer.devices"] == "[cpu]"  # one device per run
        launched.append((epochs, factor))
        wall = 10.0 * epochs * factor  # 720 samples an epoch at 72 / factor samples/s
        return {"history": [{"wall_time_s": wall * (e + 1) / epochs, "val_accuracy": 40.0, "test_accuracy": 41.0}
                            for e in range(epochs)],
                "train_samples": 720, "epochs": epochs, "scheduler": {"workers": [{"updates": 23 * epochs}]}}

    monkeypatch.setattr(bench, "launch", lambda overrides: overrides)
    monkeypatch.setattr(bench, "finish", fake_metrics)
    record = bench.train("1:4", "independent", 0, args)
    assert launched == [(12, 1.0), (3, 4.0)]  # 12 epochs at full speed, 3 at a quarter: they end together
    assert record["samples_per_s"] == pytest.approx(72 + 18)
    assert record["worker_samples"] == [720 * 12, 720 * 3] and len(record["curve"]) == 12  # the fastest's curve
    assert bench.samples_per_s(record) == pytest.approx(90)
    assert record["key"] == "1:4|independent|seed0|12ep|64px|b32"


def test_verdict_reports_the_share_of_the_machines_ceiling(study, monkeypatch, capsys):
    bench, results = study
    curve = [(15.0, 30.0, 30.0), (30.0, 46.0, 46.0), (45.0, 50.0, 51.5)]
    with results.open("a") as out:
        for seed in (0, 1):  # 84 samples/s measured with both workers running apart: 1.75x single's 48
            record = {**_record(bench, "1:2", "independent", seed, curve), "samples_per_s": 84.0}
            out.write(json.dumps(record) + "\n")
    monkeypatch.setattr(sys, "argv", ["bench_scheduler.py", "--report-only", "--results", str(results), "--epochs", "3",
                                      "--seeds", "2", "--scenarios", "1:2", "--strategies", "sync", "single",
                                      "independent", "adaptive"])
    bench.main()
    out = capsys.readouterr().out
    assert "| independent | 45.00 ± 0.00 |" in out and "| 84.00 ± 0.00 | 1.75 ± 0.00 |" in out
    # adaptive's 120 and 90 samples/s: a mean of 105 over independent's 84
    verdict = next(line for line in out.splitlines() if line.startswith("1:2: "))
    assert verdict.endswith("; samples/s 1.25 of the machine's ceiling (independent runs: 1.75x single)")
