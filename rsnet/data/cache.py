"""Decode-once image stores: in memory, memory-mapped on disk, or lazy (decode on every access).

All decoded images of one file list live in ONE uint8 array of shape (N, S, S, 3). The train and test
datasets are index views into the same store, so nothing is copied per split or per loader worker:

- ``memory``: a plain numpy array. DataLoader workers started by ``fork`` (the Linux default) see the
  parent's pages copy-on-write and never write them, so no copy is made. If the store is pickled to a
  process started by ``spawn``/``forkserver``, the array is moved once into torch shared memory and
  the workers map that segment.
- ``disk``: a ``.npy`` file under ``cache_dir`` opened with ``mmap_mode="r"``; every process maps the
  same file, the OS page cache holds it once, and a later run skips decoding. The file name carries
  a hash of (dataset, size, relative file list with sizes and mtimes); it is written under a temporary
  name and renamed into place (atomic), with a JSON sidecar written last as the completion marker.
- ``none``: no cache; every access decodes the file (the classic ImageFolder path).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from .errors import CorruptImageError

__all__ = [
    "CACHE_MODES",
    "CACHE_VERSION",
    "ImageStore",
    "build_store",
    "cache_key",
    "decode_image",
    "decode_into",
    "default_cache_dir",
]

log = logging.getLogger(__name__)

CACHE_MODES = ("memory", "disk", "none")
CACHE_VERSION = 1
_RESAMPLE = Image.Resampling.BILINEAR


def default_cache_dir() -> Path:
    """``$RSNET_CACHE_DIR`` if set, else ``~/.cache/rsnet``."""
    env = os.environ.get("RSNET_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rsnet"


def decode_image(path: str | os.PathLike, size: int) -> np.ndarray:
    """Decode one image file to uint8 ``size × size × 3`` RGB (resized when needed).

    Raises:
        CorruptImageError: the file cannot be read or decoded (e.g. truncated); names the file.
    """
    try:
        with Image.open(path) as im:
            if im.format == "JPEG":
                im.draft("RGB", (size, size))  # let libjpeg decode at a reduced scale (never below size)
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), _RESAMPLE)
            arr = np.asarray(im, dtype=np.uint8)
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, ... for bad files
        raise CorruptImageError(str(path), exc) from exc
    if arr.shape != (size, size, 3):
        raise CorruptImageError(str(path), ValueError(f"unexpected decoded shape {arr.shape}"))
    return arr


def decode_into(
    out: np.ndarray,
    paths: Sequence[str],
    size: int,
    skip_corrupt: bool = False,
    num_threads: int | None = None,
) -> list[int]:
    """Decode ``paths[i]`` into ``out[i]`` with a thread pool (PIL releases the GIL while decoding).

    Returns the indices of files that could not be decoded (their rows are zero) when
    ``skip_corrupt``; otherwise raises :class:`CorruptImageError` for the first bad file.
    """
    threads = num_threads or min(8, (os.cpu_count() or 1) + 1)
    corrupt: list[int] = []

    def work(i: int) -> int | None:
        try:
            out[i] = decode_image(paths[i], size)  # module-level lookup: tests may monkeypatch it
            return None
        except CorruptImageError:
            if not skip_corrupt:
                raise
            out[i] = 0
            return i

    if threads <= 1 or len(paths) < 16:
        results = [work(i) for i in range(len(paths))]
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            results = list(pool.map(work, range(len(paths)), chunksize=16))
    corrupt = [i for i in results if i is not None]
    return corrupt


def cache_key(dataset: str, size: int, keys: Sequence[str], paths: Sequence[str]) -> str:
    """Hash of what determines the decoded array: dataset, size, file list (with sizes/mtimes)."""
    h = hashlib.sha256()
    h.update(json.dumps([CACHE_VERSION, dataset, int(size), str(_RESAMPLE)]).encode())
    for key, path in zip(keys, paths):
        st = os.stat(path)
        h.update(f"\n{key}\t{st.st_size}\t{int(st.st_mtime)}".encode())
    return h.hexdigest()[:20]


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
    ) -> None:
        self.paths = list(paths)
        self.size = int(size)
        self.mode = mode
        self.array = array
        self.cache_path = cache_path
        self.corrupt = list(corrupt)
        self.decoded = decoded
        self._shared = None  # torch tensor in shared memory, created on first spawn-pickle

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        if self.array is None:
            return decode_image(self.paths[i], self.size)
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
) -> ImageStore:
    """Decode (or reuse) the images of ``paths`` at ``size`` px.

    Args:
        dataset: dataset name (part of the disk-cache key and file name).
        keys: relative file names ("<class>/<file>"), parallel to ``paths``; part of the key.
        paths: absolute file paths.
        size: working size in pixels.
        mode: "memory" | "disk" | "none".
        cache_dir: folder of the disk cache (default :func:`default_cache_dir`).
        skip_corrupt: record undecodable files in ``store.corrupt`` instead of raising.
        num_threads: decoding threads.
    """
    if mode not in CACHE_MODES:
        raise ValueError(f"dataset.cache must be one of {CACHE_MODES}, got {mode!r}")
    n = len(paths)
    if mode == "none":
        corrupt: list[int] = []
        if skip_corrupt:  # the only way to know which files are bad is to decode them once
            scratch = np.empty((min(n, 64), size, size, 3), np.uint8)
            for start in range(0, n, len(scratch)):
                chunk = paths[start : start + len(scratch)]
                bad = decode_into(scratch[: len(chunk)], chunk, size, True, num_threads)
                corrupt += [start + i for i in bad]
        return ImageStore(paths, size, "none", corrupt=corrupt)

    shape = (n, size, size, 3)
    if mode == "memory":
        t0 = time.perf_counter()
        array = np.empty(shape, np.uint8)
        corrupt = decode_into(array, paths, size, skip_corrupt, num_threads)
        log.info("decoded %d images at %d px into memory (%.1f MB) in %.1f s",
                 n, size, array.nbytes / 1e6, time.perf_counter() - t0)
        return ImageStore(paths, size, "memory", array, corrupt=corrupt, decoded=n)

    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = cache_key(dataset, size, keys, paths)
    npy = folder / f"{dataset}_{size}px_n{n}_{key}.npy"
    meta_path = npy.with_suffix(".json")
    if npy.exists() and meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            array = np.load(npy, mmap_mode="r")
            if array.shape == shape and meta.get("keys") == list(keys):
                corrupt = list(meta.get("corrupt", []))
                if corrupt and not skip_corrupt:
                    raise CorruptImageError(paths[corrupt[0]], OSError("recorded as undecodable in the cache"))
                log.info("reusing disk cache %s", npy)
                return ImageStore(paths, size, "disk", array, npy, corrupt=corrupt, decoded=0)
            log.warning("disk cache %s does not match the file list; rebuilding", npy)
        except (OSError, ValueError) as exc:
            if isinstance(exc, CorruptImageError):
                raise
            log.warning("disk cache %s is unreadable (%s); rebuilding", npy, exc)

    t0 = time.perf_counter()
    tmp = npy.with_name(f".{npy.name}.tmp-{os.getpid()}")
    try:
        mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        corrupt = decode_into(mm, paths, size, skip_corrupt, num_threads)
        mm.flush()
        del mm
        os.replace(tmp, npy)
    finally:
        if tmp.exists():
            tmp.unlink()
    meta = {"version": CACHE_VERSION, "dataset": dataset, "size": size, "keys": list(keys),
            "corrupt": corrupt, "created": time.time()}
    tmp_meta = meta_path.with_name(f".{meta_path.name}.tmp-{os.getpid()}")
    tmp_meta.write_text(json.dumps(meta))
    os.replace(tmp_meta, meta_path)  # the sidecar is the completion marker
    log.info("decoded %d images at %d px into disk cache %s (%.1f MB) in %.1f s",
             n, size, npy, n * size * size * 3 / 1e6, time.perf_counter() - t0)
    array = np.load(npy, mmap_mode="r")
    return ImageStore(paths, size, "disk", array, npy, corrupt=corrupt, decoded=n)
