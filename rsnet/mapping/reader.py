"""Windows read from disk and decoded in parallel, ahead of the model: a small pool of reader threads (GDAL and
OpenCV release the GIL), each with its own handle on the raster. A chunk's windows are read as one strip per row of
windows (every block decoded once), then cut and decoded as a file of their pixels would be."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any

import numpy as np
from rasterio.env import get_gdal_config, set_gdal_config
from rasterio.windows import Window

from rsnet.data.decode import decode_window
from rsnet.data.errors import CorruptImageError
from rsnet.data.native_messages import gdal_reason, this_threads_gdal_messages
from rsnet.mapping.imagery import Canvas, CanvasPiece
from rsnet.mapping.plan import ScenePlan, open_scene

if TYPE_CHECKING:
    from rsnet.inference import Predictor


@dataclass
class ChunkPixels:
    """A chunk's decoded windows, (N, image_size, image_size, C), and which of the chunk's windows they are (a window
    mostly over the scene's nodata is not classified)."""

    chunk: int
    images: np.ndarray
    kept: np.ndarray  # bool per window of the chunk
    canvas: list[CanvasPiece]  # the preview's imagery the chunk's strips hold


class ChunkReader:
    """Reads the chunks of one scene on ``threads`` reader threads; :meth:`submit` returns a future of
    :class:`ChunkPixels`."""

    def __init__(self, predictor: Predictor, plan: ScenePlan, canvas: Canvas, threads: int) -> None:
        self.predictor, self.plan, self.canvas = predictor, plan, canvas
        self._local = threading.local()
        self._handles: list[Any] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="rsnet-map-reader")

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for handle in self._handles:
            handle.close()

    def submit(self, chunk: int) -> Future[ChunkPixels]:
        return self._pool.submit(self.read, chunk)

    def read(self, chunk: int) -> ChunkPixels:
        """The decoded windows of ``chunk``."""
        grid, src = self.plan.grid, self._source()
        corners = [grid.corner(w) for w in grid.chunk_windows(chunk)]
        images, kept, pieces = [], [], []
        for row, in_row in groupby(corners, key=lambda corner: corner[0]):
            cols = [col for _, col in in_row]
            strip = self._strip(src, row, cols[0], cols[-1] + grid.size - cols[0])
            window = Window(cols[0], row, strip.shape[2], grid.size)
            mask = src.dataset_mask(window=window) if self.plan.masked else None
            piece = self.canvas.piece(strip, mask, row, cols[0])
            if piece is not None:
                pieces.append(piece)
            for col in cols:
                x = col - cols[0]
                if mask is not None and np.count_nonzero(mask[:, x:x + grid.size]) * 2 < grid.size * grid.size:
                    kept.append(False)
                    continue
                kept.append(True)
                images.append(self._decode(strip[:, :, x:x + grid.size], row, col))
        size = self.predictor.image_size
        stacked = np.stack(images) if images else np.empty((0, size, size, 3), np.uint8)
        return ChunkPixels(chunk, stacked, np.array(kept, bool), pieces)

    def _source(self) -> Any:
        src = getattr(self._local, "src", None)
        if src is None:
            src = self._local.src = open_scene(self.plan.path)
            with self._lock:
                self._handles.append(src)
        return src

    def _strip(self, src: Any, row: int, col: int, width: int) -> np.ndarray:
        with this_threads_gdal_messages() as said:  # GDAL's own words ("Read failed" only points to them)
            try:
                return src.read(list(self.plan.indexes), window=Window(col, row, width, self.plan.grid.size))
            except Exception as error:  # noqa: BLE001 - a damaged block: rasterio's errors vary by driver
                reason = gdal_reason(said) or " ".join(str(error).split())
                raise ValueError(f"cannot read raster {self.plan.path} at pixel ({col}, {row}): {reason}; check "
                                 "the file (e.g. gdalinfo -checksum)") from error

    def _decode(self, samples: np.ndarray, row: int, col: int) -> np.ndarray:
        try:
            return decode_window(np.ascontiguousarray(samples), self.predictor.image_size, self.predictor.decoding,
                                 self.plan.path)
        except CorruptImageError as error:
            raise ValueError(f"cannot map {self.plan.path} at pixel ({col}, {row}): {error.reason}") from error


@contextmanager
def block_cache(plan: ScenePlan, readers: int) -> Iterator[None]:
    """GDAL's block cache held to a strip of window rows and the rows of blocks it touches, per reader, while the
    scene's windows are read: a block that two consecutive strips share is decoded once (with a smaller cache,
    windows that do not line up with the blocks decode them twice: 1.3-1.4x the reading time, measured)."""
    with open_scene(plan.path) as src:
        rows = plan.grid.size + 2 * src.block_shapes[0][0]
        strip = src.width * rows * src.count * max(np.dtype(dtype).itemsize for dtype in src.dtypes)
    with gdal_cache_limit(max(1, readers) * strip):
        yield


@contextmanager
def gdal_cache_limit(size: int) -> Iterator[None]:
    """GDAL's block cache (process-wide; by default 5 % of the RAM) held to ``size`` bytes + 16 MiB: the blocks read
    are decoded once while they are needed, and a scene's blocks do not pile up in memory; restored afterwards."""
    previous = int(get_gdal_config("GDAL_CACHEMAX"))
    set_gdal_config("GDAL_CACHEMAX", min(previous, size + 16 * 2**20))
    try:
        yield
    finally:
        set_gdal_config("GDAL_CACHEMAX", previous)
