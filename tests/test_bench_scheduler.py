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
    assert Image.open(png).size == (900, 580)


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
    assert "| 1:1:2 | local_sgd |" not in out  # the simulator has no model of local SGD
    assert "| 1:1:2 | static | 60.0 |" in out and "| n/a (no sync run) |" in out  # nothing to divide by
    study_part = out[out.index("the time-to-accuracy study"):]
    assert "of 5 runs as logged" in study_part and "of 5 runs calibrated" in study_part
    assert "measured 1440 / 720; updates simulated" in out
