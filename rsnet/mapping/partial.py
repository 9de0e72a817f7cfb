"""A scene's map in progress, on disk: every window's class probabilities and one flag per chunk, in a hidden folder
beside the outputs, so a map killed at any moment continues where it stopped. Workers write disjoint byte ranges of
the same files (``os.pwrite``): a chunk's probabilities first, then its flag, so a flag is never set before its
chunk's probabilities are in the file; a killed map recomputes the chunks whose flag is not set."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rsnet.files import atomic_write, disk_full_named

SETTINGS = "settings.json"
PROBABILITIES = "windows.f32"
FLAGS = "chunks.done"


def partial_folder(out_dir: Path, stem: str) -> Path:
    """The hidden folder of the map of ``stem`` in progress."""
    return out_dir / f".{stem}.map-partial"


class PartialMap:
    """The probabilities (``windows`` × ``classes`` float32, NaN for a window not classified) and the chunk flags of
    one scene, in ``folder``."""

    def __init__(self, folder: Path, windows: int, classes: int, chunks: int) -> None:
        self.folder, self.windows, self.classes, self.chunks = folder, windows, classes, chunks
        self._row_bytes = classes * 4
        self._fds: tuple[int, int] | None = None

    @classmethod
    def prepare(cls, folder: Path, settings: Mapping[str, Any], windows: int, classes: int, chunks: int) -> PartialMap:
        """The partial map in ``folder`` where an earlier run with the same ``settings`` left one, else a new one
        (a folder of other settings is replaced). The settings are written last: a folder without them is
        incomplete and started afresh."""
        partial = cls(folder, windows, classes, chunks)
        if partial.recorded_settings() == dict(settings):
            return partial
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with disk_full_named(folder / PROBABILITIES):
            for name, size in ((PROBABILITIES, windows * classes * 4), (FLAGS, chunks)):
                with open(folder / name, "wb") as handle:
                    handle.truncate(size)  # sparse: zeros, i.e. no chunk done
        with atomic_write(folder / SETTINGS, "w") as handle:
            json.dump(dict(settings), handle, indent=1, sort_keys=True)
        return partial

    def recorded_settings(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / SETTINGS).read_text())
        except (OSError, ValueError):
            return None

    def _open(self) -> tuple[int, int]:
        if self._fds is None:
            self._fds = (os.open(self.folder / PROBABILITIES, os.O_RDWR), os.open(self.folder / FLAGS, os.O_RDWR))
        return self._fds

    def close(self) -> None:
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def done_chunks(self) -> np.ndarray:
        """A flag per chunk: whether its probabilities are on disk."""
        return np.fromfile(self.folder / FLAGS, np.uint8, count=self.chunks).astype(bool)

    def is_done(self, chunk: int) -> bool:
        return os.pread(self._open()[1], 1, chunk) == b"\x01"

    def write_chunk(self, chunk: int, first_window: int, probabilities: np.ndarray) -> None:
        """Store the probabilities of ``chunk``'s windows (from ``first_window`` on), then flag it done."""
        data, flags = self._open()
        payload = np.ascontiguousarray(probabilities, np.float32).tobytes()
        with disk_full_named(self.folder / PROBABILITIES):
            _write_all(data, payload, first_window * self._row_bytes)
            _write_all(flags, b"\x01", chunk)

    def read_windows(self, first: int, stop: int) -> np.ndarray:
        """The probabilities of windows ``first`` to ``stop`` - 1, (count, classes)."""
        data = os.pread(self._open()[0], (stop - first) * self._row_bytes, first * self._row_bytes)
        return np.frombuffer(data, np.float32).reshape(stop - first, self.classes)

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _write_all(fd: int, payload: bytes, offset: int) -> None:
    view = memoryview(payload)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
