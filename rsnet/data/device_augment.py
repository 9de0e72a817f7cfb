"""Augmentation and normalisation of whole uint8 batches on the worker's device, in torch: :class:`DeviceAugment`
applies the host path's draw with a few vectorised ops per batch; evaluation uses it without randomness."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .augment_params import AugmentParams, AugmentSettings
from .transforms import LUMA

__all__ = ["DeviceAugment", "augments_on_device", "check_on_device", "resized_crops"]


def check_on_device(setting: object) -> None:
    """``augment.on_device`` must be auto, true or false; raises ValueError naming the setting."""
    if setting != "auto" and not isinstance(setting, bool):
        raise ValueError(f"augment.on_device={setting!r}: use auto (on GPU workers), true or false")


def augments_on_device(setting: object, device: torch.device) -> bool:
    """Whether a worker on ``device`` augments its batches here; ``auto``: on a GPU only, as on a CPU worker the
    host's OpenCV uint8 kernels are faster than torch's float passes."""
    check_on_device(setting)
    return device.type == "cuda" if setting == "auto" else bool(setting)


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
class DeviceAugment(AugmentSettings):
    """A stored (N, H, W, C) batch (uint8 RGB, or float32 bands) on any device -> the normalised float32 (N, C, S, S)
    model input, with the
    parameters of :meth:`~rsnet.data.augment_params.AugmentSettings.draw` (the settings are its fields)."""

    def apply(self, images: torch.Tensor, indices: Sequence[int] | np.ndarray | torch.Tensor, seed: int = 0,
              epoch: int = 0, memory_format: torch.memory_format = torch.channels_last) -> torch.Tensor:
        """Augment and normalise the uint8 batch ``images`` of the samples ``indices`` with their draw of
    (``seed``, ``epoch``)."""
        return self(images, self.draw(seed, epoch, indices, images.shape[1], images.shape[2]), memory_format)

    def __call__(self, images: torch.Tensor, params: AugmentParams,
                 memory_format: torch.memory_format = torch.channels_last) -> torch.Tensor:
        """Augment and normalise (N, H, W, C) ``images`` on their device with ``params`` from :meth:`draw`."""
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
        scale = torch.tensor([1.0 / (self.max_pixel_value * s) for s in self.std], device=device)
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
    """Brightness b, contrast c, saturation s per image on float (N, H, W, 3) pixels in [0, 255]: ``b·c·(s·x + (1 −
    s)·gray) + b·(1 − c)·mean(gray)``, clamped; on other band counts b and c per band (:func:`_jitter_bands`)."""
    n = pixels.shape[0]
    if pixels.shape[-1] != 3:
        return _jitter_bands(pixels, factors)
    b, c, s = factors.unbind(1)
    k = b * c
    gray = pixels @ torch.tensor(LUMA, device=pixels.device)
    offset = (b * (1 - c) * gray.mean((1, 2))).view(n, 1, 1)
    shift = torch.addcmul(offset, gray, (k * (1 - s)).view(n, 1, 1))
    return torch.addcmul(shift.unsqueeze(-1), pixels, (k * s).view(n, 1, 1, 1)).clamp_(0.0, 255.0)


def _jitter_bands(pixels: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Brightness b and contrast c per image on float (N, H, W, C) bands, each around its own mean:
    ``b·(c·x + (1 − c)·mean)``, not clipped (the host's :func:`~rsnet.data.transforms.jitter_bands`)."""
    n = pixels.shape[0]
    b, c = factors[:, 0].view(n, 1, 1, 1), factors[:, 1].view(n, 1, 1, 1)
    mean = pixels.mean((1, 2), keepdim=True)
    return torch.addcmul(b * (1 - c) * mean, pixels, b * c)
