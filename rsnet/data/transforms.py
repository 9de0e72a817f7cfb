"""albumentations pipelines for training (augmenting) and evaluation, and rsnet's own uint8 augmentations.

:class:`RandomResizedCrop` (torchvision's draw, one ``cv2.resize``), :class:`Dihedral` (the 8 symmetries of
``A.D4`` with OpenCV kernels) and :class:`ColorJitterAffine` (brightness/contrast/saturation as one colour matrix)
use only albumentations' public custom-transform API: random parameters from ``self.py_random`` in
``get_params()`` (seeded by ``A.Compose(seed=...)`` / ``SceneDataset.set_seed``), pixels in ``apply()``. Nothing
imports albumentations' internals, so its ``Compose`` could be replaced without touching them (docs/data.md says
why; tests/test_data_transforms.py checks the rule). ``Normalize`` + ``ToTensorV2`` run once per batch
(:mod:`rsnet.data.batch_transform`).
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping, Sequence

import albumentations as A
import cv2
import numpy as np
from albumentations.pytorch import ToTensorV2

__all__ = ["augmentation_options", "IMAGENET_MEAN", "IMAGENET_STD", "ColorJitterAffine", "Dihedral",
           "RandomResizedCrop", "crop_box", "dihedral_numpy", "train_transform", "eval_transform"]

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

# ITU-R 601 luma weights (RGB), as torchvision's rgb_to_grayscale and albumentations' ColorJitter
LUMA = (0.299, 0.587, 0.114)

# The 8 symmetries of the square, named as albumentations' D4 names them.
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

_NP_D4 = {
    "e": lambda x: x,
    "r90": lambda x: np.rot90(x, 1),  # counter-clockwise
    "r180": lambda x: np.rot90(x, 2),
    "r270": lambda x: np.rot90(x, 3),
    "v": lambda x: x[::-1],  # upside down
    "hvt": lambda x: np.swapaxes(np.rot90(x, 2), 0, 1),  # reflect over the anti-diagonal
    "h": lambda x: x[:, ::-1],  # left-right
    "t": lambda x: np.swapaxes(x, 0, 1),  # reflect over the main diagonal
}

_D4_ELEMENTS = tuple(_CV2_D4)


def dihedral_numpy(img: np.ndarray, group_element: str) -> np.ndarray:
    """Apply one of the 8 symmetries (``"e", "r90", "r180", "r270", "v", "hvt", "h", "t"``) to the
    first two axes of ``img`` (any number of trailing axes, any dtype); returns a contiguous array."""
    if group_element not in _NP_D4:
        raise ValueError(f"unknown dihedral group element {group_element!r}; expected one of {_D4_ELEMENTS}")
    return np.ascontiguousarray(_NP_D4[group_element](img))


def crop_box(
    height: int,
    width: int,
    scale: Sequence[float],
    ratio: Sequence[float],
    rng: random.Random,
) -> tuple[int, int, int, int]:
    """The crop ``(top, left, h, w)`` of torchvision's ``RandomResizedCrop.get_params``, drawn from ``rng``.

    Up to 10 attempts: target area ``height·width·U(scale)``, aspect ratio (w/h) log-uniform in
    ``ratio``, ``w = round(sqrt(area·ratio))``, ``h = round(sqrt(area/ratio))``; the first that fits
    (``0 < w <= width`` and ``0 < h <= height``) gets a uniform top-left corner. Otherwise a central crop:
    the whole image, or its largest central part whose aspect ratio is clamped to ``ratio``.
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _resize(img: np.ndarray, size: tuple[int, int], interpolation: int) -> np.ndarray:
    """``cv2.resize`` to ``size`` = (height, width) keeping the input's layout (H×W or H×W×C, any C)."""
    dsize = (int(size[1]), int(size[0]))  # cv2 wants (width, height)
    if img.ndim == 2:
        return cv2.resize(img, dsize, interpolation=interpolation)
    channels = img.shape[2]
    if channels <= 4:
        out = cv2.resize(img, dsize, interpolation=interpolation)
        return out[..., None] if out.ndim == 2 else out  # cv2 drops a single channel axis
    # more than 4 channels: resize 4 at a time (not every OpenCV build/interpolation takes more)
    parts = [_resize(np.ascontiguousarray(img[..., c:c + 4]), size, interpolation) for c in range(0, channels, 4)]
    return np.concatenate(parts, axis=2)


class RandomResizedCrop(A.ImageOnlyTransform):
    """Crop a random part of the image (torchvision's draw, :func:`crop_box`) and resize it to ``size``
    = (height, width) with one ``cv2.resize`` of the crop view.

    ``get_params()`` does not see the image, so it only draws a 32-bit seed from ``self.py_random``;
    ``apply`` draws the box from ``random.Random(crop_seed)`` and the image's shape. The result is as
    reproducible as any other draw under ``A.Compose(seed=...)`` / ``set_random_seed``. Works on H×W
    and H×W×C images (uint8, float32, ...).
    """

    def __init__(
        self,
        size: tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        interpolation: int = cv2.INTER_LINEAR,
        p: float = 1.0,
    ) -> None:
        super().__init__(p=p)
        if len(size) != 2 or min(size) <= 0:
            raise ValueError(f"size must be (height, width) > 0, got {size!r}")
        if not (0 < scale[0] <= scale[1]):
            raise ValueError(f"scale must be 0 < min <= max, got {scale!r}")
        if not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio must be 0 < min <= max, got {ratio!r}")
        self.size = (int(size[0]), int(size[1]))
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = interpolation

    def get_params(self) -> dict[str, Any]:
        return {"crop_seed": self.py_random.getrandbits(32)}

    def crop_box(self, img_shape: Sequence[int], crop_seed: int) -> tuple[int, int, int, int]:
        """The ``(top, left, h, w)`` that :meth:`apply` crops from an image of shape ``img_shape``."""
        return crop_box(int(img_shape[0]), int(img_shape[1]), self.scale, self.ratio, random.Random(crop_seed))

    def apply(self, img: np.ndarray, crop_seed: int, **params: Any) -> np.ndarray:
        top, left, h, w = self.crop_box(img.shape, crop_seed)
        return _resize(img[top:top + h, left:left + w], self.size, self.interpolation)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ("size", "scale", "ratio", "interpolation")


