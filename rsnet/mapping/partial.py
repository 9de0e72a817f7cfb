"""A scene's map in progress, on disk: every window's class probabilities and a record per chunk, in a hidden folder
beside the outputs, so a map killed at any moment continues where it stopped, and proves its data before they become
a map. Workers write disjoint byte ranges of the same files (``os.pwrite``): a chunk's probabilities and its pieces of
the preview's canvas first, then, once they are on the disk (one ``fdatasync`` for the chunks of
:data:`COMMIT_SECONDS`), its record: a flag and the CRC-32 of those bytes. A chunk is classified only where its record
matches its bytes, whatever they hold: a resumed map classifies the others again, and a map is assembled only once
every chunk matches its record. One map of a scene at a time: :class:`MapLock`."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from rsnet.files import disk_full_named, write_json
from rsnet.mapping.grid import WindowGrid
from rsnet.mapping.imagery import Canvas, CanvasPiece

SETTINGS = "settings.json"
PROBABILITIES = "windows.f32"
FLAGS = "chunks.done"  # a RECORD per chunk
IMAGERY = "imagery.raw"  # the preview's canvas: rows × columns × bands samples
IMAGERY_DATA = "imagery.mask"  # one byte per canvas pixel: 1 where the scene has data (a masked scene)
RECORD = np.dtype([("done", "<u4"), ("crc", "<u4")])  # 1 + DEVICE_KINDS index, the CRC-32 of its bytes; 0: not done
DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu", "other")  # the kind of device that classified a chunk, in its record
COMMIT_SECONDS = 2.0  # the records of the chunks stored meanwhile are written at most this often (and at a scene's end)
_sync = getattr(os, "fdatasync", os.fsync)


def partial_folder(out_dir: Path, stem: str) -> Path:
    """The hidden folder of the map of ``stem`` in progress."""
    return out_dir / f".{stem}.map-partial"


class MapLock:
    """One map of ``stem`` into ``out_dir`` at a time: an advisory ``filelock`` lock beside its partial folder (as
    rsnet.engine.run_lock holds a run dir), released by the operating system however its holder ends; the holder's
    pid beside it, for the refusal's message."""

    def __init__(self, out_dir: Path, stem: str) -> None:
        self.stem, self.folder = stem, partial_folder(out_dir, stem)
        self.path, self.owner = out_dir / f".{stem}.map.lock", out_dir / f".{stem}.map.pid"
        self._lock = FileLock(self.path, timeout=0)

    def acquire(self) -> MapLock:
        """Hold the map, or refuse (ValueError naming the folder and the holder's pid) while another process does."""
        try:
            self._lock.acquire()
        except Timeout:
            try:
                holder = self.owner.read_text().strip()
            except OSError:
                holder = "unknown"
            raise ValueError(f"{self.folder}: another map of {self.stem} into {self.folder.parent} is running (pid "
                             f"{holder}); wait for it to finish, stop it, or map into another folder") from None
        self.owner.write_text(str(os.getpid()))
        return self

    def release(self) -> None:
        self.owner.unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)  # a process that opened it meanwhile finds it unlinked, and tries again
        self._lock.release()

    def __enter__(self) -> MapLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class PartialMap:
    """The probabilities (windows × ``classes`` float32; NaN for a window mostly over nodata, not classified) and the
    chunk records of the scene of ``grid``, in ``folder``."""

    def __init__(self, folder: Path, grid: WindowGrid, classes: int, canvas: Canvas, device: str = "cpu") -> None:
        self.folder, self.grid, self.classes, self.canvas = folder, grid, classes, canvas
        self._kind = 1 + DEVICE_KINDS.index(device if device in DEVICE_KINDS else "other")
        self.windows, self.chunks = grid.windows, grid.chunks
        self._row_bytes = classes * 4
        self._pixel_bytes = len(canvas.bands) * np.dtype(canvas.dtype).itemsize
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()  # the lanes store chunks at the same time
        self._pending: list[tuple[int, int]] = []  # (chunk, checksum): stored, its record not yet written
        self._committed = time.monotonic()

    @classmethod
    def prepare(cls, folder: Path, settings: Mapping[str, Any], grid: WindowGrid, classes: int,
                canvas: Canvas) -> tuple[PartialMap, str]:
        """The partial map in ``folder`` where an earlier run with the same ``settings`` left one (its files brought
        to their sizes, the records that do not match their chunk's bytes cleared), else a new one (a folder of other
        settings is replaced; the settings are written last: a folder without them is started afresh); and what was
        found wrong, in one line, or ''."""
        partial = cls(folder, grid, classes, canvas)
        recorded = partial.recorded_settings()
        if recorded == dict(settings):
            return partial, partial._repair()
        unreadable = recorded is None and folder.exists()
        found = f"{folder}: {SETTINGS} is missing or unreadable: the scene is mapped afresh" if unreadable else ""
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        partial._fill(partial._sizes())  # sparse zeros: no chunk done
        write_json(folder / SETTINGS, dict(settings), indent=1, sort_keys=True)
        return partial, found

    def recorded_settings(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / SETTINGS).read_text())
        except (OSError, ValueError):
            return None

    def _sizes(self) -> dict[str, int]:
        pixels = self.canvas.shape[0] * self.canvas.shape[1]
        return {PROBABILITIES: self.windows * self._row_bytes, FLAGS: self.chunks * RECORD.itemsize,
                IMAGERY: pixels * self._pixel_bytes, IMAGERY_DATA: pixels}

    def _damaged(self) -> dict[str, str]:
        """The files that do not have their size, and how."""
        held = {name: (self.folder / name).stat().st_size if (self.folder / name).is_file() else None
                for name in self._sizes()}
        return {name: f"{name} is missing" if held[name] is None else f"{name} holds {held[name]} of {size} bytes"
                for name, size in self._sizes().items() if held[name] != size}

    def _fill(self, names: Iterable[str]) -> None:
        """Bring the files ``names`` to their sizes: zeros where one is missing or short."""
        for name in names:
            with disk_full_named(self.folder / name), open(self.folder / name, "ab") as handle:
                handle.truncate(self._sizes()[name])

    def _repair(self) -> str:
        """Bring every file to its size and clear the records that do not match their chunk's bytes; what was wrong,
        in one line, or ''."""
        found = self._damaged()
        self._fill(found)
        wrong = np.flatnonzero(self._records()["done"].astype(bool) & ~self.verified())
        for chunk in wrong:
            _write_all(self._fd(FLAGS), bytes(RECORD.itemsize), int(chunk) * RECORD.itemsize)
        problems = list(found.values())
        if len(wrong):
            problems.append(f"chunk(s) {_listed(wrong)} of {self.chunks} do not match their records (cut short, "
                            "changed or never written)")
        return f"{self.folder}: {'; '.join(problems)}; the chunks not proven are classified again" if problems else ""

    def prove(self) -> None:
        """Refuse (ValueError naming the folder and what is wrong) unless every chunk's bytes match its record: no
        cell of the map comes from bytes that were never written."""
        problems = list(self._damaged().values())
        unproven = [] if problems else np.flatnonzero(~self.verified())
        if len(unproven):
            problems.append(f"chunk(s) {_listed(unproven)} of {self.chunks} have no record or do not match it")
        if problems:
            raise ValueError(f"{self.folder}: the map cannot be proved from its data ({'; '.join(problems)}); the "
                             "folder is kept: run the same command again to classify those chunks again")

    def verified(self) -> np.ndarray:
        """Per chunk: whether it has a record and its bytes on disk (probabilities, canvas pieces) match it."""
        records = self._records()
        values, data = self.read_canvas()
        verified = np.zeros(self.chunks, bool)
        for chunk in np.flatnonzero(records["done"]):
            windows = self.grid.chunk_windows(int(chunk))
            pieces = [(values[at], None if data is None else data[at]) for at in self._spans(int(chunk))]
            verified[chunk] = records["crc"][chunk] == _checksum(
                os.pread(self._fd(PROBABILITIES), len(windows) * self._row_bytes, windows.start * self._row_bytes),
                pieces)
        return verified

    def _spans(self, chunk: int) -> Iterator[tuple[slice, slice]]:
        """Where the canvas pieces of ``chunk`` lie: the canvas pixels of each of its strips (one per row of its
        windows, as the readers read them)."""
        size, rows, cols = self.grid.size, self.canvas.source_rows, self.canvas.source_cols
        corners = [self.grid.corner(window) for window in self.grid.chunk_windows(chunk)]
        for row, in_row in groupby(corners, key=lambda corner: corner[0]):
            lefts = [col for _, col in in_row]
            span = (slice(*np.searchsorted(rows, [row, row + size])),
                    slice(*np.searchsorted(cols, [lefts[0], lefts[-1] + size])))
            if all(part.stop > part.start for part in span):
                yield span

    def classified_on(self) -> dict[str, int]:
        """How many chunks each kind of device classified (their records say), e.g. ``{"cpu": 40, "cuda": 50}``."""
        kinds, counts = np.unique(self._records()["done"], return_counts=True)
        return {DEVICE_KINDS[kind - 1]: int(count) for kind, count in zip(kinds, counts)
                if 0 < kind <= len(DEVICE_KINDS)}

    def _records(self) -> np.ndarray:
        return np.frombuffer(os.pread(self._fd(FLAGS), self.chunks * RECORD.itemsize, 0), RECORD)

    def _fd(self, name: str) -> int:
        with self._lock:
            if name not in self._fds:
                self._fds[name] = os.open(self.folder / name, os.O_RDWR)
            return self._fds[name]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def is_done(self, chunk: int) -> bool:
        """Whether ``chunk`` has a record (:meth:`prepare` cleared those that do not match their bytes)."""
        return os.pread(self._fd(FLAGS), 4, chunk * RECORD.itemsize) != bytes(4)

    def write_chunk(self, chunk: int, probabilities: np.ndarray, pieces: Sequence[CanvasPiece]) -> int:
        """Store the probabilities of ``chunk``'s windows and its pieces of the preview's canvas; its record follows
        at the next :meth:`commit` (this one, when one is due): the records written now."""
        payload = np.ascontiguousarray(probabilities, np.float32).tobytes()
        with disk_full_named(self.folder / PROBABILITIES):
            _write_all(self._fd(PROBABILITIES), payload, self.grid.chunk_windows(chunk).start * self._row_bytes)
            for piece in pieces:
                self._write_piece(piece)
        with self._lock:
            self._pending.append((chunk, _checksum(payload, [(piece.values, piece.data) for piece in pieces])))
        return self.commit() if time.monotonic() - self._committed >= COMMIT_SECONDS else 0

    def commit(self) -> int:
        """Write the records of the chunks stored since the last commit, once their bytes are on the disk (one
        ``fdatasync`` of each file written); how many."""
        with self._lock:
            pending, self._pending, self._committed = self._pending, [], time.monotonic()
            written = [fd for name, fd in self._fds.items() if name != FLAGS]
        if pending:
            with disk_full_named(self.folder / FLAGS):
                for fd in written:
                    _sync(fd)
                for chunk, crc in pending:
                    _write_all(self._fd(FLAGS), np.array((self._kind, crc), RECORD).tobytes(), chunk * RECORD.itemsize)
        return len(pending)

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


def _checksum(payload: bytes, pieces: Iterable[tuple[np.ndarray, np.ndarray | None]]) -> int:
    """The CRC-32 of a chunk's probabilities and its canvas pieces (samples, and data flags where masked)."""
    crc = zlib.crc32(payload)
    for values, data in pieces:
        crc = zlib.crc32(np.ascontiguousarray(values).tobytes(), crc)
        if data is not None:
            crc = zlib.crc32(np.ascontiguousarray(data, np.uint8).tobytes(), crc)
    return crc


def _listed(chunks: Sequence[int]) -> str:
    """``chunks`` (ascending) as runs: 3, 7-9, 12."""
    runs: list[list[int]] = []
    for chunk in map(int, chunks):
        if runs and chunk == runs[-1][-1] + 1:
            runs[-1][1:] = [chunk]
        else:
            runs.append([chunk])
    return ", ".join("-".join(map(str, run)) for run in runs)


def _write_all(fd: int, payload: bytes, offset: int) -> None:
    view = memoryview(payload)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
