"""One run at a time in a run directory, on any OS (was: two runs 2 s apart in one dir both finished, the first lost)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO

from rsnet.engine.config_checks import ConfigError
from rsnet.engine.run_lock import LOCK_NAME, hold_run_dir, share_run_dir

HOLDER = """
import sys, time
from pathlib import Path
from rsnet.engine.run_lock import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_live_run_holds_its_dir_and_a_killed_one_leaves_it_free(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"in use by a run that is still alive \(pid {holder.pid}\)"):
            with hold_run_dir(tmp_path):
                pass
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs
        holder.wait(10)
    started = time.monotonic()
    with hold_run_dir(tmp_path):  # the operating system released the dead holder's lock
        assert (tmp_path / LOCK_NAME).is_file()
    assert time.monotonic() - started < 1.0


def test_a_new_run_waits_for_the_last_worker_of_an_earlier_one(tmp_path: Path) -> None:
    with share_run_dir(tmp_path):  # a worker of a run whose launcher is gone
        with pytest.raises(ConfigError, match="is still in use by workers of an earlier run that are ending"):
            with hold_run_dir(tmp_path):
                pass
    with hold_run_dir(tmp_path):
        pass


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """Whether a thread of process ``pid`` still runs: a killed process's main thread shows "Z" while its other
    threads are still ending, and its files (and their locks) are closed only when the last has ended."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    states = []
    for task in tasks:
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            continue
    return any(state not in ("Z", "X") for state in states)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_with_a_killed_launcher_and_write_nothing_after(tmp_path: Path) -> None:
    """After kill -9 of the launcher its workers end too, and none writes last.pt or metrics.json once the run dir's
    lock is free, nor prints C++ frames on its way out."""
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), "backbone=test_resnet",
                                 "dataset.image_size=32", "batch_size=32", "log.progress_bar=false", "model=baseline",
                                 "epochs=200", "trainer.devices=[cpu,cpu]", f"hydra.run.dir={run_dir}"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "last.pt").exists() and launcher.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.2)
    # CPU workers are forked: the launcher's children that run its command (not a helper such as a resource tracker)
    command = Path(f"/proc/{launcher.pid}/cmdline").read_text()
    workers = [pid for pid in _children(launcher.pid) if Path(f"/proc/{pid}/cmdline").read_text() == command]
    assert len(workers) == 2, workers
    launcher.kill()
    launcher.wait(10)
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers):
        with pytest.raises(ConfigError, match="in use"):  # refused for as long as a worker of the run lives
            with hold_run_dir(run_dir):
                pass
        assert time.monotonic() < deadline, "the workers outlived their killed launcher by 20 s"
        time.sleep(0.05)
    with hold_run_dir(run_dir):
        before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}
        time.sleep(2.0)
        after = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}
    assert before == after  # nothing written once the run dir is free again
    _, err = launcher.communicate(timeout=10)  # the workers' stderr too: closed once they are gone
    assert "frame #" not in err and "Traceback" not in err, err[-3000:]


IMPORT_WITHOUT_POSIX_LOCKS = """
import importlib, pkgutil, sys
sys.modules["fcntl"] = None  # as on Windows: importing it raises ImportError
import rsnet
failed = []
for module in pkgutil.walk_packages(rsnet.__path__, "rsnet."):
    try:
        importlib.import_module(module.name)
    except ImportError as error:
        failed.append(f"{module.name}: {error}")
print("\\n".join(failed) or "all imported")
"""


def test_every_module_imports_where_there_is_no_fcntl() -> None:
    """Every rsnet module imports where fcntl does not exist (Windows): the run lock needs it only when it locks."""
    result = subprocess.run([sys.executable, "-c", IMPORT_WITHOUT_POSIX_LOCKS], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.stdout.strip() == "all imported", result.stdout + result.stderr[-2000:]


def test_a_worker_removes_its_lock_when_it_ends_and_a_crashed_workers_lock_is_cleared(tmp_path: Path) -> None:
    with share_run_dir(tmp_path):
        assert len(list(tmp_path.glob(".rsnet.worker-*.lock"))) == 1
    assert not list(tmp_path.glob(".rsnet.worker-*.lock"))
    (tmp_path / ".rsnet.worker-999999.lock").write_text("")  # left by a worker that was killed
    with hold_run_dir(tmp_path):
        assert not list(tmp_path.glob(".rsnet.worker-*.lock"))
