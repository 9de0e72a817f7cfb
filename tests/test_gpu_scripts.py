"""The scripts a GPU machine runs work before one is at hand: gpu_check.py under ``--cpu-stand-in`` (every cuda:i
replaced by the CPU) trains through scripts/train.py and prints its table, and gpu_lease.py runs its steps' tiny
CPU versions within its budget. A broken script found on the GPU would cost the few minutes a GPU is at hand for."""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import json
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
    assert float(row[6]) > 0 and row[7].replace(".", "", 1).isdigit()  # images/s, and the test accuracy's number


def test_the_lease_runs_its_steps_and_keeps_each_output(tmp_path: Path) -> None:
    """gpu_lease.py under --stand-in: its two steps that read the real-size set run (tiny, on the CPU) within the
    budget, each one's output lands in its own file under --out, the real-size epoch of two workers lists the
    scheduler's decisions, the profile holds its tables and trace, and the machine facts are written.
    (The other steps' stand-ins are bench_step.py's and bench_compile.py's own tests and the real-size epoch's
    script; every step's GPU command line is checked below.)"""
    root = make_fake_archive(tmp_path, "aid", per_class=3, size=40)
    out = tmp_path / "out"
    done = bench("gpu_lease.py", "--stand-in", "--root", str(root), "--out", str(out), "--wheels",
                 str(tmp_path / "no-wheels"), "--budget", "500", "--real-min-train", "60", "--steps",
                 "real_size_epoch", "gpu_profile")
    outcomes = [line for line in done.stdout.splitlines() if line.startswith("== ")]
    failed = [path.read_text()[-3000:] for path in out.glob("*.md")
              if any(line.startswith(f"== {path.stem}: ") and "exit 0" not in line for line in outcomes)]
    assert done.returncode == 0, "\n".join([*outcomes, *failed, done.stderr[-2000:]])
    assert sorted(path.name for path in out.iterdir()) == [
        "gpu_profile.md", "machine.md", "profile_trace.json.gz", "real_size_epoch.md"]
    assert "torch " in (out / "machine.md").read_text()
    assert "real-size set: 180 images (90 for training)" in done.stdout  # 90 images linked twice
    real_size_root = Path(done.stdout.split("real-size set: ")[1].split(" into ")[1].splitlines()[0])
    assert real_size_root.parent.name.startswith("rsnet-real-size-")  # this run's own folder, not a fixed one...
    assert not real_size_root.parent.exists()  # ...and removed when the lease ends
    real_size = (out / "real_size_epoch.md").read_text()
    alone, pair = table_rows(real_size)  # the GPU alone, then beside the CPU (here: a CPU worker, then two)
    assert alone[:2] == ["cpu", "32"] and pair[:2] == ["cpu, cpu", "32"], real_size
    # training images/s and whole epochs (evaluation included, so slower)
    assert 0 < float(pair[3].replace(",", "")) < float(pair[2].replace(",", "")), real_size
    assert "scheduler decisions:" in real_size
    assert "32 px, 1gpu: whole epochs / training = " in real_size and "32 px: GPU + CPU / GPU alone, whole runs = " \
        in real_size
    profile = (out / "gpu_profile.md").read_text()
    assert profile.count("| rsnet.data_wait |") == 2 and profile.count("Top 5 ops by CPU time") == 2, profile
    assert "## Steady steps" in profile and "## Epoch 2 of a real run" in profile
    epochs = [row for row in table_rows(profile) if row[0] in ("1", "2")]  # seconds of train, evaluate, epoch end
    assert [row[0] for row in epochs] == ["1", "2"] and all(float(cell) > 0 for row in epochs for cell in row[1:3])
    assert all(row[3].replace(".", "", 1).isdigit() for row in epochs)  # the epoch end's seconds (a snapshot)
    assert json.loads(gzip.decompress((out / "profile_trace.json.gz").read_bytes()))["traceEvents"]


def test_the_recipe_check_at_224_px_runs_alone_and_prints_its_table(tmp_path: Path) -> None:
    """The lease's recipe_224 step (bench_recipe.py, the plain loop and rsnet's scripts/train.py) under --stand-in:
    not in the default steps, run when named, a line per run and the table with both rows."""
    root = make_fake_archive(tmp_path, "aid", per_class=4, size=40)
    out = tmp_path / "out"
    done = bench("gpu_lease.py", "--stand-in", "--root", str(root), "--out", str(out), "--wheels",
                 str(tmp_path / "no-wheels"), "--budget", "300", "--steps", "recipe_224")
    recipe = (out / "recipe_224.md").read_text()
    assert done.returncode == 0, recipe[-3000:] + done.stderr[-2000:]
    assert "plain seed 0: main " in recipe and "mgml_fenet seed 0: main " in recipe, recipe
    rows = {row[0]: row for row in table_rows(recipe) if row[0] in ("plain", "mgml_fenet")}
    assert sorted(rows) == ["mgml_fenet", "plain"] and all(row[2].replace(".", "", 1).isdigit() for row in rows.values())
    assert sorted(path.name for path in out.iterdir()) == ["machine.md", "recipe_224.md"]


