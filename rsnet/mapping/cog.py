"""Cloud-Optimised GeoTIFFs written from a stream of row blocks: the rows are staged into a hidden tiled GeoTIFF
(memory bounded by a strip of tiles, whatever the raster's size), GDAL's COG driver copies it with internal overviews,
and the file is read back and checked against the rows given (GDAL does not raise on a failed write: a full disk)."""

from __future__ import annotations

import hashlib
import os
import secrets
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.shutil
from rasterio.errors import NotGeoreferencedWarning
from rasterio.transform import Affine
from rasterio.windows import Window

from rsnet.data.native_messages import held_messages
from rsnet.data.raster import open_raster
from rsnet.files import DiskFullError

__all__ = ["RasterLayout", "read_blocks", "write_cog"]

RESAMPLINGS = ("average", "mode", "nearest")  # overview resamplings a map's layout may ask for


@dataclass(frozen=True)
class RasterLayout:
    """What a COG holds: ``height`` × ``width`` pixels of ``count`` bands of ``dtype`` (``nodata``: the value of an
    empty pixel, NaN allowed for floats), where (``crs``, None for a scene without coordinates, and ``transform``),
    its overviews' ``resampling`` ("mode" for class maps, "average" for probabilities: nodata is left out of both),
    the bands' descriptions, the dataset's tags, band 1's colour table and the tile side ``blocksize`` (a multiple
    of 16)."""

    height: int
    width: int
    count: int
    dtype: str
    nodata: float | int | None
    crs: Any
    transform: Affine
    resampling: str
    band_descriptions: Sequence[str] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    colormap: Mapping[int, tuple[int, int, int, int]] | None = None
    blocksize: int = 512

    def __post_init__(self) -> None:
        if self.resampling not in RESAMPLINGS:
            raise ValueError(f"resampling={self.resampling!r}: overviews are resampled by one of {list(RESAMPLINGS)}")
        if self.blocksize < 16 or self.blocksize % 16:
            raise ValueError(f"blocksize={self.blocksize}: a COG's tiles are a multiple of 16 pixels a side")
        if self.band_descriptions and len(self.band_descriptions) != self.count:
            raise ValueError(f"{len(self.band_descriptions)} band descriptions for {self.count} bands")


class _WriteFailed(Exception):
    """GDAL raised while writing or reading back a map file (its message is among the messages held)."""


def write_cog(path: Path, blocks: Iterable[np.ndarray], layout: RasterLayout, error_name: Path | None = None) -> None:
    """Write ``blocks`` (``layout.count`` × rows × ``layout.width`` arrays of ``layout.dtype`` from the top of the
    raster down, any number of rows each, ``layout.height`` in all) as a Cloud-Optimised GeoTIFF at ``path``
    (replaced: write to a temporary name and move it into place to keep a previous version; deflate, tiles of
    ``layout.blocksize``, overviews until one fits a tile), then read it back: a file that does not hold those
    pixels is removed and DiskFullError (a full disk) or ValueError, naming ``error_name`` (the final name) or
    ``path``. An error the blocks raise passes through as it is. Memory is bounded by a block and a strip of tiles;
    the same pixels give the same bytes."""
    path = Path(path)
    name = Path(error_name or path)
    staging = path.with_name(f".{path.name.lstrip('.')}.{secrets.token_hex(6)}.staging.tif")  # hidden, beside it
    messages: list[str] = []
    copied = False
    try:
        expected = _stage(staging, blocks, layout, messages)
        copied = True
        with _gdal(messages):
            rasterio.shutil.copy(staging, path, driver="COG", **_cog_options(layout))
        with _gdal(messages):
            complete = _digest(read_blocks(path, layout.blocksize)) == expected
    except _WriteFailed:
        complete = False
    finally:
        staging.unlink(missing_ok=True)
    if not complete:
        if copied and not path.is_dir():
            path.unlink(missing_ok=True)
        raise _write_failed(name, messages)


def read_blocks(path: Path, rows_per_block: int) -> Iterator[np.ndarray]:
    """The pixels of the raster at ``path``, bands × rows × columns blocks of ``rows_per_block`` rows from the top
    (the last may be shorter)."""
    with open_raster(path) as src:
        for top in range(0, src.height, rows_per_block):
            yield src.read(window=Window(0, top, src.width, min(rows_per_block, src.height - top)))


def _cog_options(layout: RasterLayout) -> dict[str, str | int]:
    """The COG driver's creation options: deflate, the floating-point predictor for floats (probabilities: a third
    smaller) and none for integers (a class map: the standard one makes it larger), overviews computed afresh from
    the full resolution, BigTIFF when the file might pass 4 GB."""
    return dict(BLOCKSIZE=layout.blocksize, COMPRESS="DEFLATE",
                PREDICTOR="FLOATING_POINT" if np.dtype(layout.dtype).kind == "f" else "NO",
                OVERVIEWS="IGNORE_EXISTING", OVERVIEW_RESAMPLING=layout.resampling.upper(), BIGTIFF="IF_SAFER")


