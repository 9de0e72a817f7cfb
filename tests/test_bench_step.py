"""benchmarks/bench_step.py runs every path it compares and prints the ratios, and bench_compile.py measures a mode
with bench_step's training step (tiny settings on the CPU; the figures themselves are the benchmark's business, not
the test's). Each script's main runs in this process, its command line given (a Python of its own would only add
its start-up)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from types import ModuleType

import pytest
from helpers import REPO


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], script: str,
             *arguments: str) -> str:
    """benchmarks/<script>.py's main with this command line, in this process; what it printed."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    module: ModuleType = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *arguments])
    capsys.readouterr()
    module.main()
    return capsys.readouterr().out


def test_bench_step_measures_every_path_and_prints_the_ratios(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    stdout = run_main(monkeypatch, capsys, "bench_step", "--device", "cpu", "--sizes", "48", "--batches", "8",
                      "--steps", "2", "--input-steps", "2", "--warmup", "1", "--rounds", "2", "--backbone",
                      "test_resnet")
    assert "48 px, batch 8: (b)/(c) = " in stdout and "(a')/(b) = " in stdout
    rows = [line for line in stdout.splitlines() if line.startswith("| (")]
    assert [row.split(" |")[0] for row in rows] == ["| (a) host: uint8 batch", "| (a0) host: OpenCV augment",
                                                    "| (a') input pipeline on the device", "| (b) rsnet step",
                                                    "| (c) plain loop, synthetic batch"]
    assert all(float(row.split("|")[2].replace(",", "")) > 0 for row in rows)


def test_bench_compile_measures_a_mode_with_bench_steps_training_step(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """One mode's measurement (what every fresh interpreter of bench_compile runs), eager so no compile is paid:
    both shapes' first steps and the steady images/s come back as JSON."""
    stdout = run_main(monkeypatch, capsys, "bench_compile", "--worker", "eager", "--device", "cpu", "--backbone",
                      "test_resnet", "--size", "32", "--batch", "4", "--steps", "2", "--warmup", "1", "--amp", "none")
    measured = json.loads(stdout.strip().splitlines()[-1])
    assert set(measured) == {"first", "second", "images_s"}
    assert all(value > 0 for value in measured.values())


def test_unset_options_take_the_devices_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from bench_step import DEFAULTS, fill_defaults

    args = argparse.Namespace(device="cuda:1", sizes=None, batches=[64], steps=None, input_steps=None, warmup=None)
    fill_defaults(args, DEFAULTS)
    assert (args.sizes, args.batches, args.steps, args.input_steps) == ([128, 224], [64], 300, None)
    args = argparse.Namespace(device="cpu", sizes=None, batches=None, steps=None, input_steps=None, warmup=5)
    fill_defaults(args, DEFAULTS)
    assert (args.batches, args.steps, args.input_steps, args.warmup) == ([32, 128], 8, 30, 5)
