"""albumentations pipelines for training (augmenting) and evaluation.

Images reach the transforms as uint8 H×W×3 arrays already resized to the working size, so the eval
``Resize`` is a no-op for cached data and only matters for images fed from elsewhere (prediction).
"""

from __future__ import annotations

from typing import Sequence

import albumentations as A
import cv2
from albumentations.pytorch import ToTensorV2

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "train_transform", "eval_transform"]

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


def train_transform(
    image_size: int,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    scale: tuple[float, float] = (0.5, 1.0),
    color_jitter: float = 0.2,
    hue: float = 0.0,
    seed: int | None = None,
) -> A.Compose:
    """Random resized crop, horizontal/vertical flips, 90° rotations, mild colour jitter, normalize.

    Aerial scenes have no canonical orientation, so all eight dihedral transforms are used. Hue is
    not jittered by default (mild jitter of brightness, contrast and saturation only; ``hue`` > 0
    adds it at about twice the cost of the whole colour step).
    """
    return A.Compose(
        [
            A.RandomResizedCrop(
                size=(image_size, image_size), scale=scale, interpolation=cv2.INTER_LINEAR
            ),
            A.HorizontalFlip(p=0.5),
            A.VerticalFlip(p=0.5),
            A.RandomRotate90(p=1.0),
            A.ColorJitter(
                brightness=color_jitter,
                contrast=color_jitter,
                saturation=color_jitter,
                hue=hue,
                p=0.5,
            ),
            A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0),
            ToTensorV2(),
        ],
        seed=seed,
    )


def eval_transform(
    image_size: int,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
) -> A.Compose:
    """Resize to the working size (no-op for cached images), normalize, to tensor."""
    return A.Compose(
        [
            A.Resize(height=image_size, width=image_size, interpolation=cv2.INTER_AREA),
            A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0),
            ToTensorV2(),
        ]
    )
