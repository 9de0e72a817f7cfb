"""The training augmentation's one random draw, shared by the host path (OpenCV) and the device path (torch): a pure
function of (seed, epoch, dataset index), whichever worker claims the image (docs/data.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

__all__ = ["COLOR_JITTER_P", "DIHEDRAL_ELEMENTS", "AugmentParams", "AugmentSettings", "sample_uniforms"]

COLOR_JITTER_P = 0.5  # share of the training images whose colours are jittered
# The 8 symmetries of the square, named as albumentations' D4 names them, by dihedral code
# 4·transpose + 2·upside down + left-right (applied in that order).
DIHEDRAL_ELEMENTS = ("e", "h", "v", "r180", "t", "r270", "r90", "hvt")

_MASK64 = (1 << 64) - 1
_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before the central crop
# columns of the per-sample uniforms: dihedral bits, jitter draw, jitter factors, crop attempts, crop corner
_DIHEDRAL, _JITTER_ON, _FACTORS = slice(0, 3), 3, slice(4, 7)
_AREAS = slice(7, 7 + _CROP_ATTEMPTS)
_RATIOS = slice(7 + _CROP_ATTEMPTS, 7 + 2 * _CROP_ATTEMPTS)
_TOP, _LEFT = 7 + 2 * _CROP_ATTEMPTS, 8 + 2 * _CROP_ATTEMPTS
_DRAWS = 9 + 2 * _CROP_ATTEMPTS


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_uniforms(seed: int, epoch: int, indices: Sequence[int] | np.ndarray, count: int) -> np.ndarray:
    """(N, ``count``) float64 uniforms in [0, 1): column j of row n is a pure function of (seed, epoch,
    ``indices[n]``, j) — a splitmix64 hash of the four, so draws never depend on how samples were batched."""
    key = (int(seed) * 0x9E3779B97F4A7C15 + (int(epoch) + 1) * 0xD1B54A32D192ED03) & _MASK64
    index = np.asarray(indices, np.int64).astype(np.uint64).reshape(-1, 1)
    column = np.arange(count, dtype=np.uint64).reshape(1, -1)
    with np.errstate(over="ignore"):
        per_sample = _mix64(np.uint64(key) + index * np.uint64(0x9E3779B97F4A7C15))
        bits = _mix64(per_sample + (column + np.uint64(1)) * np.uint64(0xD6E8FEB86659FD93))
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _crop_boxes(u: np.ndarray, height: int, width: int, scale: tuple[float, float],
                ratio: tuple[float, float]) -> np.ndarray:
    """(N, 4) int64 boxes (top, left, h, w): torchvision's ``RandomResizedCrop.get_params`` vectorised (10
    attempts, then the central crop with the aspect ratio clamped to ``ratio``)."""
    area = height * width * (scale[0] + (scale[1] - scale[0]) * u[:, _AREAS])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, _RATIOS])
    w = np.rint(np.sqrt(area * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(area / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.argmax(axis=1)
    rows = np.arange(len(u))
    h, w = h[rows, first], w[rows, first]
    in_ratio = width / height
    if in_ratio < min(ratio):
        central = (width, int(round(width / min(ratio))))
    elif in_ratio > max(ratio):
        central = (int(round(height * max(ratio))), height)
    else:
        central = (width, height)
    missed = ~fits.any(axis=1)
    w[missed], h[missed] = central
    top = np.floor(u[:, _TOP] * (height - h + 1)).astype(np.int64)
    left = np.floor(u[:, _LEFT] * (width - w + 1)).astype(np.int64)
    top[missed], left[missed] = (height - h[missed]) // 2, (width - w[missed]) // 2
    return np.stack([top, left, h, w], axis=1)


@dataclass(frozen=True)
class AugmentParams:
    """Per-sample parameters of one batch (None: no such step): ``dihedral`` (N, 3) bool (transpose, upside down,
    left-right), ``factors`` (N, 3) brightness/contrast/saturation, ``boxes`` (N, 4) crop boxes."""

    dihedral: torch.Tensor | None
    factors: torch.Tensor | None
    boxes: torch.Tensor | None

    def dihedral_codes(self) -> np.ndarray | None:
        """(N,) int64 codes 4·transpose + 2·upside down + left-right (:data:`DIHEDRAL_ELEMENTS` names them)."""
        if self.dihedral is None:
            return None
        return self.dihedral.numpy().astype(np.int64) @ np.array([4, 2, 1])

    def jittered(self) -> np.ndarray | None:
        """(N,) bool: whose colours are jittered (factors other than 1)."""
        return None if self.factors is None else (self.factors.numpy() != 1.0).any(axis=1)

    def source_boxes(self, height: int, width: int) -> np.ndarray | None:
        """(N, 4) int64 crop boxes in the frame of the image before its flip/rotation, so the host can crop and
    resize first, then flip/rotate, for the same pixels."""
        if self.boxes is None:
            return None
        top, left, h, w = (column.copy() for column in self.boxes.numpy().T)
        if self.dihedral is None:
            return np.stack([top, left, h, w], axis=1)
        transpose, upside_down, left_right = self.dihedral.numpy().T
        frame_h, frame_w = np.where(transpose, width, height), np.where(transpose, height, width)
        left = np.where(left_right, frame_w - left - w, left)
        top = np.where(upside_down, frame_h - top - h, top)
        return np.stack([np.where(transpose, left, top), np.where(transpose, top, left),
                         np.where(transpose, w, h), np.where(transpose, h, w)], axis=1)


@dataclass(frozen=True)
class AugmentSettings:
    """The augmentation's settings and draw: ``crop_scale``, the crop's area range (None: no crop); ``color_jitter`` on
    a ``jitter_p`` share of the images; nothing set: it only normalises, ``(x / max_pixel_value - mean) / std``
    (``max_pixel_value`` 1 for a multispectral dataset's bands, whose mean/std are in their own units)."""

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_scale: tuple[float, float] | None = None
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    color_jitter: float = 0.0
    jitter_p: float = COLOR_JITTER_P
    dihedral: bool = False
    max_pixel_value: float = 255.0

    @classmethod
    def for_training(cls, image_size: int, mean: Sequence[float], std: Sequence[float],
                     scale: Sequence[float] | None, color_jitter: float,
                     max_pixel_value: float = 255.0) -> AugmentSettings:
        """The training augmentation: crop, 8 flips/rotations, jitter (see ``augmentation_options``)."""
        crop = None if scale is None else (float(scale[0]), float(scale[1]))
        return cls(int(image_size), tuple(float(m) for m in mean), tuple(float(s) for s in std), crop,
                   color_jitter=float(color_jitter), jitter_p=COLOR_JITTER_P, dihedral=True,
                   max_pixel_value=float(max_pixel_value))

    @property
    def augments(self) -> bool:
        """Whether the batch is augmented (random), or only normalised."""
        return self.dihedral or self.crop_scale is not None or self.color_jitter > 0

    def draw(self, seed: int, epoch: int, indices: Sequence[int] | np.ndarray | torch.Tensor, height: int,
             width: int) -> AugmentParams:
        """The parameters of the samples ``indices`` (dataset positions) of ``epoch`` for ``height`` × ``width``
    images."""
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        if not self.augments:
            return AugmentParams(None, None, None)
        u = sample_uniforms(seed, epoch, indices, _DRAWS)
        dihedral = torch.from_numpy(u[:, _DIHEDRAL] < 0.5) if self.dihedral else None
        factors = None
        if self.color_jitter > 0:
            low, high = max(0.0, 1.0 - self.color_jitter), 1.0 + self.color_jitter
            drawn = low + (high - low) * u[:, _FACTORS]
            drawn[u[:, _JITTER_ON] >= self.jitter_p] = 1.0
            factors = torch.from_numpy(drawn.astype(np.float32))
        boxes = None
        if self.crop_scale is not None:
            boxes = torch.from_numpy(_crop_boxes(u, height, width, self.crop_scale, self.crop_ratio))
        return AugmentParams(dihedral, factors, boxes)
