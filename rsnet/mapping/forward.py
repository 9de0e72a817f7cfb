"""Decoded windows to class probabilities on the worker's device, handed over as training's batches are: on a GPU
the samples travel in their own type from pinned memory without blocking, are normalised there, and the model runs
channels_last, in float32 (``amp=none``: the arithmetic of a CPU up to rounding) or under autocast (``bf16``,
``fp16``); on a CPU, as rsnet-predict classifies files."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from rsnet.data.raster import max_pixel_value
from rsnet.precision import StepPrecision

if TYPE_CHECKING:
    from rsnet.inference import Predictor


class WindowClassifier:
    """Calls ``predictor`` on batches of decoded windows, (N, H, W, C) -> (N, classes) float32 probabilities."""

    def __init__(self, predictor: Predictor, amp: str = "none") -> None:
        self.predictor = predictor
        self.device = predictor.device
        self._precision = StepPrecision.for_device(amp, self.device)
        if self.device.type == "cuda":
            scale = max_pixel_value(predictor.bands)
            shape = (1, len(predictor.mean), 1, 1)
            self._mean = torch.tensor(predictor.mean, device=self.device).reshape(shape) * scale
            self._std = torch.tensor(predictor.std, device=self.device).reshape(shape) * scale
            if isinstance(predictor.full_model, torch.nn.Module):
                predictor.full_model.to(memory_format=torch.channels_last)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        if len(images) == 0:
            return np.empty((0, len(self.predictor.class_names)), np.float32)
        if self.device.type != "cuda":
            return self.predictor.probabilities(self.predictor.preprocess(images)).numpy()
        host = torch.from_numpy(np.ascontiguousarray(images)).pin_memory()
        batch = host.to(self.device, non_blocking=True).permute(0, 3, 1, 2).float()
        batch = ((batch - self._mean) / self._std).contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), self._precision.autocast():
            logits = self.predictor.forward(batch)
        return torch.softmax(logits.float(), dim=1).cpu().numpy()

    def probe(self, windows: int) -> float:
        """Seconds this device takes to classify ``windows`` random windows (after one untimed warm-up batch)."""
        size, channels = self.predictor.image_size, len(self.predictor.mean)
        dtype = np.uint8 if self.predictor.bands is None else np.dtype(self.predictor.bands.dtype)
        images = np.random.default_rng(0).integers(0, 200, (windows, size, size, channels)).astype(dtype)
        self(images[:1])
        started = time.perf_counter()
        self(images)
        return time.perf_counter() - started
