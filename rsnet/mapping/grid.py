"""Where a scene's windows lie and which output cells each one classifies: windows every ``stride`` pixels from the
top-left corner plus, where the last one stops short of the scene's edge, one more placed flush with that edge, so
every pixel of the scene is seen; output cells of ``stride`` × ``stride`` pixels, the last row and column
overhanging the scene by less than a cell. A cell takes the mean probabilities of the windows holding its centre
(the centre of its part inside the scene)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Axis:
    """One axis of the grid: ``length`` scene pixels, windows of ``size`` every ``step`` pixels."""

    length: int
    size: int
    step: int

    @cached_property
    def offsets(self) -> np.ndarray:
        """The first pixel of every window; the last one flush with the scene's edge."""
        regular = np.arange(0, self.length - self.size + 1, self.step, dtype=np.int64)
        if regular[-1] + self.size < self.length:
            regular = np.append(regular, self.length - self.size)
        return regular

    @property
    def cells(self) -> int:
        """Output cells along the axis: ceil(length / step)."""
        return -(-self.length // self.step)

    @cached_property
    def cell_pixels(self) -> np.ndarray:
        """Scene pixels of every cell along the axis (``step``, fewer for the last one where it overhangs)."""
        starts = np.arange(self.cells, dtype=np.int64) * self.step
        return np.minimum(starts + self.step, self.length) - starts

    @cached_property
    def centres(self) -> np.ndarray:
        """The centre of every cell's part inside the scene, in pixels along the axis."""
        starts = np.arange(self.cells, dtype=np.float64) * self.step
        return starts + self.cell_pixels / 2.0

    @cached_property
    def cover(self) -> tuple[np.ndarray, np.ndarray]:
        """Per window, the first and one-past-the-last cell whose centre lies inside it."""
        return (np.searchsorted(self.centres, self.offsets, side="left"),
                np.searchsorted(self.centres, self.offsets + self.size, side="left"))

    def windows_of_cell(self, cell: int) -> tuple[int, int]:
        """The windows (first, one past the last) holding the centre of ``cell``: a contiguous range."""
        first, stop = self.cover
        return int(np.searchsorted(stop, cell, side="right")), int(np.searchsorted(first, cell, side="right"))


@dataclass(frozen=True)
class WindowGrid:
    """The windows of a ``height`` × ``width`` scene, numbered row by row, and the chunks of ``batch_size``
    consecutive windows they are classified in (a chunk is the unit a device claims: fixed, so a scene's result does
    not depend on which device classified which chunk, nor on where an interrupted map resumed)."""

    height: int
    width: int
    size: int
    step: int
    batch_size: int

    @cached_property
    def rows(self) -> Axis:
        return Axis(self.height, self.size, self.step)

    @cached_property
    def cols(self) -> Axis:
        return Axis(self.width, self.size, self.step)

    @property
    def windows(self) -> int:
        return len(self.rows.offsets) * len(self.cols.offsets)

    @property
    def chunks(self) -> int:
        return -(-self.windows // self.batch_size)

    @property
    def cells(self) -> tuple[int, int]:
        """(rows, columns) of output cells."""
        return self.rows.cells, self.cols.cells

    def chunk_windows(self, chunk: int) -> range:
        """The window numbers of ``chunk``."""
        return range(chunk * self.batch_size, min((chunk + 1) * self.batch_size, self.windows))

    def corner(self, window: int) -> tuple[int, int]:
        """(row, column) of the top-left pixel of ``window``."""
        r, c = divmod(window, len(self.cols.offsets))
        return int(self.rows.offsets[r]), int(self.cols.offsets[c])