def test_recipe_lanes_keep_the_finished_runs_in_seed_order_and_name_the_failed_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """bench_recipe.py --lanes: every run a process of its own; results in seed order whichever finishes first, the
    json rewritten after every run (so a step killed at its limit keeps them), a failed run named with its seed.
    The runs here are stand-ins that write a run's json; the real ones run in the lease's stand-in test above."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import bench_recipe

    def fake_run(args: object, row: str, seed: int, json_path: Path) -> list[str]:
        script = (f"import json, sys, time; time.sleep({0.6 if seed == 0 else 0.0}); "
                  f"sys.exit(3) if {row!r} == 'broken' else None; "
                  f"open({str(json_path)!r}, 'w').write(json.dumps({{{row!r}: [{{'main': {seed}.0}}]}})); "
                  f"print('{row} seed {seed}: main {seed}.00 %')")
        return [sys.executable, "-c", script]

    monkeypatch.setattr(bench_recipe, "lane_command", fake_run)
    figures = tmp_path / "runs.json"
    args = bench_recipe.argparse.Namespace(lanes=3, json=figures)
    with pytest.raises(SystemExit, match="broken seed 0 failed") as stopped:
        bench_recipe.run_in_lanes(args, ["plain", "broken"], [0, 1, 2], tmp_path)
    assert "broken seed 2 failed" in str(stopped.value)
    assert json.loads(figures.read_text()) == {"plain": [{"main": 0.0}, {"main": 1.0}, {"main": 2.0}], "broken": []}
    printed = capsys.readouterr().out
    assert printed.index("plain seed 1:") < printed.index("plain seed 0:")  # seed 0 finished last, kept first


def test_the_lease_skips_a_step_the_budget_has_no_room_for(tmp_path: Path) -> None:
    """A budget too small for a step skips it instead of overrunning the time the GPU is at hand."""
    done = bench("gpu_lease.py", "--stand-in", "--out", str(tmp_path), "--wheels", str(tmp_path / "none"),
                 "--budget", "10", "--steps", "bench_step_resnet50")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "== bench_step_resnet50: skipped, " in done.stdout
    assert not (tmp_path / "bench_step_resnet50.md").exists()


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
def test_the_gpu_arguments_of_every_step_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU every step's GPU command line runs up to its "no CUDA device" line: the arguments the GPU
    will get are accepted by each benchmark (a typo there would surface only on the GPU), the real-size set is
    built as on the GPU (at least 10,000 training images), and the outputs are 8 files at most (each step's and the
    machine's facts), all of which come back from a GPU machine. The steps run in this
    process (the lease's own runner starts a Python for each, which only costs time here)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import gpu_lease

    def run_here(name: str, arguments: list[str], limit: float, out: Path, env: dict[str, str]) -> int:
        monkeypatch.setattr(sys, "argv", arguments)
        with open(out / f"{name}.md", "w") as sink, contextlib.redirect_stdout(sink):
            return importlib.import_module(Path(arguments[0]).stem).main() or 0

    monkeypatch.setattr(gpu_lease, "run_step", run_here)
    monkeypatch.setattr(gpu_lease, "machine_facts", lambda env: "machine facts\n")
    root = make_fake_archive(tmp_path / "data", "aid", per_class=6, size=40)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["gpu_lease.py", "--out", str(out), "--wheels", str(tmp_path / "none"),
                                      "--root", str(root)])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert gpu_lease.main() == 0
    assert "real-size set: 20160 images (10080 for training)" in printed.getvalue()  # 180 images linked 112 times
    names = [step[0] for step in gpu_lease.STEPS if step[0] not in gpu_lease.ALONE]
    assert names == ["scene_map", "real_size_epoch", "bench_eval", "bench_compile_resnet50", "bench_compile_resnet18",
                     "bench_epoch_end", "gpu_profile"]
    for name in names:
        assert f"== {name}: exit 0" in printed.getvalue()
        assert "no CUDA device visible" in (out / f"{name}.md").read_text()
    assert sorted(path.name for path in out.iterdir()) == sorted([f"{name}.md" for name in names] + ["machine.md"])
    assert len(names) + 1 <= 8  # every step's output and the machine's facts come back (8 files at most)
    assert sum("OUT/" in argument for step in gpu_lease.STEPS for argument in step[2]) == 2  # the 224 px runs
    monkeypatch.setattr(sys, "argv", ["gpu_lease.py", "--out", str(tmp_path / "alone"), "--wheels",
                                      str(tmp_path / "none"), "--root", str(root), "--steps", *gpu_lease.ALONE])
    with contextlib.redirect_stdout(io.StringIO()):
        assert gpu_lease.main() == 0
    for name in ("recipe_224_main_heads", "recipe_224"):
        assert "no CUDA device visible" in (tmp_path / "alone" / f"{name}.md").read_text()
