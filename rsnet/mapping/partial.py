"""A scene's map in progress, on disk: every window's class probabilities and one flag per chunk, in a hidden folder
beside the outputs, so a map killed at any moment continues where it stopped. Workers write disjoint byte ranges of
the same files (``os.pwrite``): a chunk's probabilities first, then its flag, so a flag is never set before its
chunk's probabilities are in the file; a killed map recomputes the chunks whose flag is not set."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rsnet.files import atomic_write, disk_full_named
from rsnet.mapping.imagery import Canvas, CanvasPiece

SETTINGS = "settings.json"
PROBABILITIES = "windows.f32"
FLAGS = "chunks.done"
IMAGERY = "imagery.raw"  # the preview's canvas: rows × columns × bands samples
IMAGERY_DATA = "imagery.mask"  # one byte per canvas pixel: 1 where the scene has data (a masked scene)


def partial_folder(out_dir: Path, stem: str) -> Path:
    """The hidden folder of the map of ``stem`` in progress."""
    return out_dir / f".{stem}.map-partial"


class PartialMap:
    """The probabilities (``windows`` × ``classes`` float32, NaN for a window not classified) and the chunk flags of
    one scene, in ``folder``."""

    def __init__(self, folder: Path, windows: int, classes: int, chunks: int, canvas: Canvas) -> None:
        self.folder, self.windows, self.classes, self.chunks, self.canvas = folder, windows, classes, chunks, canvas
        self._row_bytes = classes * 4
        self._pixel_bytes = len(canvas.bands) * np.dtype(canvas.dtype).itemsize
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()  # the lanes store chunks at the same time

    @classmethod
    def prepare(cls, folder: Path, settings: Mapping[str, Any], windows: int, classes: int, chunks: int,
                canvas: Canvas) -> PartialMap:
        """The partial map in ``folder`` where an earlier run with the same ``settings`` left one, else a new one
        (a folder of other settings is replaced). The settings are written last: a folder without them is
        incomplete and started afresh."""
        partial = cls(folder, windows, classes, chunks, canvas)
        if partial.recorded_settings() == dict(settings):
            return partial
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        pixels = canvas.shape[0] * canvas.shape[1]
        with disk_full_named(folder / PROBABILITIES):
            for name, size in ((PROBABILITIES, windows * classes * 4), (FLAGS, chunks),
                               (IMAGERY, pixels * partial._pixel_bytes), (IMAGERY_DATA, pixels)):
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

    def _fd(self, name: str) -> int:
        with self._lock:
            if name not in self._fds:
                self._fds[name] = os.open(self.folder / name, os.O_RDWR)
            return self._fds[name]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def done_chunks(self) -> np.ndarray:
        """A flag per chunk: whether its probabilities are on disk."""
        return np.fromfile(self.folder / FLAGS, np.uint8, count=self.chunks).astype(bool)

    def is_done(self, chunk: int) -> bool:
        return os.pread(self._fd(FLAGS), 1, chunk) == b"\x01"

    def write_chunk(self, chunk: int, first_window: int, probabilities: np.ndarray,
                    pieces: Sequence[CanvasPiece]) -> None:
        """Store the probabilities of ``chunk``'s windows (from ``first_window`` on) and its pieces of the preview's
        canvas, then flag it done."""
        payload = np.ascontiguousarray(probabilities, np.float32).tobytes()
        with disk_full_named(self.folder / PROBABILITIES):
            _write_all(self._fd(PROBABILITIES), payload, first_window * self._row_bytes)
            for piece in pieces:
                self._write_piece(piece)
            _write_all(self._fd(FLAGS), b"\x01", chunk)

    def _write_piece(self, piece: CanvasPiece) -> None:
        width = self.canvas.shape[1]
        for offset, values in enumerate(piece.values):
            pixel = (piece.row + offset) * width + piece.col
            _write_all(self._fd(IMAGERY), np.ascontiguousarray(values).tobytes(), pixel * self._pixel_bytes)
            if piece.data is not None:
                _write_all(self._fd(IMAGERY_DATA), piece.data[offset].astype(np.uint8).tobytes(), pixel)

    def read_windows(self, first: int, stop: int) -> np.ndarray:
        """The probabilities of windows ``first`` to ``stop`` - 1, (count, classes)."""
        data = os.pread(self._fd(PROBABILITIES), (stop - first) * self._row_bytes, first * self._row_bytes)
        return np.frombuffer(data, np.float32).reshape(stop - first, self.classes)

    def read_canvas(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The preview's canvas, (rows, columns, bands) samples, and where the scene is masked its data flags."""
        rows, cols = self.canvas.shape
        values = np.fromfile(self.folder / IMAGERY, self.canvas.dtype).reshape(rows, cols, len(self.canvas.bands))
        data = np.fromfile(self.folder / IMAGERY_DATA, np.uint8).reshape(rows, cols) > 0
        return values, data if self.canvas.masked else None

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _write_all(fd: int, payload: bytes, offset: int) -> None:
    view = memoryview(payload)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
