"""One run at a time in a run directory, on any OS (was: two runs 2 s apart in one dir both finished, the first
lost)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock, Timeout
from helpers import HANG_S, REPO, wait_for, wait_for_exit

import rsnet.engine.run_lock
from rsnet.engine.config_checks import ConfigError
from rsnet.engine.run_lock import (
    LOCK_NAME,
    WORKER_LOCK_GLOB,
    hold_run_dir,
    share_run_dir,
)

HOLDER = """
import sys
from pathlib import Path
from rsnet.engine.run_lock import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()  # holds the dir until it is killed (its stdin does not end before)
"""


def test_a_live_run_holds_its_dir_and_a_killed_one_leaves_it_free(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"in use by a run that is still alive \(pid {holder.pid}\)"):
            with hold_run_dir(tmp_path):
                pass
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs
        holder.wait(HANG_S)
    timeouts: list[float] = []
    monkeypatch.setattr(rsnet.engine.run_lock, "FileLock",
                        lambda path, timeout=-1: (timeouts.append(timeout), FileLock(path, timeout=timeout))[1])
    with hold_run_dir(tmp_path):  # the operating system released the dead holder's lock
        assert (tmp_path / LOCK_NAME).is_file()
    assert timeouts == [0]  # one attempt at the run's lock, no wait for it: it was free once the holder had died


def test_a_new_run_waits_for_the_last_worker_of_an_earlier_one(tmp_path: Path) -> None:
    with share_run_dir(tmp_path):  # a worker of a run whose launcher is gone
        with pytest.raises(ConfigError, match="is still in use by workers of an earlier run that are ending"):
            with hold_run_dir(tmp_path):
                pass
    with hold_run_dir(tmp_path):
        pass


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is a child, grandchild, ... of ``ancestor`` (Linux /proc)."""
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
        if pid == ancestor:
            return True
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_with_a_killed_launcher_and_write_nothing_after(tmp_path: Path) -> None:
    """After kill -9 of the launcher its workers end too, and none writes last.pt or metrics.json once the run dir's
    lock is free, nor prints C++ frames on its way out. While they train, each worker holds a lock of its own in the
    run dir, which keeps a new run out (test_a_new_run_waits_for_the_last_worker_of_an_earlier_one)."""
    run_dir = tmp_path / "run"
    # epochs=100000: the workers would outlast every wait below, unless the launcher's end ends them
    launcher = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), "backbone=test_resnet",
                                 "dataset.image_size=32", "batch_size=32", "log.progress_bar=false", "model=baseline",
                                 "epochs=100000", "trainer.devices=[cpu,cpu]", f"hydra.run.dir={run_dir}"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((run_dir / "checkpoints" / "last.pt").exists, "the run's first checkpoint", alive=launcher)
        # the workers: the processes named by the worker locks, started by the launcher (forked from it or from a
        # fork server it started)
        workers = [int(path.name.split("-")[1].split(".")[0]) for path in run_dir.glob(WORKER_LOCK_GLOB)]
        assert len(workers) == 2 and all(_descends_from(pid, launcher.pid) for pid in workers), workers
        for pid in workers:
            with pytest.raises(Timeout):  # held by the live worker
                FileLock(run_dir / f".rsnet.worker-{pid}.lock", timeout=0).acquire()
    finally:
        launcher.kill()
        launcher.wait(HANG_S)
    held = contextlib.ExitStack()

    def run_dir_free() -> bool:
        try:
            held.enter_context(hold_run_dir(run_dir))
        except ConfigError as refused:  # refused for as long as a worker of the run lives
            assert "is still in use by workers of an earlier run that are ending" in str(refused), refused
            return False
        return True

    with held:
        wait_for(run_dir_free, "the run dir free once the killed launcher's workers have ended")
        before = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}
        for pid in workers:  # the killed launcher's workers end (else they would train on for hours)
            wait_for_exit(pid, "a worker of the killed launcher")
        after = {path: path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}
    assert before == after  # nothing written once the run dir is free again, up to the last worker's end
    _, err = launcher.communicate(timeout=HANG_S)  # the workers' stderr too: closed once they are gone
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


def test_taking_a_run_dir_removes_the_temporaries_a_killed_writer_left(tmp_path: Path) -> None:
    """Only atomic_write's temporaries (.<name>.<12 hex>.tmp), in any sub-folder; a user's own files stay."""
    left = [tmp_path / "checkpoints" / ".last.pt.0a1b2c3d4e5f.tmp", tmp_path / ".metrics.json.ffffffffffff.tmp"]
    kept = [tmp_path / "notes.tmp", tmp_path / ".draft.tmp", tmp_path / "checkpoints" / ".last.pt.xyz.tmp"]
    for path in left + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half")
    with hold_run_dir(tmp_path):
        pass
    assert [path.exists() for path in left + kept] == [False, False, True, True, True]
