"""The training augmentation on the host (:class:`HostAugment`: OpenCV kernels, image by image) and the evaluation
transform (albumentations: resize, normalise, to tensor). docs/data.md, Training augmentation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2

from .augment_params import DIHEDRAL_ELEMENTS, AugmentParams, AugmentSettings
from .normalize import to_float_chw

__all__ = ["augmentation_options", "IMAGENET_MEAN", "IMAGENET_STD", "HostAugment", "dihedral", "jitter_bands",
           "jitter_image", "jitter_matrix", "resized_crop", "train_transform", "eval_transform"]

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

# ITU-R 601 luma weights (RGB), as torchvision's rgb_to_grayscale and albumentations' ColorJitter
LUMA = (0.299, 0.587, 0.114)

# The 8 symmetries of the square (albumentations' D4 names) as OpenCV kernels: contiguous results, so no later
# step pays for copying a strided np.rot90 view.
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
# The same with numpy, for images OpenCV's transpose does not take (many bands of 16 bits and more)
_NUMPY_D4 = {
    "e": lambda x: x,
    "r90": lambda x: np.ascontiguousarray(np.rot90(x, 1)),
    "r180": lambda x: np.ascontiguousarray(x[::-1, ::-1]),
    "r270": lambda x: np.ascontiguousarray(np.rot90(x, 3)),
    "v": lambda x: np.ascontiguousarray(x[::-1]),
    "hvt": lambda x: np.ascontiguousarray(np.rot90(x, 2).swapaxes(0, 1)),
    "h": lambda x: np.ascontiguousarray(x[:, ::-1]),
    "t": lambda x: np.ascontiguousarray(x.swapaxes(0, 1)),
}


def dihedral(image: np.ndarray, element: str) -> np.ndarray:
    """One of the 8 symmetries (``"e", "r90", "r180", "r270", "v", "hvt", "h", "t"``, as ``A.D4``) of an H×W×C
    image: by OpenCV for uint8 RGB, by numpy for other band counts and sample types."""
    if element not in _CV2_D4:
        raise ValueError(f"unknown dihedral group element {element!r}; expected one of {DIHEDRAL_ELEMENTS}")
    rgb = image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    return (_CV2_D4 if rgb else _NUMPY_D4)[element](image)


def resized_crop(image: np.ndarray, box: Sequence[int], size: int) -> np.ndarray:
    """The ``box`` (top, left, h, w) of an H×W×C image resized to ``size`` × ``size``: one ``cv2.resize``
    (``INTER_LINEAR``) of the crop view, in the image's sample type."""
    top, left, h, w = (int(v) for v in box)
    out = cv2.resize(image[top:top + h, left:left + w], (size, size), interpolation=cv2.INTER_LINEAR)
    return out.reshape(size, size, image.shape[2])  # OpenCV drops a single band's axis


def jitter_matrix(image: np.ndarray, factors: Sequence[float]) -> np.ndarray:
    """The 3×4 float32 colour matrix ``[M | t]`` (``out = M·rgb + t``) of brightness, contrast, saturation ``factors``
    for the RGB ``image``, as ``A.ColorJitter`` defines them, in plain Python arithmetic."""
    b, c, s = (float(f) for f in factors)
    wr, wg, wb = LUMA
    k = b * c
    d = k * s  # diagonal part
    gr, gg, gb = (k * (1.0 - s) * w for w in LUMA)  # gray part (same in every row)
    t = 0.0
    if c != 1.0:
        mr, mg, mb = cv2.mean(image)[:3]
        t = b * (1.0 - c) * (wr * mr + wg * mg + wb * mb)
    return np.array([[d + gr, gg, gb, t], [gr, d + gg, gb, t], [gr, gg, d + gb, t]], np.float32)


def jitter_image(image: np.ndarray, factors: Sequence[float]) -> np.ndarray:
    """Brightness/contrast/saturation ``factors`` on a uint8 H×W×3 RGB image by one ``cv2.transform``, which
    rounds and saturates once (``A.ColorJitter`` also clips between the steps)."""
    if image.ndim != 3 or image.shape[2] != 3:
        raise TypeError(f"colour jitter needs H×W×3 RGB images, got shape {image.shape}")
    return cv2.transform(image, jitter_matrix(image, factors))


