"""One split of a scene dataset (:class:`SceneDataset`)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .batch_transform import batch_transform
from .decode import pixel_layout
from .normalize import to_float_chw
from .raster import pictures
from .store import ImageStore
from .transforms import HostAugment

__all__ = ["SceneDataset"]


class SceneDataset(Dataset):
    """One split of a scene dataset: an index view (``rows``) into a shared decoded :class:`ImageStore`, transformed by
    ``transform`` (None: pixels in [0, 1]); set ``ds.epoch`` every epoch."""

    def __init__(self, store: ImageStore, rows: np.ndarray, labels: np.ndarray, names: Sequence[str],
                 class_names: Sequence[str], transform: HostAugment | Callable | None, name: str = "") -> None:
        self.store = store
        self.rows = np.asarray(rows, np.int64)
        self.labels = np.asarray(labels, np.int64)
        self.names = list(names)
        self.paths = [store.paths[r] for r in self.rows]
        self.class_names = list(class_names)
        self.transform = transform
        self.name = name
        self.seed = 0
        self.epoch = 0
        self._batch = batch_transform(transform)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return (f"SceneDataset({self.name!r}, n={len(self)}, classes={len(self.class_names)}, "
                f"size={self.store.size}, cache={self.store.mode!r})")

    @property
    def images(self) -> np.ndarray | None:
        """The whole shared uint8 array (all splits); rows of this split are ``images[ds.rows]``."""
        return self.store.array

    def raw(self, i: int) -> np.ndarray:
        """The stored H×W×C image of item ``i`` (resized to the working size, not augmented)."""
        return self.store[int(self.rows[i])]

    def picture(self, i: int) -> np.ndarray:
        """Item ``i`` as a uint8 RGB picture: the stored image, or the RGB composite of a multispectral one's bands."""
        return pictures(self.raw(i), self.store.decoding)

    def _apply(self, img: np.ndarray) -> torch.Tensor:
        if self.transform is None:
            return to_float_chw(img)
        return self.transform(image=np.asarray(img))["image"]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        images, labels = self.get_batch([i])
        return images[0], int(labels[0])

    def _indices_and_labels(self, indices: Sequence[int] | np.ndarray | torch.Tensor
                            ) -> tuple[np.ndarray, torch.Tensor]:
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        idx = np.asarray(indices, np.int64).reshape(-1)
        return idx, torch.from_numpy(self.labels[idx].copy())

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor, seed: int | None = None,
                  epoch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform items ``indices`` and stack them: (B, C, S, S) float, (B,) int64 (None: the dataset's draw)."""
        idx, labels = self._indices_and_labels(indices)
        if len(idx) == 0:
            return torch.empty(0), labels
        images = [self.raw(i) for i in idx]
        if isinstance(self.transform, HostAugment):
            seed = self.seed if seed is None else seed
            return self.transform.apply(images, idx, seed, self.epoch if epoch is None else epoch), labels
        if self._batch is None:
            return torch.stack([self._apply(image) for image in images]), labels
        return self._batch(images), labels

    def stored_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored pixels of items ``indices``: (B, S, S, C), uint8 RGB or float32 bands (torch's device
    kernels take few other sample types), and int64 (B,) labels, all a host thread prepares for
    :class:`~rsnet.data.device_augment.DeviceAugment`."""
        idx, labels = self._indices_and_labels(indices)
        if self.store.array is not None:
            pixels = self.store.array[self.rows[idx]]
        elif len(idx):
            pixels = np.stack([self.raw(i) for i in idx])
        else:
            channels, dtype = pixel_layout(self.store.decoding)
            pixels = np.empty((0, self.store.size, self.store.size, channels), dtype)
        return torch.from_numpy(pixels if pixels.dtype == np.uint8 else pixels.astype(np.float32)), labels
