"""The scripts a GPU machine runs work before one is at hand: gpu_check.py under ``--cpu-stand-in`` (every cuda:i
replaced by the CPU) trains a GPU + CPU pair and prints its table, and gpu_lease.py runs its steps' tiny CPU versions
within its budget. A broken script found on the GPU would cost the few minutes a GPU is at hand for.

Each script is proved once: the lease's own bookkeeping in this process (its steps stood in for), each step's
script with the lease's stand-in arguments, and scripts/train.py as a process once (the real-size epoch's pair
run, whose log lines the script reads); elsewhere a run of scripts/train.py is that command in this process
(``train_here``). No outcome waits on a time: a step past its limit is one that never ends."""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import json
import math
import os
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Self

import pytest
import torch
from helpers import HANG_S, REPO, make_fake_archive, run_train, wait_for, wait_for_exit

BENCH = REPO / "benchmarks"
# a run's end without the pages of attention maps of every class and the projector's images (seconds of drawing
# that no test of these scripts reads)
CHEAP_EPOCH_END = ["log.attention_images=1", "log.embedding_images=0"]


def benchmark(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """benchmarks/<name>.py, imported in this process."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module(name)


def stand_in(name: str) -> list[str]:
    """The lease's CPU stand-in arguments of step ``name`` (placeholders ROOT, REAL, OUT unreplaced)."""
    import gpu_lease

    return next(step[3] for step in gpu_lease.STEPS if step[0] == name)


def table_rows(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| config") and not line.startswith("| devices")]


def train_here(command: list[str]) -> int:
    """``python scripts/train.py OVERRIDES`` (``command``) in this process: its command line checked as the script
    checks it, then rsnet-train in-process (``helpers.run_train``) into its ``hydra.run.dir``; its exit status."""
    from rsnet.commands.overrides import check_overrides

    assert command[:2] == [sys.executable, str(REPO / "scripts" / "train.py")], command
    overrides = command[2:]
    check_overrides("config", overrides, "train.py")
    [run_dir] = [value.split("=", 1)[1] for value in overrides if value.startswith("hydra.run.dir=")]
    return run_train(Path(run_dir), *[value for value in overrides if not value.startswith("hydra.run.dir=")])


# --------------------------------------------------------------------------------------------- gpu_check.py


def test_gpu_check_passes_a_gpu_and_cpu_pair_under_the_stand_in(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """gpu_check.py's own code in this process; each of its runs of scripts/train.py is that command's (its two
    workers start as processes). The process and its log files: run_training, which the real-size epoch's script
    uses too (its test below)."""
    gpu_check = benchmark(monkeypatch, "gpu_check")
    monkeypatch.setattr(gpu_check, "run_training", lambda command, log_dir, timeout: train_here(command))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--cpu-stand-in", "--backbone", "test_resnet", "--image-size",
                                      "32", "--models", "baseline", "--trainers", "adaptive", "--configs", "gpu+cpu",
                                      "--set", *CHEAP_EPOCH_END])
    capsys.readouterr()
    status = gpu_check.main()
    printed = capsys.readouterr().out
    assert status == 0, printed[-3000:]
    assert "CPU STAND-IN" in printed and "1 passed, 0 failed" in printed
    [row] = table_rows(printed)
    assert row[:6] == ["gpu+cpu", "cpu, cpu", "gloo", "adaptive", "baseline", "PASS"]
    assert float(row[6]) > 0 and row[7].replace(".", "", 1).isdigit()  # images/s, and the test accuracy's number


# --------------------------------------------------------------------------------------------- gpu_lease.py


def probe_here(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """subprocess.run for gpu_lease.machine_facts: its ``python -c PROBE`` run in this process (the probe's own
    code, with the libraries it names), any other command as a process."""
    if command[:2] != [sys.executable, "-c"]:
        return subprocess.run(command, check=False, **kwargs)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(command[2], {})  # noqa: S102 - the lease's own probe
    return subprocess.CompletedProcess(command, 0, printed.getvalue(), "")


def test_the_lease_runs_its_steps_and_keeps_each_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_lease.py --stand-in, in this process, its steps stood in for: the real-size set is built in a folder of
    this lease's own, which the steps read while they run and which is removed when the lease ends; each step gets
    its stand-in arguments with ROOT, REAL and OUT in place, its output lands in its own file under --out and its
    outcome line is printed, and the machine facts (the probe's code, run here) are written. What each step's
    script does with those arguments: the tests below."""
    gpu_lease = benchmark(monkeypatch, "gpu_lease")
    root = make_fake_archive(tmp_path, "aid", per_class=3, size=40)
    out = tmp_path / "out"
    ran: dict[str, tuple[list[str], int]] = {}

    def run_here(name: str, arguments: list[str], limit: float, folder: Path, env: dict[str, str]) -> int:
        real = Path(arguments[arguments.index("--root") + 1])
        ran[name] = (arguments, len(list(real.rglob("*.jpg"))))  # the set as the step finds it
        (folder / f"{name}.md").write_text(f"{name}'s output\n")
        return 0

    monkeypatch.setattr(gpu_lease, "run_step", run_here)
    monkeypatch.setattr(gpu_lease, "subprocess", SimpleNamespace(run=probe_here))
    monkeypatch.setattr(sys, "argv", ["gpu_lease.py", "--stand-in", "--root", str(root), "--out", str(out), "--wheels",
                                      str(tmp_path / "no-wheels"), "--budget", "500", "--real-min-train", "60",
                                      "--steps", "real_size_epoch", "gpu_profile"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert gpu_lease.main() == 0
    printed = printed.getvalue()
    assert sorted(path.name for path in out.iterdir()) == ["gpu_profile.md", "machine.md", "real_size_epoch.md"]
    assert "torch " in (out / "machine.md").read_text()
    assert "real-size set: 180 images (90 for training)" in printed  # 90 images linked twice
    real_size_root = Path(printed.split("real-size set: ")[1].split(" into ")[1].splitlines()[0])
    assert real_size_root.parent.name.startswith("rsnet-real-size-")  # this run's own folder, not a fixed one...
    assert not real_size_root.parent.exists()  # ...and removed when the lease ends
    values = {"ROOT": str(root.resolve()), "REAL": str(real_size_root), "OUT": str(out.resolve())}
    assert ran == {name: (gpu_lease.placeholders(stand_in(name), values), 180)
                   for name in ("real_size_epoch", "gpu_profile")}
    for name in ran:
        assert f"== {name}: exit 0 after " in printed and f"{name}'s output" in printed


def test_the_lease_skips_a_step_the_budget_has_no_room_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget too small for a step skips it instead of overrunning the time the GPU is at hand."""
    gpu_lease = benchmark(monkeypatch, "gpu_lease")
    monkeypatch.setattr(gpu_lease, "machine_facts", lambda env: "machine facts\n")
    monkeypatch.setattr(gpu_lease, "run_step", lambda *arguments: pytest.fail(f"a step ran: {arguments}"))
    monkeypatch.setattr(sys, "argv", ["gpu_lease.py", "--stand-in", "--out", str(tmp_path), "--wheels",
                                      str(tmp_path / "none"), "--budget", "10", "--steps", "bench_step_resnet50"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert gpu_lease.main() == 0
    assert "== bench_step_resnet50: skipped, " in printed.getvalue()
    assert not (tmp_path / "bench_step_resnet50.md").exists()


class _LimitAfterTheChild(subprocess.Popen):
    """The step's process, whose time limit starts once it has started a child of its own (its ``child.pid`` file
    is written): the kill then always meets a step with a child, however slowly the machine starts processes."""

    child_pid: Path

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:
            wait_for(self.child_pid.exists, "the step starting its own child", alive=self)
        return super().wait(timeout)


def test_a_step_past_its_limit_is_killed_with_its_children(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that outlives its limit (here: one that never ends) is killed with its whole process group (a
    benchmark's own subprocesses too), so nothing of it competes with the next step for the GPU."""
    gpu_lease = benchmark(monkeypatch, "gpu_lease")
    import process_group

    child_pid = tmp_path / "child.pid"
    (tmp_path / "sleeper.py").write_text(
        "import os, subprocess, sys, threading\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import threading; threading.Event().wait()'])\n"
        "print('started', flush=True)\n"
        f"open({str(child_pid)!r} + '.tmp', 'w').write(str(child.pid))\n"
        f"os.replace({str(child_pid)!r} + '.tmp', {str(child_pid)!r})\n"
        "threading.Event().wait()  # never set: the step never ends\n")
    monkeypatch.setattr(gpu_lease, "BENCH", tmp_path)
    monkeypatch.setattr(_LimitAfterTheChild, "child_pid", child_pid, raising=False)
    monkeypatch.setattr(process_group, "subprocess", SimpleNamespace(Popen=_LimitAfterTheChild,
                                                                     TimeoutExpired=subprocess.TimeoutExpired))
    status = gpu_lease.run_step("sleeper", ["sleeper.py"], 0.1, tmp_path, dict(os.environ))
    assert status is None  # timed out: killed
    assert (tmp_path / "sleeper.md").read_text() == "started\n"
    wait_for_exit(int(child_pid.read_text()), "the step's own child, killed with its group")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the steps would measure for minutes")
def test_the_gpu_arguments_of_every_step_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU every step's GPU command line runs up to its "no CUDA device" line: the arguments the GPU
    will get are accepted by each benchmark (a typo there would surface only on the GPU), the real-size set is
    built as on the GPU (at least 10,000 training images), and the outputs are 8 files at most (each step's and the
    machine's facts), all of which come back from a GPU machine. The steps run in this
    process (the lease's own runner starts a Python for each, which only costs time here)."""
    gpu_lease = benchmark(monkeypatch, "gpu_lease")

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
    for name in ("recipe_224_no_heads", "recipe_224"):
        assert "no CUDA device visible" in (tmp_path / "alone" / f"{name}.md").read_text()


# ------------------------------------------------------------------------------- the steps' scripts, stand-in


def test_the_real_size_epoch_of_a_pair_lists_the_scheduler_decisions(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The lease's real_size_epoch step (gpu_throughput.py) with its stand-in arguments: the GPU alone (a CPU worker)
    and beside the CPU (two). The pair is run for real, scripts/train.py as a process whose log lines and
    metrics.json the script reads: its row of training and whole-epoch images/s and the scheduler's decisions. The
    worker alone would prove the same once more: its run is stood in for (its figures given), the devices it is
    asked for checked, and the summary lines printed from both."""
    gpu_throughput = benchmark(monkeypatch, "gpu_throughput")
    root = make_fake_archive(tmp_path, "aid", per_class=3, size=40)
    arguments = benchmark(monkeypatch, "gpu_lease").placeholders(stand_in("real_size_epoch"), {"REAL": str(root)})
    arguments[arguments.index("--timeout") + 1] = str(int(HANG_S))  # the run's ceiling: only a hang reaches it
    real_run, asked = gpu_throughput.run, []

    def run(devices: list[str], size: int, args: object, tmp: Path) -> tuple[str, list[str], dict]:
        asked.append(devices)
        if len(devices) == 1:
            return f"| {devices[0]} | {size} | 1,000 | 500 | 1.0 | 10.00 | 0 | 30 |", [], \
                {"steady": 1000.0, "whole": 500.0, "run_s": 30.0}
        return real_run(devices, size, args, tmp)

    monkeypatch.setattr(gpu_throughput, "run", run)
    monkeypatch.setattr(sys, "argv", arguments)
    capsys.readouterr()
    assert gpu_throughput.main() == 0
    printed = capsys.readouterr().out
    assert asked == [["cpu"], ["cpu", "cpu"]]  # the GPU alone, then beside the CPU (cuda:0 -> the CPU)
    alone, pair = table_rows(printed)
    assert alone[:2] == ["cpu", "32"] and pair[:2] == ["cpu, cpu", "32"], printed
    assert float(pair[2].replace(",", "")) > 0 and float(pair[3].replace(",", "")) > 0, printed  # parsed, not nan
    assert "scheduler decisions:" in printed
    assert "32 px, 1gpu: whole epochs / training = " in printed and "32 px: GPU + CPU / GPU alone, whole runs = " \
        in printed


def test_the_real_size_epochs_figures_come_from_its_log_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole epochs' images/s are read from the stamps of the evaluated epochs' log lines (so they hold evaluation,
    checkpoints and barriers: slower than training alone), and the summary gives each run's ratio of the two and
    the pair's speed over the GPU's alone."""
    gpu_throughput = benchmark(monkeypatch, "gpu_throughput")
    lines = ["[2026-01-01 10:00:00,000][rsnet.engine.epoch_end][INFO] - epoch 1/3: test accuracy 10.00 %",
             "[2026-01-01 10:00:01,000][rsnet.engine.trainer][INFO][worker 0] - merge 1: speeds 1.0, 2.0",
             "[2026-01-01 10:00:02,500][rsnet.engine.epoch_end][INFO] - epoch 2/3: test accuracy 20.00 %",
             "[2026-01-01 10:00:04,000][rsnet.engine.epoch_end][INFO][worker 0] - epoch 3/3: test accuracy 30.00 %"]
    assert gpu_throughput.whole_epoch_rate(lines, 90) == pytest.approx(90 * 2 / 4.0)  # epochs 2..3 in 4 s
    assert math.isnan(gpu_throughput.whole_epoch_rate(lines[:2], 90))  # one evaluated epoch: no rate
    figures = {"1gpu": {"steady": 100.0, "whole": 80.0, "run_s": 30.0},
               "gpu+cpu": {"steady": 120.0, "whole": 90.0, "run_s": 20.0}}
    assert gpu_throughput.summary_ratios(32, figures) == [
        "32 px, 1gpu: whole epochs / training = 0.80", "32 px, gpu+cpu: whole epochs / training = 0.75",
        "32 px: GPU + CPU / GPU alone, whole runs = 1.50 (20 s vs 30 s)"]
    assert gpu_throughput.summary_ratios(32, {"1gpu": figures["1gpu"], "gpu+cpu": {}}) == [
        "32 px, 1gpu: whole epochs / training = 0.80"]  # a failed run: no pair ratio


def test_the_profile_holds_both_parts_tables_and_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease's gpu_profile step with its stand-in arguments, as a process (its epoch part runs scripts/train.py
    in that process): both parts' tables, each epoch's seconds, and the steady part's trace."""
    gpu_lease = benchmark(monkeypatch, "gpu_lease")
    root = make_fake_archive(tmp_path, "aid", per_class=3, size=40)
    out = tmp_path / "out"
    arguments = gpu_lease.placeholders(stand_in("gpu_profile"), {"REAL": str(root), "OUT": str(out)})
    done = subprocess.run([sys.executable, str(BENCH / arguments[0]), *arguments[1:]], capture_output=True, text=True,
                          timeout=600, cwd=REPO, check=False)
    profile = done.stdout
    assert done.returncode == 0, profile[-3000:] + done.stderr[-3000:]
    assert profile.count("| rsnet.data_wait |") == 2 and profile.count("Top 5 ops by CPU time") == 2, profile
    assert "## Steady steps" in profile and "## Epoch 2 of a real run" in profile
    epochs = [row for row in table_rows(profile) if row[0] in ("1", "2")]  # seconds of train, evaluate, epoch end
    assert [row[0] for row in epochs] == ["1", "2"] and all(float(cell) > 0 for row in epochs for cell in row[1:3])
    assert all(row[3].replace(".", "", 1).isdigit() for row in epochs)  # the epoch end's seconds (a snapshot)
    assert sorted(path.name for path in out.iterdir()) == ["profile_trace.json.gz"]
    assert json.loads(gzip.decompress((out / "profile_trace.json.gz").read_bytes()))["traceEvents"]


class _OneAfterTheOther:
    """A ThreadPoolExecutor stand-in that runs each submitted call at once, on the caller's thread."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def submit(self, function, *arguments) -> Future:
        future: Future = Future()
        try:
            future.set_result(function(*arguments))
        except BaseException as error:  # noqa: BLE001 - kept for result(), as a pool does
            future.set_exception(error)
        return future


def test_the_recipe_check_at_224_px_runs_its_rows_in_lanes_and_prints_its_table(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The lease's recipe_224 step (bench_recipe.py) with its stand-in arguments: every run a lane (the script again,
    its command line from lane_command, for one row and seed), the plain loop and rsnet's scripts/train.py, a line
    per run and the table with both rows. In this process: each lane is the script's main with the lane's command
    line, one after the other, and scripts/train.py is that command's code (``train_here``). That the lease runs
    the step only when named: test_the_gpu_arguments_of_every_step_parse."""
    bench_recipe = benchmark(monkeypatch, "bench_recipe")
    root = make_fake_archive(tmp_path, "aid", per_class=4, size=40)
    arguments = benchmark(monkeypatch, "gpu_lease").placeholders(stand_in("recipe_224"), {"ROOT": str(root)})
    arguments += [part for override in CHEAP_EPOCH_END for part in ("--set", override)]  # the rsnet rows' overrides
    lanes: list[list[str]] = []

    def run_here(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if command[1] != str(Path(bench_recipe.__file__).resolve()):
            return subprocess.CompletedProcess(command, train_here(command), "", "")
        lanes.append(command[2:])
        printed = io.StringIO()
        with monkeypatch.context() as lane, contextlib.redirect_stdout(printed):
            lane.setattr(sys, "argv", ["bench_recipe.py", *command[2:]])
            try:
                bench_recipe.main()
            except SystemExit as stop:
                return subprocess.CompletedProcess(command, 1, printed.getvalue(), str(stop))
        return subprocess.CompletedProcess(command, 0, printed.getvalue(), "")

    monkeypatch.setattr(bench_recipe, "subprocess", SimpleNamespace(run=run_here))
    monkeypatch.setattr(bench_recipe, "ThreadPoolExecutor", _OneAfterTheOther)
    monkeypatch.setattr(sys, "argv", arguments)
    capsys.readouterr()
    bench_recipe.main()
    recipe = capsys.readouterr().out
    assert [lane[lane.index("--rows") + 1] for lane in lanes] == ["plain", "mgml_fenet"]
    assert "plain seed 0: main " in recipe and "mgml_fenet seed 0: main " in recipe, recipe
    rows = {row[0]: row for row in table_rows(recipe) if row[0] in ("plain", "mgml_fenet")}
    assert sorted(rows) == ["mgml_fenet", "plain"] and all(row[2].replace(".", "", 1).isdigit()
                                                           for row in rows.values())


def test_recipe_lanes_keep_the_finished_runs_in_seed_order_and_name_the_failed_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """bench_recipe.py --lanes: results in seed order whichever finishes first, the json rewritten after every run
    (so a step killed at its limit keeps them), a failed run named with its seed. The runs here are stand-ins that
    write a run's json; plain seed 0 ends only once seed 1's result is kept (an event, not a time); the real runs:
    the recipe check's test above."""
    bench_recipe = benchmark(monkeypatch, "bench_recipe")
    figures = tmp_path / "runs.json"

    def kept(row: str, seed: int) -> bool:
        try:
            return {"main": float(seed)} in json.loads(figures.read_text()).get(row, [])
        except (OSError, ValueError):  # not written yet, or being rewritten
            return False

    def run_lane(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        _, row, seed, json_path = command
        if (row, seed) == ("plain", "0"):  # finishes last
            wait_for(lambda: kept("plain", 1), "plain seed 1's result kept")
        if row == "broken":
            return subprocess.CompletedProcess(command, 3, "", "broken")
        Path(json_path).write_text(json.dumps({row: [{"main": float(seed)}]}))
        return subprocess.CompletedProcess(command, 0, f"{row} seed {seed}: main {seed}.00 %\n", "")

    monkeypatch.setattr(bench_recipe, "lane_command", lambda args, row, seed, json_path: [
        "lane", row, str(seed), str(json_path)])
    monkeypatch.setattr(bench_recipe, "subprocess", SimpleNamespace(run=run_lane))
    args = bench_recipe.argparse.Namespace(lanes=3, json=figures)
    with pytest.raises(SystemExit, match="broken seed 0 failed") as stopped:
        bench_recipe.run_in_lanes(args, ["plain", "broken"], [0, 1, 2], tmp_path)
    assert "broken seed 2 failed" in str(stopped.value)
    assert json.loads(figures.read_text()) == {"plain": [{"main": 0.0}, {"main": 1.0}, {"main": 2.0}], "broken": []}
    printed = capsys.readouterr().out
    assert printed.index("plain seed 1:") < printed.index("plain seed 0:")  # seed 0 finished last, kept first