def jitter_bands(image: np.ndarray, factors: Sequence[float]) -> np.ndarray:
    """Brightness b and contrast c of ``factors`` on each band of an H×W×C multispectral image, around the band's
    own mean: ``b·(c·x + (1 − c)·mean)``, float32, not clipped (there is no saturation without colours)."""
    b, c = float(factors[0]), float(factors[1])
    pixels = image.astype(np.float32)
    mean = pixels.mean(axis=(0, 1), dtype=np.float64).astype(np.float32)
    return (b * c) * pixels + (b * (1.0 - c)) * mean


@dataclass(frozen=True)
class HostAugment(AugmentSettings):
    """Stored H×W×C images (uint8 RGB, or a multispectral dataset's bands) -> the normalised float32 (N, C, S, S)
    batch, with OpenCV, at the parameters of :meth:`~rsnet.data.augment_params.AugmentSettings.draw`."""

    def apply(self, images: Sequence[np.ndarray], indices: Sequence[int] | np.ndarray | torch.Tensor, seed: int = 0,
              epoch: int = 0) -> torch.Tensor:
        """Augment and normalise ``images`` of the samples ``indices`` with their draw of (``seed``, ``epoch``)."""
        height, width = np.asarray(images[0]).shape[:2]
        return self(images, self.draw(seed, epoch, indices, height, width))

    def __call__(self, images: Sequence[np.ndarray], params: AugmentParams) -> torch.Tensor:
        """Augment and normalise the H×W×C ``images`` (all of one size) with ``params`` from :meth:`draw`: uint8
        RGB pictures get colour jitter, other images brightness/contrast per band."""
        size = self.image_size
        height, width, channels = np.asarray(images[0]).shape
        rgb = channels == 3 and np.asarray(images[0]).dtype == np.uint8
        if params.dihedral is not None and height != width:
            raise ValueError(f"the 8 flips/rotations need square images, got {(height, width)}")
        boxes = params.source_boxes(height, width)
        if boxes is None and (height, width) != (size, size):
            boxes = np.tile(np.array([[0, 0, height, width]]), (len(images), 1))
        codes = params.dihedral_codes()
        jittered = params.jittered()
        factors = None if params.factors is None else params.factors.tolist()
        batch = np.empty((len(images), size, size, channels), np.uint8 if rgb else np.float32)
        for k, image in enumerate(images):
            out = np.asarray(image)
            if boxes is not None:
                out = resized_crop(out, boxes[k], size)
            if codes is not None:
                out = dihedral(out, DIHEDRAL_ELEMENTS[codes[k]])
            if jittered is not None and jittered[k]:
                out = jitter_image(out, factors[k]) if rgb else jitter_bands(out, factors[k])
            batch[k] = out
        return to_float_chw(batch, self.mean, self.std, self.max_pixel_value)


def train_transform(image_size: int, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                    scale: Sequence[float] | None = None, color_jitter: float = 0.2,
                    max_pixel_value: float = 255.0) -> HostAugment:
    """The host training augmentation: random resized crop (``scale``: its area range; None, the default as in the
    config: no crop), the 8 flips/rotations (aerial scenes have no canonical orientation), colour jitter
    (per-band brightness/contrast for multispectral bands) on half the images, normalisation."""
    return HostAugment.for_training(image_size, mean, std, scale, color_jitter, max_pixel_value)


def augmentation_options(augment: Mapping[str, Any] | None) -> dict[str, Any]:
    """:func:`train_transform` keyword arguments from the ``augment:`` settings. ``crop_scale`` defaults to no crop:
    images are cached at the working size, so a crop is an enlarged part of the cached image, and on aid-dev it
    cost accuracy at 64, 128 and 224 px (docs/models.md)."""
    augment = dict(augment or {})
    scale = augment.get("crop_scale")
    if scale is not None:
        try:
            low, high = (float(value) for value in scale)
        except (TypeError, ValueError):
            raise ValueError(f"augment.crop_scale must be null (no crop) or [min, max], got {scale!r}") from None
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"augment.crop_scale must satisfy 0 < min <= max <= 1, got {scale!r}")
        scale = (low, high)
    jitter = augment.get("color_jitter", 0.2)
    if not isinstance(jitter, (int, float)) or isinstance(jitter, bool) or not 0.0 <= jitter < 1.0:
        raise ValueError(f"augment.color_jitter must be a number in [0, 1), got {jitter!r}")
    return {"scale": scale, "color_jitter": float(jitter)}


def eval_transform(image_size: int, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                   max_pixel_value: float = 255.0) -> A.Compose:
    """Resize to the working size (no-op for cached images), normalize, to tensor."""
    return A.Compose([A.Resize(height=image_size, width=image_size, interpolation=cv2.INTER_AREA),
                      A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=max_pixel_value), ToTensorV2()])
