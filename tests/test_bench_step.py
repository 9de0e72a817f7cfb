"""benchmarks/bench_step.py runs every path it compares and prints the ratios (tiny settings on the CPU; the
figures themselves are the benchmark's business, not the test's)."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_bench_step_measures_every_path_and_prints_the_ratios() -> None:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_step.py"), "--device", "cpu", "--sizes",
                           "48", "--batches", "8", "--steps", "2", "--warmup", "1", "--rounds", "2", "--backbone",
                           "test_resnet"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "48 px, batch 8: (b)/(c) = " in done.stdout and "(a')/(b) = " in done.stdout
    rows = [line for line in done.stdout.splitlines() if line.startswith("| (")]
    assert [row.split(" |")[0] for row in rows] == ["| (a) host: uint8 batch", "| (a0) host: albumentations",
                                                    "| (a') input pipeline on the device", "| (b) rsnet step",
                                                    "| (c) plain loop, synthetic batch"]
    assert all(float(row.split("|")[2].replace(",", "")) > 0 for row in rows)
