"""Mixed precision of a forward pass on its device (``amp``, ``eval_amp``): the autocast dtype, bf16 or fp16 with
a gradient scaler for training's backward; float32 on a CPU. Shared by training (rsnet.engine) and evaluation."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "none": None}


def check_amp(value: Any, setting: str = "amp") -> str:
    """``amp`` (or ``setting``) must be one of :data:`AMP_DTYPES`; ValueError naming the setting otherwise."""
    if value not in AMP_DTYPES:
        raise ValueError(f"{setting}={value!r}: use bf16 (mixed precision in bfloat16), fp16 (float16 with a gradient "
                         "scaler) or none; it applies to CUDA workers only")
    return value


@dataclass
class StepPrecision:
    """The autocast dtype of a worker's forward pass and, for float16, the gradient scaler of its backward."""

    device: torch.device
    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None = None

    @classmethod
    def for_device(cls, amp: str, device: torch.device) -> StepPrecision:
        """Mixed precision as ``amp`` says on a CUDA device; float32 everywhere else."""
        dtype = AMP_DTYPES[check_amp(amp)] if device.type == "cuda" else None
        scaler = torch.amp.GradScaler("cuda") if dtype is torch.float16 else None
        return cls(device, dtype, scaler)

    def autocast(self) -> AbstractContextManager:
        return torch.autocast(self.device.type, dtype=self.dtype) if self.dtype is not None else nullcontext()

    def backward_and_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                          parameters: Iterable[nn.Parameter], max_grad_norm: float | None) -> None:
        """Backward, optional gradient clipping (on unscaled gradients) and the optimizer step. With fp16 the
        scaler skips a step whose gradients overflowed and lowers its scale."""
        if self.scaler is None:
            loss.backward()
            if max_grad_norm:
                torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
            optimizer.step()
            return
        self.scaler.scale(loss).backward()
        if max_grad_norm:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        self.scaler.step(optimizer)
        self.scaler.update()
