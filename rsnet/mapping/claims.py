"""Who classifies which chunk: chunks are claimed one at a time through the workers' shared store, in the order of
the scenes and of their windows, by whichever device is free - the trainer's dynamic scheduling, here for
inference. A device claims a chunk only if it would finish it (and the ones it holds) before the others run out of
work at their measured speeds; once it would not, it is left out for the rest of the map and says so."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

MARGIN = 0.9  # a claim must finish within this share of the time the others need for the rest


@dataclass
class ClaimBoard:
    """This worker's view of the store: ``total`` windows in the map (its remaining ones: ``total`` - claimed),
    every worker's measured speed (windows/s; 0 = unknown or left out)."""

    store: Any
    rank: int
    world_size: int
    total: int
    left_out: bool = False
    _speeds: dict[int, float] = field(default_factory=dict)

    def publish_speed(self, windows_per_s: float) -> None:
        self.store.set(f"map/speed/{self.rank}", repr(0.0 if self.left_out else windows_per_s))

    def count_claimed(self, windows: int) -> None:
        """Count ``windows`` as claimed (a chunk, or the windows of a scene or chunk already complete on disk)."""
        if windows:
            self.store.add("map/claimed", windows)

    def remaining(self) -> int:
        """Windows of the map no worker has claimed yet."""
        return self.total - int(self.store.add("map/claimed", 0))

    def claim(self, scene: int, chunks: int) -> int | None:
        """The next unclaimed chunk of ``scene`` (``chunks`` in all), or None when it has none left."""
        index = self.store.add(f"map/{scene}/next", 1) - 1
        return index if index < chunks else None

    def worth_claiming(self, own_speed: float, held: int, batch: int) -> bool:
        """Whether this worker (``own_speed`` windows/s, ``held`` windows claimed and not yet done) would finish one
        more chunk of ``batch`` windows before the others finish the rest of the map; else it is left out (a log
        line says why)."""
        if self.left_out:
            return False
        speeds = [speed for rank, speed in self._read_speeds().items() if rank != self.rank]
        others = sum(speeds)
        if others <= 0 or own_speed <= 0 or own_speed >= max(speeds):
            return True  # alone, not measured yet, or the fastest: the fastest always works
        remaining = self.remaining()
        mine, theirs = (held + batch) / own_speed, max(remaining - batch, 0) / others
        if mine <= MARGIN * theirs or not self._leave():
            return True
        self.publish_speed(0.0)
        print(f"worker {self.rank} left out of the rest of the map: {held + batch} windows would take it {mine:.2f} s "
              f"({own_speed:.1f} windows/s), the others classify the remaining {max(remaining - batch, 0)} in "
              f"{theirs:.2f} s ({others:.1f} windows/s)", file=sys.stderr, flush=True)
        return False

    def _leave(self) -> bool:
        """Leave the map unless every other worker has left already (speeds read at the same moment could have each
        of two workers see the other as faster: one of them always stays)."""
        if int(self.store.add("map/left_out", 1)) < self.world_size:
            self.left_out = True
            return True
        self.store.add("map/left_out", -1)
        return False

    def _read_speeds(self) -> dict[int, float]:
        keys = [f"map/speed/{rank}" for rank in range(self.world_size)]
        present = [key for key in keys if self.store.check([key])]
        if present:
            values = self.store.multi_get(present)
            self._speeds = {int(key.rsplit("/", 1)[1]): float(value) for key, value in zip(present, values)}
        return self._speeds
