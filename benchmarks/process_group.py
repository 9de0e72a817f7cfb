"""Run a command in its own process group and kill the whole group at a time limit (standard library only), so a
timed-out benchmark or training run leaves no worker behind holding a GPU."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import IO


def run_in_group(command: list[str], cwd: Path, timeout: float, stdout: IO[str], stderr: IO[str] | int,
                 env: dict[str, str] | None = None) -> int | None:
    """``command``'s exit status, or None when it ran past ``timeout`` seconds (its process group is then killed)."""
    process = subprocess.Popen(command, cwd=cwd, stdout=stdout, stderr=stderr, env=env, start_new_session=True)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None
