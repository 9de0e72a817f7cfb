"""albumentations pipelines for training (augmenting) and evaluation.

Images reach the transforms as uint8 H×W×3 arrays already resized to the working size, so the eval
``Resize`` is a no-op for cached data and only matters for images fed from elsewhere (prediction).

Every augmenting step of the training pipeline works on uint8 and costs a few tens of µs at 128 px:

- ``RandomResizedCrop`` (one ``cv2.resize`` of the crop);
- :class:`Dihedral`: one of the eight flips/rotations of the square (``A.D4``), applied with
  ``cv2.flip``/``cv2.rotate``/``cv2.transpose`` instead of ``np.rot90`` views, whose later copy into a
  contiguous array cost ~0.1 ms per image;
- :class:`ColorJitterAffine`: brightness, contrast and saturation jitter (same factor ranges and random
  order as ``A.ColorJitter``/torchvision), composed into one 3×4 colour matrix and applied by a single
  ``cv2.transform`` (≈ 15 µs instead of ≈ 130 µs for ``A.ColorJitter``);
- ``Normalize`` + ``ToTensorV2`` at the end: :meth:`SceneDataset.get_batch` recognises them and
  normalises the whole batch at once in torch (per image only when indexing ``ds[i]``).
"""

from __future__ import annotations

from typing import Any, Sequence

import albumentations as A
import cv2
import numpy as np
from albumentations.augmentations.geometric import functional as _fgeometric
from albumentations.pytorch import ToTensorV2

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ColorJitterAffine",
    "Dihedral",
    "RandomResizedCropCV2",
    "train_transform",
    "eval_transform",
]

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

# ITU-R 601 luma weights (RGB), as torchvision's rgb_to_grayscale and albumentations' ColorJitter
_LUMA = (0.299, 0.587, 0.114)

_CV2_D4 = {
    "e": lambda x: x,
    "r90": lambda x: cv2.rotate(x, cv2.ROTATE_90_COUNTERCLOCKWISE),  # np.rot90(x, 1)
    "r180": lambda x: cv2.rotate(x, cv2.ROTATE_180),
    "r270": lambda x: cv2.rotate(x, cv2.ROTATE_90_CLOCKWISE),
    "v": lambda x: cv2.flip(x, 0),
    "hvt": lambda x: cv2.transpose(cv2.rotate(x, cv2.ROTATE_180)),  # reflect over the anti-diagonal
    "h": lambda x: cv2.flip(x, 1),
    "t": lambda x: cv2.transpose(x),
}


_D4_ELEMENTS = tuple(_CV2_D4)


class RandomResizedCropCV2(A.RandomResizedCrop):
    """``A.RandomResizedCrop`` (same crop draw, same pixels) that resizes H×W×C images with one direct
    ``cv2.resize`` call on the crop view, skipping albumentations' generic resize wrappers (chunking
    for > 4 channels, channel-dim checks), which cost about as much as the resize at 128 px."""

    def apply(self, img: np.ndarray, crop_coords: tuple[int, int, int, int], **params: Any) -> np.ndarray:
        if img.ndim != 3 or img.shape[2] > 4 or getattr(self, "area_for_downscale", None) is not None:
            return super().apply(img, crop_coords, **params)
        x1, y1, x2, y2 = crop_coords
        h, w = self.size
        return cv2.resize(img[y1:y2, x1:x2], (w, h), interpolation=self.interpolation)


class Dihedral(A.D4):
    """``A.D4`` (uniform over the 8 symmetries of the square) with OpenCV kernels for H×W×C images.

    Same group elements, same random draw and the same pixels as ``A.D4`` (and as HorizontalFlip(0.5)
    + VerticalFlip(0.5) + RandomRotate90, whose product is also uniform over the group); the result
    is a contiguous array, so no later step pays for copying a strided ``np.rot90`` view. Masks,
    boxes and key points go through ``A.D4``'s own code.
    """

    def get_params(self) -> dict[str, str]:
        # Python's RNG (seeded by Compose like numpy's): Generator.choice costs ~10 µs a call
        return {"group_element": self.py_random.choice(_D4_ELEMENTS)}

    def apply(self, img: np.ndarray, group_element: str, **params: Any) -> np.ndarray:
        if img.ndim == 3 and img.shape[2] <= 4 and img.dtype in (np.uint8, np.float32):
            return _CV2_D4[group_element](img)
        return _fgeometric.d4(img, group_element)


