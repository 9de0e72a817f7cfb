"""Augmentation and normalisation of whole uint8 batches on the worker's device (GPU or CPU), in torch.

The cache holds uint8 pixels at the working size, so all a host thread must do for a worker is gather a uint8
(N, H, W, C) batch (a quarter of float32's bytes to upload); :class:`DeviceAugment` turns it into the model's
normalised float input on the device with a few vectorised ops for the whole batch:

1. the 8 flips/rotations of the square (three independent coin flips: transpose, upside down, left-right — a
   uniform draw over the dihedral group, as ``A.D4``), on the uint8 pixels;
2. random resized crop (torchvision's draw of :func:`~rsnet.data.transforms.crop_box`), resized with OpenCV's
   ``INTER_LINEAR`` sampling (half-pixel centres, edges clamped inside the crop) as two separable gathers;
3. brightness/contrast/saturation jitter on a share of the images, as one 3×3 colour matrix per image
   (:class:`~rsnet.data.transforms.ColorJitterAffine`'s map: ``b·c·Sat_s(x) + b·(1 − c)·mean(gray(x))``), clamped
   to [0, 255];
4. normalisation, written in NHWC order: the result is an (N, C, S, S) view in ``torch.channels_last`` (or a
   contiguous copy when the model wants that).

Random parameters are drawn on the host per sample from (seed, epoch, dataset index) by a counter-based hash
(:func:`sample_uniforms`), so an image's augmentation depends neither on the worker that trains it, nor on the
batch it is in, nor on the order of the claims: a run is reproducible from its seed whatever the scheduler did.
Evaluation uses the same class without dihedral, crop and jitter (normalise, and resize if the stored size is not
the working size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .transforms import COLOR_JITTER_P, LUMA

__all__ = ["AugmentParams", "DeviceAugment", "augments_on_device", "check_on_device", "resized_crops",
           "sample_uniforms"]

_MASK64 = (1 << 64) - 1
_CROP_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before the central crop
# columns of the per-sample uniforms: dihedral bits, jitter draw, jitter factors, crop attempts, crop corner
_DIHEDRAL, _JITTER_ON, _FACTORS = slice(0, 3), 3, slice(4, 7)
_AREAS = slice(7, 7 + _CROP_ATTEMPTS)
_RATIOS = slice(7 + _CROP_ATTEMPTS, 7 + 2 * _CROP_ATTEMPTS)
_TOP, _LEFT = 7 + 2 * _CROP_ATTEMPTS, 8 + 2 * _CROP_ATTEMPTS
_DRAWS = 9 + 2 * _CROP_ATTEMPTS


def check_on_device(setting: object) -> None:
    """``augment.on_device`` must be auto, true or false; raises ValueError naming the setting."""
    if setting != "auto" and not isinstance(setting, bool):
        raise ValueError(f"augment.on_device={setting!r}: use auto (on GPU workers), true or false")


def augments_on_device(setting: object, device: torch.device) -> bool:
    """Whether a worker on ``device`` augments its batches here: ``augment.on_device`` true or false, or auto — on a
    GPU (on a CPU worker the host's OpenCV pipeline is the faster one: uint8 SIMD kernels against torch's float
    passes, docs/data.md)."""
    check_on_device(setting)
    return device.type == "cuda" if setting == "auto" else bool(setting)


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
    """(N, 4) int64 boxes (top, left, h, w): :func:`~rsnet.data.transforms.crop_box`'s draw, vectorised (10
    attempts, the first that fits, else the central crop with the ratio clamped)."""
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


def _taps(start: torch.Tensor, length: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OpenCV ``INTER_LINEAR`` source taps along one axis for crops [start, start + length) resized to ``size``:
    (N, size) first and second tap and the second tap's weight; taps stay inside the crop."""
    centre = (torch.arange(size, device=start.device, dtype=torch.float32) + 0.5)
    position = (centre[None] * (length.float() / size)[:, None] - 0.5).clamp_(min=0)
    first = position.floor()
    weight = position - first
    last = (length - 1)[:, None]
    first = first.long()
    weight = torch.where(first >= last, torch.zeros_like(weight), weight)
    first = torch.minimum(first, last)
    second = torch.minimum(first + 1, last)
    return start[:, None] + first, start[:, None] + second, weight


