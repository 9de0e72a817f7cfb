"""Building an :class:`~rsnet.data.store.ImageStore`: every file is decoded once into memory, a memory-mapped ``.npy``
disk cache (reused, CRC-32 checked) or nowhere (``none``: only to find undecodable files)."""

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

from rsnet.files import DiskFullError, write_json

from .decode import (DEFAULT_HIGH_BIT_DEPTH, PERCENTILES, RESAMPLE, DecodeReport, Decoding, check_decoding,
                     decode_image, pixel_layout)
from .raster import Bands
from .errors import CorruptImageError
from .store import ImageStore

__all__ = ["CACHE_MODES", "CACHE_VERSION", "build_store", "cache_key", "decode_into", "default_cache_dir"]

log = logging.getLogger(__name__)

CACHE_MODES = ("memory", "disk", "none")
CACHE_VERSION = 2  # part of the cache key and the sidecar: bump it when the same files would decode differently
_CHECKSUM_CHUNK = 64 << 20  # bytes hashed per step, so a memory-mapped cache is read in pieces
_CHECK_CHUNK = 64  # images decoded at a time by mode "none", which keeps none of them


def default_cache_dir() -> Path:
    """``$RSNET_CACHE_DIR`` if set, else ``~/.cache/rsnet``."""
    env = os.environ.get("RSNET_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rsnet"


def decode_into(out: np.ndarray, paths: Sequence[str], size: int, decoding: Decoding = DEFAULT_HIGH_BIT_DEPTH,
                report: DecodeReport | None = None) -> dict[int, str]:
    """Decode ``paths[i]`` into ``out[i]`` with a thread pool (PIL releases the GIL while decoding); returns
    ``{i: reason}`` for the undecodable files (their rows are zero)."""
    threads = min(8, (os.cpu_count() or 1) + 1)

    def work(i: int) -> tuple[int, str] | None:
        try:
            out[i] = decode_image(paths[i], size, decoding, report)  # module-level: tests may patch it
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


def cache_key(dataset: str, size: int, names: Sequence[str], paths: Sequence[str],
              decoding: Decoding = DEFAULT_HIGH_BIT_DEPTH) -> str:
    """Hash of what determines the decoded array: dataset, size, rescaling, file list (with sizes/mtimes)."""
    h = hashlib.sha256()
    how = decoding.to_metadata() if isinstance(decoding, Bands) else decoding  # an RGB set keeps its earlier key
    h.update(json.dumps([CACHE_VERSION, dataset, int(size), str(RESAMPLE), how, PERCENTILES]).encode())
    for name, path in zip(names, paths):
        st = os.stat(path)
        h.update(f"\n{name}\t{st.st_size}\t{int(st.st_mtime)}".encode())
    return h.hexdigest()[:20]


def build_store(dataset: str, names: Sequence[str], paths: Sequence[str], size: int, mode: str = "memory",
                cache_dir: str | os.PathLike | None = None, skip_corrupt: bool = False,
                decoding: Decoding = DEFAULT_HIGH_BIT_DEPTH) -> ImageStore:
    """Decode (or reuse) the images of ``paths`` (``names``: part of the disk-cache key); all undecodable files are
    raised as one CorruptImageError unless ``skip_corrupt`` (then in ``store.corrupt``)."""
    if mode not in CACHE_MODES:
        raise ValueError(f"dataset.cache must be one of {CACHE_MODES}, got {mode!r}")
    check_decoding(decoding)
    if mode == "disk":
        return _disk_store(dataset, names, paths, size, cache_dir, skip_corrupt, decoding)
    if mode == "memory":
        return _memory_store(paths, size, skip_corrupt, decoding)
    return _uncached_store(paths, size, skip_corrupt, decoding)


def _memory_store(paths: Sequence[str], size: int, skip_corrupt: bool, decoding: Decoding) -> ImageStore:
    """Mode "memory": every image decoded into one array in RAM."""
    started = time.perf_counter()
    report = DecodeReport()
    shape, dtype = _array_layout(len(paths), size, decoding)
    _check_memory_for(shape, dtype)
    array = np.empty(shape, dtype)
    corrupt = decode_into(array, paths, size, decoding, report)
    log.info("decoded %d images at %d px into memory (%.1f MB) in %.1f s",
             len(paths), size, array.nbytes / 1e6, time.perf_counter() - started)
    _raise_unless_skipped(paths, corrupt, skip_corrupt)
    return ImageStore(paths, size, "memory", array, corrupt=sorted(corrupt), decoded=len(paths),
                      decoding=decoding, rescaled=_rescaled_rows(paths, report))


def _array_layout(count: int, size: int, decoding: Decoding) -> tuple[tuple[int, int, int, int], np.dtype]:
    """Shape and sample type of the array of ``count`` decoded images: (N, S, S, 3) uint8 for RGB pictures, (N, S,
    S, bands) in the files' own sample type for a multispectral dataset."""
    channels, dtype = pixel_layout(decoding)
    return (count, size, size, channels), dtype


def _check_memory_for(shape: tuple[int, ...], dtype: np.dtype) -> None:
    """Refuse a memory cache of ``shape`` that the machine's available memory cannot hold, before anything is
    decoded (numpy would fail on the allocation with a traceback)."""
    count, size = shape[0], shape[1]
    needed = int(np.prod(shape)) * dtype.itemsize
    available = available_memory()
    if available is not None and needed > available:
        raise ValueError(f"dataset.cache=memory: {count} images at {size} px need {_binary_size(needed)} and this "
                         f"machine has {_binary_size(available)} available; lower dataset.image_size, or set "
                         "dataset.cache=disk (a memory-mapped file) or dataset.cache=none (decoded every epoch)")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux: MemAvailable; elsewhere the free pages), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _binary_size(nbytes: float) -> str:
    """``nbytes`` in the largest binary unit that keeps it at least 1: "78.8 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"


def _uncached_store(paths: Sequence[str], size: int, skip_corrupt: bool, decoding: Decoding) -> ImageStore:
    """Mode "none": every image decoded once, a chunk at a time, only to find the undecodable ones."""
    report = DecodeReport()
    shape, dtype = _array_layout(min(len(paths), _CHECK_CHUNK), size, decoding)
    scratch = np.empty(shape, dtype)
    corrupt: dict[int, str] = {}
    for start in range(0, len(paths), len(scratch)):
        chunk = paths[start : start + len(scratch)]
        bad = decode_into(scratch[: len(chunk)], chunk, size, decoding, report)
        corrupt.update((start + i, why) for i, why in bad.items())
    _raise_unless_skipped(paths, corrupt, skip_corrupt)
    return ImageStore(paths, size, "none", None, corrupt=sorted(corrupt), decoded=len(paths),
                      decoding=decoding, rescaled=_rescaled_rows(paths, report))


def _raise_unless_skipped(paths: Sequence[str], corrupt: dict[int, str], skip_corrupt: bool) -> None:
    """One :class:`CorruptImageError` naming every undecodable file, unless they are to be skipped."""
    if corrupt and not skip_corrupt:
        rows = sorted(corrupt)
        raise CorruptImageError([paths[i] for i in rows], corrupt[rows[0]])


def _rescaled_rows(paths: Sequence[str], report: DecodeReport) -> dict[int, str]:
    return {i: report.rescaled[p] for i, p in enumerate(paths) if p in report.rescaled}


def _disk_store(dataset: str, names: Sequence[str], paths: Sequence[str], size: int,
                cache_dir: str | os.PathLike | None, skip_corrupt: bool, decoding: Decoding) -> ImageStore:
    """Mode "disk": reuse or write ``<cache_dir>/<dataset>_<size>px_n<N>_<key>.npy`` (docs/data.md)."""
    n = len(paths)
    folder, setting = _cache_folder(cache_dir)
    npy = folder / f"{dataset}_{size}px_n{n}_{cache_key(dataset, size, names, paths, decoding)}.npy"
    reused = _reuse(npy, names, *_array_layout(n, size, decoding))
    if reused is not None:
        array, meta = reused
        corrupt = {int(i): f"recorded as undecodable when the disk cache '{npy}' was written"
                   for i in meta.get("corrupt", [])}
        _raise_unless_skipped(paths, corrupt, skip_corrupt)
        log.info("reusing disk cache %s", npy)
        return ImageStore(paths, size, "disk", array, npy, corrupt=sorted(corrupt), decoded=0,
                          decoding=decoding,
                          rescaled={int(i): src for i, src in meta.get("rescaled", [])})
    corrupt, rescaled = _write_cache(npy, setting, dataset, names, paths, size, decoding)
    _raise_unless_skipped(paths, corrupt, skip_corrupt)  # the cache is kept: a rerun that skips them reuses it
    return ImageStore(paths, size, "disk", np.load(npy, mmap_mode="r"), npy, corrupt=sorted(corrupt), decoded=n,
                      decoding=decoding, rescaled=rescaled)


def _cache_folder(cache_dir: str | os.PathLike | None) -> tuple[Path, str]:
    """The disk-cache folder, created if missing, and the setting it came from (for messages)."""
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


def _checksum(array: np.ndarray) -> str:
    """CRC-32 of the array's bytes, read in chunks (``"crc32:xxxxxxxx"``); detects changed pixels."""
    row_bytes = max(1, array[0].nbytes) if len(array) else 1
    step = max(1, _CHECKSUM_CHUNK // row_bytes)
    crc = 0
    for start in range(0, len(array), step):
        crc = zlib.crc32(np.ascontiguousarray(array[start:start + step]), crc)
    return f"crc32:{crc:08x}"


def _reuse(npy: Path, names: Sequence[str], shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, dict] | None:
    """The cached array and its sidecar when both exist, match the file list and pass the checksum."""
    meta_path = npy.with_suffix(".json")
    if not (npy.exists() and meta_path.exists()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        array = np.load(npy, mmap_mode="r")
    except (OSError, ValueError) as exc:
        log.warning("disk cache %s is unreadable (%s); rebuilding", npy, exc)
        return None
    if array.shape != shape or array.dtype != dtype or meta.get("names") != list(names):
        log.warning("disk cache %s does not match the file list; rebuilding", npy)
        return None
    if meta.get("checksum") != _checksum(array):
        log.warning("disk cache %s does not match the checksum written with it (its pixels changed); rebuilding", npy)
        return None
    return array, meta


def _write_cache(npy: Path, setting: str, dataset: str, names: Sequence[str], paths: Sequence[str], size: int,
                 decoding: Decoding) -> tuple[dict[int, str], dict[int, str]]:
    """Decode every image into ``npy``, then write its sidecar (the completion marker); returns the undecodable
    rows (row -> reason) and the rescaled ones (row -> source pixel format)."""
    started = time.perf_counter()
    report = DecodeReport()
    corrupt, digest = _decode_to_file(npy, setting, paths, size, decoding, report)
    rescaled = _rescaled_rows(paths, report)
    how = {"bands": decoding.to_metadata()} if isinstance(decoding, Bands) else {"high_bit_depth": decoding}
    meta = {"version": CACHE_VERSION, "dataset": dataset, "size": size, **how,
            "names": list(names), "corrupt": sorted(corrupt), "rescaled": sorted(rescaled.items()),
            "checksum": digest, "created": time.time()}
    write_json(npy.with_suffix(".json"), meta)
    log.info("decoded %d images at %d px into disk cache %s (%.1f MB) in %.1f s",
             len(paths), size, npy, npy.stat().st_size / 1e6, time.perf_counter() - started)
    return corrupt, rescaled


def _decode_to_file(npy: Path, setting: str, paths: Sequence[str], size: int, decoding: Decoding,
                    report: DecodeReport) -> tuple[dict[int, str], str]:
    """Decode into a temporary ``.npy`` beside ``npy``, renamed into place once complete; returns the undecodable
    rows (row -> reason) and the pixels' checksum."""
    n = len(paths)
    shape, dtype = _array_layout(n, size, decoding)
    tmp = npy.with_name(f".{npy.name}.tmp-{os.getpid()}")
    try:
        try:
            mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        except OSError as exc:
            raise ValueError(f"cannot write the disk cache in {setting} '{npy.parent}' ({exc.strerror or exc}; "
                             f"{np.prod(shape) * dtype.itemsize / 1e6:.0f} MB needed): point {setting} at a writable "
                             "folder, or set dataset.cache=memory") from exc
        _reserve(tmp, npy)
        corrupt = decode_into(mm, paths, size, decoding, report)
        digest = _checksum(mm)
        mm.flush()
        del mm
        os.replace(tmp, npy)
    finally:
        if tmp.exists():
            tmp.unlink()
    return corrupt, digest


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
