"""Atomic writes, the full-disk error, and how the scripts report it."""

from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path

import pytest
import torch

from rsnet.cli import user_errors
from rsnet.checkpoint import load_checkpoint, save_checkpoint
from rsnet.files import DiskFullError, atomic_write, check_writable_dir

PAYLOAD = {"model_config": {"arch": "baseline"}, "model_state": {"w": torch.ones(2)}, "class_names": ["a"],
           "image_size": 64, "mean": [0.0] * 3, "std": [1.0] * 3, "epoch": 1}


def test_full_disk_during_a_checkpoint_names_it_and_keeps_the_previous_one(tmp_path: Path, monkeypatch, capsys) -> None:
    """A full disk while a checkpoint is written is one line naming the file, with no traceback, and the previous
    checkpoint stays intact."""
    last = save_checkpoint(tmp_path / "checkpoints" / "last.pt", PAYLOAD)

    def full_disk(obj, handle):
        handle.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(SystemExit) as stopped, user_errors():
        save_checkpoint(last, {**PAYLOAD, "epoch": 2})
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (f"error: no space left on device while writing {last}; free space on that file "
                                       "system or write elsewhere (its previous version, if any, is intact)\n")
    assert load_checkpoint(last)["epoch"] == 1
    assert [path.name for path in last.parent.iterdir()] == ["last.pt"]  # no temp file left


def test_disk_full_error_survives_the_trip_from_a_worker() -> None:
    error = pickle.loads(pickle.dumps(DiskFullError("/runs/a/metrics.json")))
    assert isinstance(error, DiskFullError) and error.errno == errno.ENOSPC and error.path == "/runs/a/metrics.json"
    assert str(error).startswith("no space left on device while writing /runs/a/metrics.json")


def test_writable_dir_check_names_the_setting(tmp_path: Path) -> None:
    assert check_writable_dir(tmp_path / "new" / "run", "out") == tmp_path / "new" / "run"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"^out=.*file/run cannot be written \(Not a directory\)"):
        check_writable_dir(tmp_path / "file" / "run", "out")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_users_umask(tmp_path: Path, umask: int, mode: int) -> None:
    """Files rsnet writes (atomically, through a temporary file) get the mode the user's umask gives, as files
    written in place do."""
    previous = os.umask(umask)
    try:
        with atomic_write(tmp_path / "metrics.json", "w") as handle:
            handle.write("{}")
        checkpoint = save_checkpoint(tmp_path / "checkpoints" / "last.pt", PAYLOAD)
    finally:
        os.umask(previous)
    assert (tmp_path / "metrics.json").stat().st_mode & 0o777 == mode
    assert checkpoint.stat().st_mode & 0o777 == mode
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoints", "metrics.json"]  # no temp file left


def test_a_folder_too_long_for_the_files_written_in_it_is_refused_before_it_is_made(tmp_path: Path) -> None:
    from rsnet.files import PATH_ROOM

    limit = os.pathconf(tmp_path, "PC_PATH_MAX")
    target = limit - PATH_ROOM // 2  # a folder the file system takes, but not the files written in it
    folder = tmp_path
    while len(os.fsencode(str(folder))) + 250 < target:
        folder = folder / ("d" * 200)
    folder = folder / ("e" * (target - len(os.fsencode(str(folder))) - 1))  # 48 to 249 bytes: a valid name
    assert len(os.fsencode(str(folder))) < limit  # the folder itself could be made
    with pytest.raises(ValueError, match=rf"^hydra\.run\.dir=.* is \d+ bytes long as an absolute path, and the files "
                                         rf"written in it need up to {PATH_ROOM} bytes more, past the file system's "
                                         rf"limit of {limit}: choose a shorter folder$"):
        check_writable_dir(folder, "hydra.run.dir")
    assert not any(tmp_path.iterdir())  # nothing made