def resized_crops(images: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 or float (N, H, W, C) images, (N, 4) boxes (top, left, h, w) -> float32 (N, size, size, C): each
    image's box resized bilinearly as ``cv2.resize(..., INTER_LINEAR)`` does (rows first, then columns)."""
    boxes = boxes.to(images.device)
    top, left, height, width = boxes.unbind(1)
    y0, y1, wy = _taps(top, height, size)
    x0, x1, wx = _taps(left, width, size)
    sample = torch.arange(len(images), device=images.device)[:, None]
    rows = torch.lerp(images[sample, y0].float(), images[sample, y1].float(), wy[:, :, None, None])
    row = torch.arange(size, device=images.device)[None, :, None]
    sample = sample[:, :, None]
    return torch.lerp(rows[sample, row, x0[:, None, :]], rows[sample, row, x1[:, None, :]], wx[:, None, :, None])


@dataclass(frozen=True)
class AugmentParams:
    """Per-sample parameters of one batch (host tensors): ``dihedral`` (N, 3) bool (transpose, upside down,
    left-right), ``factors`` (N, 3) float32 brightness/contrast/saturation (1 = unchanged), ``boxes`` (N, 4) int64
    crop boxes or None."""

    dihedral: torch.Tensor | None
    factors: torch.Tensor | None
    boxes: torch.Tensor | None


@dataclass(frozen=True)
class DeviceAugment:
    """A uint8 (N, H, W, C) batch on any device -> the normalised float32 (N, C, S, S) model input.

    ``crop_scale``: the random resized crop's area range (None: no crop); ``color_jitter``: brightness/contrast/
    saturation strength, applied to a ``jitter_p`` share of the images (0: none); ``dihedral``: the 8 flips and
    rotations. All three off: evaluation's normalisation (and a resize when the stored size differs)."""

    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_scale: tuple[float, float] | None = None
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    color_jitter: float = 0.0
    jitter_p: float = 0.5
    dihedral: bool = False

    @classmethod
    def for_training(cls, image_size: int, mean: Sequence[float], std: Sequence[float],
                     scale: Sequence[float] | None, color_jitter: float) -> DeviceAugment:
        """The training augmentation of :func:`~rsnet.data.transforms.train_transform` with the same settings
        (``augment:`` via :func:`~rsnet.data.transforms.augmentation_options`): crop, 8 flips/rotations, jitter."""
        crop = None if scale is None else (float(scale[0]), float(scale[1]))
        return cls(int(image_size), tuple(mean), tuple(std), crop,
                   color_jitter=float(color_jitter), jitter_p=COLOR_JITTER_P, dihedral=True)

    @property
    def augments(self) -> bool:
        """Whether the batch is augmented (random), or only normalised."""
        return self.dihedral or self.crop_scale is not None or self.color_jitter > 0

    def draw(self, seed: int, epoch: int, indices: Sequence[int] | np.ndarray | torch.Tensor, height: int,
             width: int) -> AugmentParams:
        """The parameters of the samples ``indices`` (dataset positions) of ``epoch`` for images of
        ``height`` × ``width``: a pure function of (seed, epoch, index) per sample."""
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

    def apply(self, images: torch.Tensor, indices: Sequence[int] | np.ndarray | torch.Tensor, seed: int = 0,
              epoch: int = 0, memory_format: torch.memory_format = torch.channels_last) -> torch.Tensor:
        """Augment and normalise the uint8 batch ``images`` of the samples ``indices`` with their parameters of
        (``seed``, ``epoch``): :meth:`draw` and the call in one."""
        return self(images, self.draw(seed, epoch, indices, images.shape[1], images.shape[2]), memory_format)

    def __call__(self, images: torch.Tensor, params: AugmentParams,
                 memory_format: torch.memory_format = torch.channels_last) -> torch.Tensor:
        """Augment and normalise ``images`` (uint8 (N, H, W, C), on the device that should do the work) with
        ``params`` from :meth:`draw`; returns float32 (N, C, S, S) in ``memory_format``."""
        n, height, width, channels = images.shape
        device = images.device
        if params.dihedral is not None:
            images = _dihedral(images, params.dihedral.cpu())
        if params.boxes is not None:
            pixels = resized_crops(images, params.boxes, self.image_size)
        elif (height, width) != (self.image_size, self.image_size):
            full = torch.tensor([[0, 0, height, width]], dtype=torch.int64).expand(n, 4)
            pixels = resized_crops(images, full, self.image_size)
        else:
            pixels = images.float()
        if params.factors is not None:
            pixels = _jitter(pixels, params.factors.to(device))
        scale = torch.tensor([1.0 / (255.0 * s) for s in self.std], device=device)
        shift = torch.tensor([-m / s for m, s in zip(self.mean, self.std)], device=device)
        out = torch.addcmul(shift, pixels, scale).permute(0, 3, 1, 2)  # NHWC memory: a channels_last view
        return out.contiguous(memory_format=memory_format)


def _dihedral(images: torch.Tensor, flags: torch.Tensor) -> torch.Tensor:
    """Per-sample transpose, upside down, left-right of square (N, S, S, C) images (``flags``: (N, 3) bool on the
    host): the samples of each of the 8 symmetries are moved as one group (one gather, one strided copy)."""
    if images.shape[1] != images.shape[2]:
        raise ValueError(f"the 8 flips/rotations need square images, got {tuple(images.shape[1:3])}")
    code = (flags.long() * torch.tensor([4, 2, 1])).sum(1)
    if bool((code == 0).all()):
        return images
    out = torch.empty_like(images)
    for element in range(8):
        members = (code == element).nonzero().squeeze(1)
        if len(members) == 0:
            continue
        members = members.to(images.device)
        group = images.index_select(0, members)
        if element & 4:
            group = group.transpose(1, 2)
        if element & 2:
            group = group.flip(1)
        if element & 1:
            group = group.flip(2)
        out.index_copy_(0, members, group.contiguous())
    return out


def _jitter(pixels: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Brightness b, contrast c, saturation s per image on float (N, H, W, 3) pixels in [0, 255]:
    ``b·c·(s·x + (1 − s)·gray) + b·(1 − c)·mean(gray)``, clamped (``ColorJitterAffine``'s colour matrix as two
    fused multiply-adds: the gray part is the same in every channel)."""
    if pixels.shape[-1] != 3:
        raise ValueError(f"colour jitter needs RGB images, got {pixels.shape[-1]} channels")
    n = pixels.shape[0]
    b, c, s = factors.unbind(1)
    k = b * c
    gray = pixels @ torch.tensor(LUMA, device=pixels.device)
    offset = (b * (1 - c) * gray.mean((1, 2))).view(n, 1, 1)
    shift = torch.addcmul(offset, gray, (k * (1 - s)).view(n, 1, 1))
    return torch.addcmul(shift.unsqueeze(-1), pixels, (k * s).view(n, 1, 1, 1)).clamp_(0.0, 255.0)
