"""The scripts ``make gpu-check`` runs on a lent GPU work before a GPU is lent: gpu_check.py and gpu_throughput.py
under ``--cpu-stand-in`` (every cuda:i replaced by the CPU) train through scripts/train.py and print their tables.
A broken script found on the GPU would cost the few minutes a GPU is lent for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import REPO, make_fake_archive


def bench(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *arguments], capture_output=True,
                          text=True, timeout=600, cwd=REPO)


def table_rows(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| config") and not line.startswith("| devices")]


def test_gpu_check_passes_a_gpu_and_cpu_pair_under_the_stand_in() -> None:
    done = bench("gpu_check.py", "--cpu-stand-in", "--backbone", "test_resnet", "--image-size", "32", "--models",
                 "baseline", "--trainers", "adaptive", "--configs", "gpu+cpu")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "CPU STAND-IN" in done.stdout and "1 passed, 0 failed" in done.stdout
    [row] = table_rows(done.stdout)
    assert row[:6] == ["gpu+cpu", "cpu, cpu", "gloo", "adaptive", "baseline", "PASS"]
    assert float(row[6]) > 0 and 0 <= float(row[7]) <= 100


def test_gpu_throughput_measures_epochs_after_the_first(tmp_path: Path) -> None:
    root = make_fake_archive(tmp_path, "aid", per_class=6, size=40)
    done = bench("gpu_throughput.py", "--cpu-stand-in", "--root", str(root), "--sizes", "32", "--epochs", "2",
                 "--configs", "gpu+cpu", "--backbone", "test_resnet", "--batch-size", "16")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [row] = table_rows(done.stdout)
    assert row[:2] == ["cpu, cpu", "32"] and "FAIL" not in row[2], row
    steady, first_epoch, accuracy = (float(cell.replace(",", "")) for cell in row[2:5])
    assert steady > 0 and first_epoch >= 0 and 0 <= accuracy <= 100