class ColorJitterAffine(A.ImageOnlyTransform):
    """Brightness, contrast and saturation jitter as one affine colour map (uint8 in, uint8 out).

    Factors are drawn like ``A.ColorJitter``/torchvision, each uniform in ``[max(0, 1 - j), 1 + j]``:
    brightness ``x·b``; contrast ``c·x + (1 - c)·mean(gray(x))``; saturation ``s·x + (1 - s)·gray(x)``
    (``gray = 0.299 R + 0.587 G + 0.114 B``). The three maps are affine in the RGB vector and, without
    clipping in between, commute (saturation keeps the gray level, contrast keeps the mean gray level),
    so whatever order ``ColorJitter`` would draw they compose to ``b·c·Sat_s(x) + b·(1 - c)·mean(gray(x))``:
    one 3×4 matrix applied by a single ``cv2.transform``, which rounds and saturates to uint8 once.
    The only difference from ``A.ColorJitter`` is that values are not clipped to [0, 255] between the
    steps. No hue jitter (use ``A.ColorJitter`` for that).
    """

    def __init__(
        self,
        brightness: float = 0.2,
        contrast: float = 0.2,
        saturation: float = 0.2,
        p: float = 0.5,
    ) -> None:
        super().__init__(p=p)
        self.brightness = brightness
        self.contrast = contrast
        self.saturation = saturation

    @staticmethod
    def _range(j: float) -> tuple[float, float]:
        return max(0.0, 1.0 - float(j)), 1.0 + float(j)

    def get_params(self) -> dict[str, Any]:
        uniform = self.py_random.uniform
        return {
            "factors": (
                uniform(*self._range(self.brightness)),
                uniform(*self._range(self.contrast)),
                uniform(*self._range(self.saturation)),
            )
        }

    @staticmethod
    def matrix(img: np.ndarray, factors: Sequence[float]) -> np.ndarray:
        """The 3×4 float32 colour matrix ``[M | t]`` (``out = M·rgb + t``) for ``img``.

        Plain Python arithmetic on 12 numbers (numpy calls on 3×3 arrays would cost more than the
        ``cv2.transform`` itself)."""
        b, c, s = (float(f) for f in factors)
        wr, wg, wb = _LUMA
        k = b * c
        d = k * s  # diagonal part
        gr, gg, gb = (k * (1.0 - s) * w for w in _LUMA)  # gray part (same in every row)
        t = 0.0
        if c != 1.0:
            mr, mg, mb = cv2.mean(img)[:3]
            t = b * (1.0 - c) * (wr * mr + wg * mg + wb * mb)
        return np.array([[d + gr, gg, gb, t], [gr, d + gg, gb, t], [gr, gg, d + gb, t]], np.float32)

    def apply(self, img: np.ndarray, factors: Sequence[float], **params: Any) -> np.ndarray:
        if img.ndim != 3 or img.shape[2] != 3:
            raise TypeError("ColorJitterAffine expects H×W×3 RGB images")
        out = cv2.transform(img, self.matrix(img, factors))
        return out if img.dtype == np.uint8 else np.clip(out, 0.0, 1.0)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("brightness", "contrast", "saturation")


def train_transform(
    image_size: int,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    scale: tuple[float, float] = (0.5, 1.0),
    color_jitter: float = 0.2,
    hue: float = 0.0,
    seed: int | None = None,
    color_p: float = 0.5,
) -> A.Compose:
    """Random resized crop, the 8 flips/rotations, mild colour jitter, normalize.

    Aerial scenes have no canonical orientation, so all eight dihedral transforms are used
    (:class:`Dihedral`). ``color_jitter`` is the brightness/contrast/saturation strength, applied with
    probability ``color_p`` by :class:`ColorJitterAffine` (``color_jitter=0`` drops the step). Hue is
    not jittered by default; ``hue`` > 0 switches to ``A.ColorJitter`` (about 10× the cost of the
    whole colour step). The last two steps (Normalize, ToTensorV2) run per batch in
    :meth:`SceneDataset.get_batch`.
    """
    steps: list = [
        RandomResizedCropCV2(size=(image_size, image_size), scale=scale, interpolation=cv2.INTER_LINEAR),
        Dihedral(p=1.0),
    ]
    if hue > 0:
        steps.append(A.ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter,
                                   hue=hue, p=color_p))
    elif color_jitter > 0:
        steps.append(ColorJitterAffine(color_jitter, color_jitter, color_jitter, p=color_p))
    steps += [A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0), ToTensorV2()]
    # shapes need no per-call consistency check: the pipeline only ever sees one image
    return A.Compose(steps, seed=seed, is_check_shapes=False)


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
