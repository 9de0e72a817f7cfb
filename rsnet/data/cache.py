"""Decode-once image stores: in memory, memory-mapped on disk, or lazy (decode on every access).

All decoded images of one file list live in ONE uint8 array of shape (N, S, S, 3). The train and test
datasets are index views into the same store, so nothing is copied per split or per loader worker:

- ``memory``: a plain numpy array. DataLoader workers started by ``fork`` (the Linux default) see the
  parent's pages copy-on-write and never write them, so no copy is made. If the store is pickled to a
  process started by ``spawn``/``forkserver``, the array is moved once into torch shared memory and
  the workers map that segment.
- ``disk``: a ``.npy`` file under ``cache_dir`` opened with ``mmap_mode="r"``; every process maps the
  same file, the OS page cache holds it once, and a later run skips decoding. The file name carries
  a hash of (dataset, size, high-bit-depth rescaling, relative file list with sizes and mtimes); it is
  written under a temporary name and renamed into place (atomic), with a JSON sidecar written last as
  the completion marker. The sidecar holds a CRC-32 of the pixels, checked before the cache is reused.
- ``none``: no cache; every access decodes the file (the classic ImageFolder path). The files are
  still decoded once up front to find every undecodable one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from .decode import DEFAULT_HIGH_BIT_DEPTH, PERCENTILES, RESAMPLE, DecodeReport, check_high_bit_depth, decode_image
from rsnet.files import DiskFullError, atomic_write

from .errors import CorruptImageError

__all__ = [
    "CACHE_MODES",
    "CACHE_VERSION",
    "ImageStore",
    "build_store",
    "cache_key",
    "decode_into",
    "default_cache_dir",
]

log = logging.getLogger(__name__)

CACHE_MODES = ("memory", "disk", "none")
CACHE_VERSION = 2  # 2: high-bit-depth images are rescaled (were clipped), checksum in the sidecar
_CHECKSUM_CHUNK = 64 << 20  # bytes hashed per step, so a memory-mapped cache is read in pieces


def default_cache_dir() -> Path:
    """``$RSNET_CACHE_DIR`` if set, else ``~/.cache/rsnet``."""
    env = os.environ.get("RSNET_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rsnet"


def decode_into(
    out: np.ndarray,
    paths: Sequence[str],
    size: int,
    num_threads: int | None = None,
    high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH,
    report: DecodeReport | None = None,
) -> dict[int, str]:
    """Decode ``paths[i]`` into ``out[i]`` with a thread pool (PIL releases the GIL while decoding).

    Every file is tried. Returns ``{i: reason}`` for the files that could not be decoded (their rows
    are zero); files rescaled from high bit depth are recorded in ``report``.
    """
    threads = num_threads or min(8, (os.cpu_count() or 1) + 1)

    def work(i: int) -> tuple[int, str] | None:
        try:
            out[i] = decode_image(paths[i], size, high_bit_depth, report)  # module-level: tests may patch it
            return None
        except CorruptImageError as exc:
            out[i] = 0
            return i, exc.reason or "undecodable"

    if threads <= 1 or len(paths) < 16:
        results = [work(i) for i in range(len(paths))]
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            results = list(pool.map(work, range(len(paths))))
    return dict(r for r in results if r is not None)


def cache_key(dataset: str, size: int, keys: Sequence[str], paths: Sequence[str],
              high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH) -> str:
    """Hash of what determines the decoded array: dataset, size, rescaling, file list (with sizes/mtimes)."""
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_VERSION, dataset, int(size), str(RESAMPLE), high_bit_depth, PERCENTILES]).encode())
    for key, path in zip(keys, paths):
        st = os.stat(path)
        h.update(f"\n{key}\t{st.st_size}\t{int(st.st_mtime)}".encode())
    return h.hexdigest()[:20]


def _checksum(array: np.ndarray) -> str:
    """CRC-32 of the array's bytes, read in chunks (``"crc32:xxxxxxxx"``); detects changed pixels."""
    row_bytes = max(1, array[0].nbytes) if len(array) else 1
    step = max(1, _CHECKSUM_CHUNK // row_bytes)
    crc = 0
    for start in range(0, len(array), step):
        crc = zlib.crc32(np.ascontiguousarray(array[start:start + step]), crc)
    return f"crc32:{crc:08x}"


class ImageStore:
    """Decoded images of one ordered file list. ``store[i]`` → uint8 H×W×3 (a view, never a copy).

    Attributes:
        paths: absolute file paths, in row order.
        size: side of the stored images.
        mode: "memory", "disk" or "none".
        array: the (N, S, S, 3) uint8 array (``None`` for mode "none").
        cache_path: the ``.npy`` file for mode "disk".
        corrupt: row indices whose file could not be decoded (rows are zero).
        decoded: number of images decoded while building this store (0 when the disk cache was reused).
        high_bit_depth: how 16-bit/float files are rescaled (see :func:`decode_image`).
        rescaled: row -> source pixel format of the files rescaled from 16-bit or float pixels.
    """

    def __init__(
        self,
        paths: Sequence[str],
        size: int,
        mode: str,
        array: np.ndarray | None = None,
        cache_path: Path | None = None,
        corrupt: Sequence[int] = (),
        decoded: int = 0,
        high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH,
        rescaled: dict[int, str] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.size = int(size)
        self.mode = mode
        self.array = array
        self.cache_path = cache_path
        self.corrupt = list(corrupt)
        self.decoded = decoded
        self.high_bit_depth = high_bit_depth
        self.rescaled = dict(rescaled or {})
        self._shared = None  # torch tensor in shared memory, created on first spawn-pickle

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        if self.array is None:
            return decode_image(self.paths[i], self.size, self.high_bit_depth)
        return self.array[i]

    @property
    def nbytes(self) -> int:
        return len(self.paths) * self.size * self.size * 3

    # -- pickling for spawn/forkserver workers: share, don't copy ------------------------------
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if self.mode == "disk":
            state["array"] = None  # reopened from the file (same page cache) in the child
        elif self.mode == "memory" and self.array is not None:
            import torch

            if self._shared is None:
                t = torch.from_numpy(np.ascontiguousarray(self.array))
                t.share_memory_()  # one move into shared memory; the old buffer is then released
                self._shared = t
                self.array = t.numpy()
            state["array"] = None
            state["_shared"] = self._shared
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.mode == "disk" and self.cache_path is not None:
            self.array = np.load(self.cache_path, mmap_mode="r")
        elif self.mode == "memory" and self._shared is not None:
            self.array = self._shared.numpy()


def build_store(
    dataset: str,
    keys: Sequence[str],
    paths: Sequence[str],
    size: int,
    mode: str = "memory",
    cache_dir: str | os.PathLike | None = None,
    skip_corrupt: bool = False,
    num_threads: int | None = None,
    high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH,
) -> ImageStore:
    """Decode (or reuse) the images of ``paths`` at ``size`` px.

    Every file is decoded once up front, also for mode "none" (which keeps no pixels), so all
    undecodable files are found in one pass.

    Args:
        dataset: dataset name (part of the disk-cache key and file name).
        keys: relative file names ("<class>/<file>"), parallel to ``paths``; part of the key.
        paths: absolute file paths.
        size: working size in pixels.
        mode: "memory" | "disk" | "none".
        cache_dir: folder of the disk cache (default :func:`default_cache_dir`).
        skip_corrupt: record undecodable files in ``store.corrupt`` instead of raising.
        num_threads: decoding threads.
        high_bit_depth: rescaling of 16-bit/float files (:data:`HIGH_BIT_DEPTH_MODES`).

    Raises:
        CorruptImageError: undecodable files (all of them, in one message) unless ``skip_corrupt``.
        ValueError: unknown mode or ``high_bit_depth``; unusable ``cache_dir``.
    """
    if mode not in CACHE_MODES:
        raise ValueError(f"dataset.cache must be one of {CACHE_MODES}, got {mode!r}")
    check_high_bit_depth(high_bit_depth)
    if mode == "disk":
        return _disk_store(dataset, keys, paths, size, cache_dir, skip_corrupt, num_threads, high_bit_depth)
    t0 = time.perf_counter()
    n = len(paths)
    report = DecodeReport()
    if mode == "none":  # decode once in chunks to find bad files; nothing is kept
        array = None
        scratch = np.empty((min(n, 64), size, size, 3), np.uint8)
        corrupt: dict[int, str] = {}
        for start in range(0, n, len(scratch)):
            chunk = paths[start : start + len(scratch)]
            bad = decode_into(scratch[: len(chunk)], chunk, size, num_threads, high_bit_depth, report)
            corrupt.update((start + i, why) for i, why in bad.items())
    else:
        array = np.empty((n, size, size, 3), np.uint8)
        corrupt = decode_into(array, paths, size, num_threads, high_bit_depth, report)
        log.info("decoded %d images at %d px into memory (%.1f MB) in %.1f s",
                 n, size, array.nbytes / 1e6, time.perf_counter() - t0)
    _raise_unless_skipped(paths, corrupt, skip_corrupt)
    return ImageStore(paths, size, mode, array, corrupt=sorted(corrupt), decoded=n,
                      high_bit_depth=high_bit_depth, rescaled=_rescaled_rows(paths, report))


def _raise_unless_skipped(paths: Sequence[str], corrupt: dict[int, str], skip_corrupt: bool) -> None:
    """One :class:`CorruptImageError` naming every undecodable file, unless they are to be skipped."""
    if corrupt and not skip_corrupt:
        rows = sorted(corrupt)
        raise CorruptImageError([paths[i] for i in rows], corrupt[rows[0]])


def _rescaled_rows(paths: Sequence[str], report: DecodeReport) -> dict[int, str]:
    return {i: report.rescaled[p] for i, p in enumerate(paths) if p in report.rescaled}


def _cache_folder(cache_dir: str | os.PathLike | None) -> tuple[Path, str]:
    """The disk-cache folder, created if missing, and the setting it came from (for messages).

    Raises:
        ValueError: the path is a file, or the folder cannot be created.
    """
    if cache_dir:
        folder, setting = Path(cache_dir).expanduser(), "dataset.cache_dir"
    else:
        folder = default_cache_dir()
        setting = "$RSNET_CACHE_DIR" if os.environ.get("RSNET_CACHE_DIR") else "dataset.cache_dir (default)"
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{setting} '{folder}' is a file, not a folder: point {setting} at a folder "
                         "(it is created if missing), or set dataset.cache=memory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{setting} '{folder}' cannot be created ({exc.strerror or exc}): point {setting} "
                         "at a writable folder, or set dataset.cache=memory") from exc
    return folder, setting


def _reuse(npy: Path, meta_path: Path, keys: Sequence[str], shape: tuple[int, ...]) -> tuple[np.ndarray, dict] | None:
    """The cached array and its sidecar when both exist, match the file list and pass the checksum."""
    if not (npy.exists() and meta_path.exists()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        array = np.load(npy, mmap_mode="r")
    except (OSError, ValueError) as exc:
        log.warning("disk cache %s is unreadable (%s); rebuilding", npy, exc)
        return None
    if array.shape != shape or meta.get("keys") != list(keys):
        log.warning("disk cache %s does not match the file list; rebuilding", npy)
        return None
    if meta.get("checksum") != _checksum(array):
        log.warning("disk cache %s does not match the checksum written with it (its pixels changed); rebuilding", npy)
        return None
    return array, meta


def _reserve(tmp: Path, npy: Path) -> None:
    """Allocate the whole cache file now: a sparse file on a full disk would kill the run (SIGBUS) mid-decode
    instead of raising :class:`DiskFullError` here."""
    with open(tmp, "r+b") as handle:
        try:
            os.posix_fallocate(handle.fileno(), 0, tmp.stat().st_size)
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise DiskFullError(npy) from error
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # file systems without fallocate: go on
                raise


def _disk_store(dataset: str, keys: Sequence[str], paths: Sequence[str], size: int,
                cache_dir: str | os.PathLike | None, skip_corrupt: bool, num_threads: int | None,
                high_bit_depth: str) -> ImageStore:
    """Reuse or write ``<cache_dir>/<dataset>_<size>px_n<N>_<key>.npy`` (see the module docstring)."""
    n = len(paths)
    shape = (n, size, size, 3)
    folder, setting = _cache_folder(cache_dir)
    npy = folder / f"{dataset}_{size}px_n{n}_{cache_key(dataset, size, keys, paths, high_bit_depth)}.npy"
    meta_path = npy.with_suffix(".json")
    reused = _reuse(npy, meta_path, keys, shape)
    if reused is not None:
        array, meta = reused
        corrupt = {int(i): f"recorded as undecodable when the disk cache '{npy}' was written"
                   for i in meta.get("corrupt", [])}
        _raise_unless_skipped(paths, corrupt, skip_corrupt)
        log.info("reusing disk cache %s", npy)
        return ImageStore(paths, size, "disk", array, npy, corrupt=sorted(corrupt), decoded=0,
                          high_bit_depth=high_bit_depth,
                          rescaled={int(i): src for i, src in meta.get("rescaled", [])})

    t0 = time.perf_counter()
    report = DecodeReport()
    tmp = npy.with_name(f".{npy.name}.tmp-{os.getpid()}")
    try:
        try:
            mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        except OSError as exc:
            raise ValueError(f"cannot write the disk cache in {setting} '{folder}' ({exc.strerror or exc}; "
                             f"{n * size * size * 3 / 1e6:.0f} MB needed): point {setting} at a writable "
                             "folder, or set dataset.cache=memory") from exc
        _reserve(tmp, npy)
        corrupt = decode_into(mm, paths, size, num_threads, high_bit_depth, report)
        digest = _checksum(mm)
        mm.flush()
        del mm
        os.replace(tmp, npy)
    finally:
        if tmp.exists():
            tmp.unlink()
    rescaled = _rescaled_rows(paths, report)
    meta = {"version": CACHE_VERSION, "dataset": dataset, "size": size, "high_bit_depth": high_bit_depth,
            "keys": list(keys), "corrupt": sorted(corrupt), "rescaled": sorted(rescaled.items()),
            "checksum": digest, "created": time.time()}
    with atomic_write(meta_path, "w") as handle:  # the sidecar is the completion marker
        handle.write(json.dumps(meta))
    log.info("decoded %d images at %d px into disk cache %s (%.1f MB) in %.1f s",
             n, size, npy, n * size * size * 3 / 1e6, time.perf_counter() - t0)
    _raise_unless_skipped(paths, corrupt, skip_corrupt)  # the cache is kept: a rerun that skips them reuses it
    array = np.load(npy, mmap_mode="r")
    return ImageStore(paths, size, "disk", array, npy, corrupt=sorted(corrupt), decoded=n,
                      high_bit_depth=high_bit_depth, rescaled=rescaled)
