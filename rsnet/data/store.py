"""The decoded images of one ordered file list: ONE (N, S, S, C) array (uint8 RGB, or a multispectral dataset's bands)
of which the datasets are index views, shared with loader workers, never copied (docs/data.md, Input pipeline and the
cache choice)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .decode import DEFAULT_HIGH_BIT_DEPTH, Decoding, decode_image

__all__ = ["ImageStore"]


class ImageStore:
    """Decoded images of one ordered file list, ``store[i]`` → H×W×C (a view; ``decoding`` says how files became them);
    ``array`` is None for mode "none", ``corrupt`` the undecodable rows, ``decoded`` 0 where the cache was reused."""

    def __init__(self, paths: Sequence[str], size: int, mode: str, array: np.ndarray | None = None,
                 cache_path: Path | None = None, corrupt: Sequence[int] = (), decoded: int = 0,
                 decoding: Decoding = DEFAULT_HIGH_BIT_DEPTH, rescaled: dict[int, str] | None = None) -> None:
        self.paths = list(paths)
        self.size = int(size)
        self.mode = mode
        self.array = array
        self.cache_path = cache_path
        self.corrupt = list(corrupt)
        self.decoded = decoded
        self.decoding = decoding
        self.rescaled = dict(rescaled or {})
        self._shared = None  # torch tensor in shared memory, created on first spawn-pickle

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        if self.array is None:
            return decode_image(self.paths[i], self.size, self.decoding)
        return self.array[i]

    def keep_in_memory(self) -> None:
        """A disk store whose file is removed (or about to be): its mapped pixels stay, and it is shared with
        loader workers as a memory store from now on."""
        self.mode, self.cache_path = "memory", None

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