class Dihedral(A.ImageOnlyTransform):
    """Uniform over the 8 symmetries of the square (the elements of ``A.D4``: ``"e", "r90", "r180",
    "r270", "v", "hvt", "h", "t"``), with OpenCV kernels for H×W×C images.

    Same elements and same pixels as ``A.D4`` (and a draw as uniform as HorizontalFlip(0.5) +
    VerticalFlip(0.5) + RandomRotate90, whose product is also uniform over the group); the result is a
    contiguous array, so no later step pays for copying a strided ``np.rot90`` view. Images the cv2
    path does not take (2-D, > 4 channels, other dtypes) go through :func:`dihedral_numpy`.
    """

    def __init__(self, p: float = 1.0) -> None:
        super().__init__(p=p)

    def get_params(self) -> dict[str, str]:
        # Python's RNG, seeded by Compose like numpy's
        return {"group_element": self.py_random.choice(_D4_ELEMENTS)}

    def apply(self, img: np.ndarray, group_element: str, **params: Any) -> np.ndarray:
        if img.ndim == 3 and img.shape[2] <= 4 and img.dtype in (np.uint8, np.float32):
            out = _CV2_D4[group_element](img)
            return out[..., None] if out.ndim == 2 else out  # cv2 drops a single channel axis
        return dihedral_numpy(img, group_element)

    def get_transform_init_args_names(self) -> tuple[str, ...]:
        return ()


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

        Plain Python arithmetic on 12 numbers: numpy calls on 3×3 arrays cost more than they compute."""
        b, c, s = (float(f) for f in factors)
        wr, wg, wb = LUMA
        k = b * c
        d = k * s  # diagonal part
        gr, gg, gb = (k * (1.0 - s) * w for w in LUMA)  # gray part (same in every row)
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


AUTO_CROP_MIN_SIZE = 128
AUTO_CROP_SCALE = (0.5, 1.0)
COLOR_JITTER_P = 0.5  # share of the training images whose colours are jittered


def train_transform(image_size: int, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                    scale: Sequence[float] | None = (0.5, 1.0), color_jitter: float = 0.2) -> A.Compose:
    """Random resized crop (``scale`` = its area range; None: no crop), the 8 flips/rotations, mild colour
    jitter, normalize.

    Aerial scenes have no canonical orientation, so all eight dihedral transforms are used
    (:class:`Dihedral`). ``color_jitter`` is the brightness/contrast/saturation strength, applied to half
    the images by :class:`ColorJitterAffine` (``color_jitter=0`` drops the step); hue is not jittered.
    The last two steps (Normalize, ToTensorV2) run per batch in :meth:`SceneDataset.get_batch`.
    """
    steps: list = []
    if scale is not None:
        steps.append(RandomResizedCrop(size=(image_size, image_size), scale=tuple(scale),
                                       interpolation=cv2.INTER_LINEAR))
    steps.append(Dihedral(p=1.0))
    if color_jitter > 0:
        steps.append(ColorJitterAffine(color_jitter, color_jitter, color_jitter, p=COLOR_JITTER_P))
    steps += [A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0), ToTensorV2()]
    # shapes need no per-call consistency check: the pipeline only ever sees one image
    return A.Compose(steps, is_check_shapes=False)


def augmentation_options(augment: Mapping[str, Any] | None, image_size: int) -> dict[str, Any]:
    """:func:`train_transform` keyword arguments from the ``augment:`` settings.

    ``crop_scale: auto`` crops only from :data:`AUTO_CROP_MIN_SIZE` px up: images are cached at the working
    size, so a crop of a small image is an upsampled, blurred part of it; a list ``[lo, hi]`` is the crop's
    area range, ``null`` no crop.
    """
    augment = dict(augment or {})
    scale = augment.get("crop_scale", "auto")
    if scale == "auto":
        scale = AUTO_CROP_SCALE if image_size >= AUTO_CROP_MIN_SIZE else None
    elif scale is not None:
        try:
            low, high = (float(value) for value in scale)
        except (TypeError, ValueError):
            raise ValueError(f"augment.crop_scale must be auto, null or [min, max], got {scale!r}") from None
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"augment.crop_scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        scale = (low, high)
    jitter = augment.get("color_jitter", 0.2)
    if not isinstance(jitter, (int, float)) or isinstance(jitter, bool) or not 0.0 <= jitter < 1.0:
        raise ValueError(f"augment.color_jitter must be a number in [0, 1), got {jitter!r}")
    return {"scale": scale, "color_jitter": float(jitter)}


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