def _stage(staging: Path, blocks: Iterable[np.ndarray], layout: RasterLayout, messages: list[str]) -> str:
    """Write ``blocks`` into a tiled GeoTIFF at ``staging`` (fast deflate), a strip of tiles at a time; the digest
    of the pixels written (:func:`_digest`). The blocks are drawn outside GDAL's message capture, so the code that
    makes them prints and raises as usual."""
    profile = dict(driver="GTiff", height=layout.height, width=layout.width, count=layout.count, dtype=layout.dtype,
                   nodata=layout.nodata, crs=layout.crs, transform=layout.transform, tiled=True,
                   blockxsize=layout.blocksize, blockysize=layout.blocksize, compress="deflate", zlevel=1,
                   bigtiff="IF_SAFER")
    digest = hashlib.sha256()
    with _gdal(messages), warnings.catch_warnings():
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        dst = rasterio.open(staging, "w", **profile)
    try:
        with _gdal(messages):
            _describe(dst, layout)
        for top, strip in _strips(blocks, layout):
            _hash_rows(digest, strip)
            with _gdal(messages):
                dst.write(strip, window=Window(0, top, layout.width, strip.shape[1]))
    finally:
        with _gdal(messages):
            dst.close()
    return digest.hexdigest()


def _describe(dst: Any, layout: RasterLayout) -> None:
    """The colour table (before any pixel: it makes the file a palette image), band descriptions and tags."""
    if layout.colormap is not None:
        dst.write_colormap(1, dict(layout.colormap))
    for band, description in enumerate(layout.band_descriptions, start=1):
        dst.set_band_description(band, description)
    if layout.tags:
        dst.update_tags(**layout.tags)


def _strips(blocks: Iterable[np.ndarray], layout: RasterLayout) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, pixels) of ``blocks`` regrouped into strips of ``layout.blocksize`` rows (whole tiles; the last
    strip may be shorter), in one reused buffer; ValueError for a block of another shape or type, or rows that do
    not add up to ``layout.height``."""
    strip = np.empty((layout.count, layout.blocksize, layout.width), layout.dtype)
    top = filled = 0
    for block in blocks:
        _check_block(block, layout, top + filled)
        start = 0
        while start < block.shape[1]:
            take = min(layout.blocksize - filled, block.shape[1] - start)
            strip[:, filled:filled + take] = block[:, start:start + take]
            filled, start = filled + take, start + take
            if filled == layout.blocksize:
                yield top, strip
                top, filled = top + filled, 0
    if top + filled != layout.height:
        raise ValueError(f"the blocks hold {top + filled} rows and the raster {layout.height}")
    if filled:
        yield top, strip[:, :filled]


def _check_block(block: np.ndarray, layout: RasterLayout, row: int) -> None:
    """ValueError unless ``block`` is bands × rows × columns of the layout, not past its last row."""
    expected = (layout.count, layout.width)
    if block.ndim != 3 or (block.shape[0], block.shape[2]) != expected or block.dtype != np.dtype(layout.dtype):
        raise ValueError(f"a block of shape {block.shape} and type {block.dtype} at row {row}: blocks must be "
                         f"({layout.count}, rows, {layout.width}) arrays of {layout.dtype}")
    if row + block.shape[1] > layout.height:
        raise ValueError(f"the blocks hold more rows than the raster's {layout.height}")


def _hash_rows(digest: Any, strip: np.ndarray) -> None:
    """Feed ``strip`` to ``digest`` row by row (every band of a row, then the next row: the same stream whatever the
    strips' heights), without copying it."""
    for row in range(strip.shape[1]):
        for band in strip[:, row]:
            digest.update(np.ascontiguousarray(band))


def _digest(strips: Iterable[np.ndarray]) -> str:
    """The SHA-256 of the pixels of ``strips``, from the top, as :func:`_stage` computes it."""
    digest = hashlib.sha256()
    for strip in strips:
        _hash_rows(digest, strip)
    return digest.hexdigest()


@contextmanager
def _gdal(messages: list[str]) -> Iterator[None]:
    """Inside, GDAL's and libtiff's messages are appended to ``messages`` instead of printed, and an error GDAL raises
    is recorded there and becomes :class:`_WriteFailed`."""
    held: list[str] = []
    try:
        with held_messages() as held:
            yield
    except Exception as error:  # noqa: BLE001 - only GDAL's calls run inside; rasterio's errors for them vary
        messages.extend(held)
        messages.append(str(error))
        raise _WriteFailed from error
    messages.extend(held)


def _write_failed(path: Path, messages: Sequence[str]) -> OSError | ValueError:
    """The error for a map file that GDAL did not write whole: DiskFullError when its folder's file system is full."""
    said = next((" ".join(message.split()) for message in messages), "the file read back differs")
    if any("No space left on device" in message for message in messages) or _no_space(path.parent):
        return DiskFullError(path)
    return ValueError(f"cannot write {path}: GDAL did not write it whole ({said}); check that folder (free space, "
                      "quota, file system); its previous version, if any, is intact")


def _no_space(folder: Path) -> bool:
    """Whether the file system of ``folder`` has no block left for an ordinary user."""
    try:
        return os.statvfs(folder).f_bavail == 0
    except (OSError, AttributeError):  # no statvfs (Windows)
        return False
