"""uint8 RGB images -> the float32 channel-first tensors a model reads: the one conversion behind
``SceneDataset.get_batch``, prediction, attention maps and projector thumbnails."""

from __future__ import annotations

from typing import Sequence

import cv2
import numpy as np
import torch

__all__ = ["to_float_chw"]

_SPLIT_MAX = 128  # bands cv2.split separates: past 128 it returns one plane


def to_float_chw(images: np.ndarray | torch.Tensor, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, max_pixel_value: float = 255.0) -> torch.Tensor:
    """uint8 (H, W, C) or (N, H, W, C) -> float32 (C, H, W) or (N, C, H, W), ``(x / max_pixel_value - mean) / std``
    (without ``mean``/``std``: in [0, 1]), with numpy/OpenCV, no torch threads."""
    pixels = np.asarray(images)
    batch = pixels if pixels.ndim == 4 else pixels[None]
    n, h, w, c = batch.shape
    scale = np.float32(max_pixel_value)
    shift = np.zeros(c, np.float32) if mean is None else np.asarray(mean, np.float32).reshape(-1) * scale
    divisor = np.full(c, scale, np.float32) if std is None else np.asarray(std, np.float32).reshape(-1) * scale
    out = np.empty((n, c, h, w), np.float32)
    if 1 < c <= _SPLIT_MAX:
        planes = cv2.split(np.ascontiguousarray(batch).reshape(n * h, w, c))
    else:
        planes = [batch[..., k] for k in range(c)]
    for k in range(c):
        plane = out[:, k]
        plane[...] = planes[k].reshape(n, h, w)
        np.subtract(plane, shift[k], out=plane)
        np.divide(plane, divisor[k], out=plane)
    return torch.from_numpy(out if pixels.ndim == 4 else out[0])
