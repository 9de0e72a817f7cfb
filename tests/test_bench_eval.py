"""benchmarks/bench_eval.py runs rsnet's evaluation and the plain loop in interleaved rounds and prints their ratios,
with the training step when asked (tiny settings on the CPU; the figures are the benchmark's business). Its main
runs in this process, its command line given (a Python of its own would only add its start-up)."""

from __future__ import annotations

import re

import pytest
import torch
from test_bench_step import run_main


def test_bench_eval_times_both_loops_in_rounds_and_the_training_step(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    stdout = run_main(monkeypatch, capsys, "bench_eval", "--device", "cpu", "--backbone", "test_resnet", "--size",
                      "32", "--images", "20", "--rounds", "2", "--train-step", "--step-batch", "4", "--steps", "1",
                      "--warmup", "1")
    assert "20 cached images, eval batch 64, amp none (CPU), 2 rounds; rsnet makes its inputs on the host" in stdout
    rounds = re.findall(r"^\| (\d) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \|$", stdout, flags=re.M)
    assert [number for number, *_ in rounds] == ["1", "2"]
    for _, plain, rsnet, ratio in rounds:
        plain, rsnet = (float(value.replace(",", "")) for value in (plain, rsnet))
        assert plain > 0 and rsnet > 0
        # printed as whole numbers and to 3 decimals: the ratio within their rounding, whatever the figures are
        assert abs(float(ratio) - rsnet / plain) <= rsnet / plain * (1 / plain + 1 / rsnet) + 5e-4
    assert re.search(r"^\| median \(range\) \| [\d,]+ \([\d,]+–[\d,]+\) \| ", stdout, flags=re.M)
    assert re.search(r"^training step: [\d,]+ \([\d,]+–[\d,]+\) img/s; rsnet evaluation / step = [\d.]+$",
                     stdout, flags=re.M)


def test_bench_eval_without_a_gpu_measures_nothing_when_it_requires_one(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU, wherever it runs
    assert "nothing measured" in run_main(monkeypatch, capsys, "bench_eval", "--require-cuda", "--device", "cpu")
