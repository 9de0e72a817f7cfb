"""The scripts a lent GPU runs work before a GPU is lent: gpu_check.py under ``--cpu-stand-in`` (every cuda:i
replaced by the CPU) trains through scripts/train.py and prints its table, and gpu_lease.py runs its steps' tiny
CPU versions within its budget. A broken script found on the GPU would cost the few minutes a GPU is lent for."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
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


def test_the_lease_runs_every_step_and_keeps_each_output(tmp_path: Path) -> None:
    """gpu_lease.py under --stand-in: every step runs (tiny, on the CPU) within the budget, each one's output lands
    in its own file under --out, gpu_throughput's row holds a steady images/s, and the machine facts are written."""
    root = make_fake_archive(tmp_path, "aid", per_class=6, size=40)
    out = tmp_path / "out"
    done = bench("gpu_lease.py", "--stand-in", "--root", str(root), "--out", str(out), "--wheels",
                 str(tmp_path / "no-wheels"), "--budget", "400")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert sorted(path.name for path in out.iterdir()) == ["bench_compile.md", "bench_step_resnet18.md",
                                                           "bench_step_resnet50.md", "gpu_throughput.md",
                                                           "machine.md"]
    assert "torch " in (out / "machine.md").read_text()
    for name in ("bench_step_resnet18", "bench_step_resnet50"):
        assert "(b)/(c) = " in (out / f"{name}.md").read_text()
        assert f"== {name}: exit 0" in done.stdout
    assert "| eager |" in (out / "bench_compile.md").read_text()
    [row] = table_rows((out / "gpu_throughput.md").read_text())
    assert row[:2] == ["cpu", "32"] and float(row[2].replace(",", "")) > 0, row


def test_the_lease_skips_a_step_the_budget_has_no_room_for(tmp_path: Path) -> None:
    """A budget too small for a step skips it instead of overrunning the device call."""
    done = bench("gpu_lease.py", "--stand-in", "--out", str(tmp_path), "--wheels", str(tmp_path / "none"),
                 "--budget", "10", "--steps", "bench_step_resnet18")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "== bench_step_resnet18: skipped, " in done.stdout
    assert not (tmp_path / "bench_step_resnet18.md").exists()


def test_a_step_past_its_limit_is_killed_with_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that outlives its limit is killed with its whole process group (a benchmark's own subprocesses too),
    so nothing of it competes with the next step for the GPU."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu_lease

    child_pid = tmp_path / "child.pid"
    (tmp_path / "sleeper.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n")
    monkeypatch.setattr(gpu_lease, "BENCH", tmp_path)
    started = time.monotonic()
    status = gpu_lease.run_step("sleeper", ["sleeper.py"], 3, tmp_path, dict(os.environ))
    assert status is None and time.monotonic() - started < 30
    assert (tmp_path / "sleeper.md").read_text() == "started\n"
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie not yet reaped by its parent counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the steps would measure for minutes")
def test_the_gpu_arguments_of_every_step_parse(tmp_path: Path) -> None:
    """Without a GPU every step's GPU command line runs up to its "no CUDA device" line: the arguments the lent GPU
    will get are accepted by each benchmark (a typo there would surface only on the GPU)."""
    done = bench("gpu_lease.py", "--out", str(tmp_path), "--wheels", str(tmp_path / "none"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for name in ("bench_step_resnet18", "bench_step_resnet50", "gpu_throughput", "bench_compile"):
        assert f"== {name}: exit 0" in done.stdout
        assert "no CUDA device visible" in (tmp_path / f"{name}.md").read_text()
