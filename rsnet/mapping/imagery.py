"""The scene's imagery for the preview, gathered from the strips the readers decode anyway (a second pass over a
large scene would decode every block again): the canvas samples the scene at fixed points, the centre of each of
its pixels, so any strip that holds a point gives it the same value, whichever worker read it and in what order."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

PREVIEW_PIXELS = 900  # the canvas: at most this many pixels a side, as the preview's figure draws it


@dataclass(frozen=True)
class Canvas:
    """A ``height`` × ``width`` scene sampled on at most :data:`PREVIEW_PIXELS` a side: ``bands`` (positions among
    the bands read: the red, green and blue, or the one gray band) of ``dtype`` samples, and the scene's mask where
    it has one (``masked``)."""

    height: int
    width: int
    bands: tuple[int, ...]
    dtype: str
    masked: bool

    @cached_property
    def shape(self) -> tuple[int, int]:
        scale = max(1.0, max(self.height, self.width) / PREVIEW_PIXELS)
        return max(1, round(self.height / scale)), max(1, round(self.width / scale))

    @cached_property
    def source_rows(self) -> np.ndarray:
        """The scene row each canvas row samples (the centre of its span)."""
        return ((np.arange(self.shape[0]) + 0.5) * self.height / self.shape[0]).astype(np.int64)

    @cached_property
    def source_cols(self) -> np.ndarray:
        return ((np.arange(self.shape[1]) + 0.5) * self.width / self.shape[1]).astype(np.int64)

    def piece(self, strip: np.ndarray, mask: np.ndarray | None, row: int, col: int) -> CanvasPiece | None:
        """The canvas pixels that the strip (bands read × rows × columns, its top-left pixel at ``row``, ``col``)
        holds, or None."""
        rows = np.flatnonzero((self.source_rows >= row) & (self.source_rows < row + strip.shape[1]))
        cols = np.flatnonzero((self.source_cols >= col) & (self.source_cols < col + strip.shape[2]))
        if not len(rows) or not len(cols):
            return None
        at = np.ix_(self.source_rows[rows] - row, self.source_cols[cols] - col)
        values = np.stack([strip[band][at] for band in self.bands], axis=-1).astype(self.dtype)
        return CanvasPiece(int(rows[0]), int(cols[0]), values, None if mask is None else (mask[at] > 0))


@dataclass
class CanvasPiece:
    """Canvas pixels from ``row``, ``col``: (rows, columns, bands) samples and, where the scene is masked, whether
    each is data."""

    row: int
    col: int
    values: np.ndarray
    data: np.ndarray | None
