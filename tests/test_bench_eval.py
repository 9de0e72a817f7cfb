"""benchmarks/bench_eval.py runs rsnet's evaluation and the plain loop in interleaved rounds and prints their ratios,
with the training step when asked (tiny settings on the CPU; the figures are the benchmark's business)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import REPO


def test_bench_eval_times_both_loops_in_rounds_and_the_training_step() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_eval.py"), "--device", "cpu",
                           "--backbone", "test_resnet", "--size", "32", "--images", "20", "--rounds", "2",
                           "--train-step", "--step-batch", "4", "--steps", "1", "--warmup", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "20 cached images, eval batch 64, amp none (CPU), 2 rounds; rsnet makes its inputs on the host" \
        in done.stdout
    rounds = re.findall(r"^\| (\d) \| ([\d,]+) \| ([\d,]+) \| ([\d.]+) \|$", done.stdout, flags=re.M)
    assert [number for number, *_ in rounds] == ["1", "2"]
    for _, plain, rsnet, ratio in rounds:
        plain, rsnet = (float(value.replace(",", "")) for value in (plain, rsnet))
        assert plain > 0 and rsnet > 0  # printed as whole numbers: the ratio within their rounding
        assert float(ratio) == pytest.approx(rsnet / plain, rel=1 / plain + 1 / rsnet + 1e-3)
    assert re.search(r"^\| median \(range\) \| [\d,]+ \([\d,]+–[\d,]+\) \| ", done.stdout, flags=re.M)
    assert re.search(r"^training step: [\d,]+ \([\d,]+–[\d,]+\) img/s; rsnet evaluation / step = [\d.]+$",
                     done.stdout, flags=re.M)


def test_bench_eval_without_a_gpu_measures_nothing_when_it_requires_one() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_eval.py"), "--require-cuda",
                           "--device", "cpu"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0 and "nothing measured" in done.stdout
