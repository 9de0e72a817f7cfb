"""A per-image albumentations pipeline run per batch: its uint8 steps image by image, then one normalisation
(:func:`~rsnet.data.normalize.to_float_chw`) of the whole batch instead of ``Normalize`` + ``ToTensorV2`` per image."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import albumentations as A
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2

from .normalize import to_float_chw

__all__ = ["BatchTransform", "batch_transform"]


@dataclass(frozen=True)
class BatchTransform:
    """``per_image``: the pipeline without its last two steps; ``mean``, ``std``, ``max_pixel_value``: the
    settings of its ``Normalize``."""

    per_image: A.Compose
    mean: Sequence[float]
    std: Sequence[float]
    max_pixel_value: float

    def __call__(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """uint8 H×W×C images -> float32 (B, C, H', W'): ``per_image`` on each, written into one uint8 batch
        array, then normalised at once."""
        batch = None
        for k, image in enumerate(images):
            out = self.per_image(image=np.asarray(image))["image"]
            if batch is None:
                batch = np.empty((len(images), *out.shape), out.dtype)
            batch[k] = out
        return to_float_chw(batch, self.mean, self.std, self.max_pixel_value)


def batch_transform(transform: Callable | None) -> BatchTransform | None:
    """The batch form of ``transform`` when it is an ``A.Compose`` ending with a standard ``Normalize`` and
    ``ToTensorV2`` (as :func:`~rsnet.data.transforms.eval_transform` does), else None."""
    steps = list(getattr(transform, "transforms", []))
    if not (isinstance(transform, A.Compose) and len(steps) >= 2 and isinstance(steps[-1], ToTensorV2)
            and isinstance(steps[-2], A.Normalize) and getattr(steps[-2], "normalization", "standard") == "standard"):
        return None
    norm = steps[-2]
    per_image = A.Compose(steps[:-2], is_check_shapes=getattr(transform, "is_check_shapes", True))
    return BatchTransform(per_image, norm.mean, norm.std, float(norm.max_pixel_value))
