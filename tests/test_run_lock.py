"""One run at a time in a run directory (was: two runs 2 s apart in one dir both finished, the first lost)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsnet.engine.config_checks import ConfigError
from rsnet.engine.run_lock import LOCK_NAME, hold_run_dir

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
