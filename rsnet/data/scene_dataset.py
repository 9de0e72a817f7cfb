"""One split of a scene dataset (:class:`SceneDataset`)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .batch_transform import batch_transform
from .normalize import to_float_chw
from .store import ImageStore

__all__ = ["SceneDataset"]


class SceneDataset(Dataset):
    """One split of a scene dataset: an index view into a shared decoded :class:`ImageStore`.

    ``ds[i] -> (FloatTensor[3, S, S] normalized, int label)``; ``ds.raw(i)`` is the stored uint8
    image (resized, not augmented); ``ds.get_batch(indices)`` transforms and stacks a batch on the host;
    ``ds.uint8_batch(indices)`` gathers the stored pixels for augmentation on the worker's device.

    Attributes:
        paths: absolute file paths of this split, in index order.
        names: relative file names "<class>/<file>" (as in the saved split).
        labels: int64 labels.
        class_names: class order.
        transform: the albumentations pipeline applied per image (None: the stored pixels scaled to [0, 1]).
        store: the shared store (``store.array`` is the one (N, S, S, 3) uint8 array).
    """

    def __init__(self, store: ImageStore, rows: np.ndarray, labels: np.ndarray, names: Sequence[str],
                 class_names: Sequence[str], transform: Callable | None, name: str = "") -> None:
        self.store = store
        self.rows = np.asarray(rows, np.int64)
        self.labels = np.asarray(labels, np.int64)
        self.names = list(names)
        self.paths = [store.paths[r] for r in self.rows]
        self.class_names = list(class_names)
        self.transform = transform
        self.name = name
        self._batch = batch_transform(transform)
        self._seeded_worker: int | None = None

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
        """The stored uint8 H×W×3 image of item ``i`` (resized to the working size, not augmented)."""
        return self.store[int(self.rows[i])]

    def set_seed(self, seed: int) -> None:
        """Seed the augmentation RNG (albumentations keeps its own generator)."""
        pipelines = [self.transform] + ([self._batch.per_image] if self._batch is not None else [])
        for pipeline in pipelines:
            if hasattr(pipeline, "set_random_seed"):
                pipeline.set_random_seed(int(seed) % 2**32)

    def _reseed_in_worker(self) -> None:
        # forked DataLoader workers inherit the same albumentations RNG state; give each its own
        info = torch.utils.data.get_worker_info()
        if info is not None and self._seeded_worker != info.id:
            self.set_seed(info.seed)
            self._seeded_worker = info.id

    def _apply(self, img: np.ndarray) -> torch.Tensor:
        if self.transform is None:
            return to_float_chw(img)
        return self.transform(image=np.asarray(img))["image"]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self._reseed_in_worker()
        return self._apply(self.raw(i)), int(self.labels[i])

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform items ``indices`` of this split and stack them: (B, 3, S, S) float, (B,) int64.

        A pipeline ending with ``Normalize`` + ``ToTensorV2`` normalises the whole batch at once
        (:class:`~rsnet.data.batch_transform.BatchTransform`)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        idx = np.asarray(indices, np.int64).reshape(-1)
        self._reseed_in_worker()
        labels = torch.from_numpy(self.labels[idx].copy())
        if len(idx) == 0:
            return torch.empty(0), labels
        if self._batch is None:
            return torch.stack([self._apply(self.raw(i)) for i in idx]), labels
        return self._batch([self.raw(i) for i in idx]), labels

    def uint8_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The stored pixels of items ``indices``, not transformed: uint8 (B, S, S, 3) and int64 (B,) labels — all
        a host thread prepares for :class:`~rsnet.data.device_augment.DeviceAugment` (one gather from the cache)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        idx = np.asarray(indices, np.int64).reshape(-1)
        labels = torch.from_numpy(self.labels[idx].copy())
        if self.store.array is not None:
            return torch.from_numpy(self.store.array[self.rows[idx]]), labels
        size = self.store.size
        return torch.from_numpy(np.stack([self.raw(i) for i in idx]) if len(idx) else
                                np.empty((0, size, size, 3), np.uint8)), labels
