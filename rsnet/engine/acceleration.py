"""How a training step runs on its device: mixed precision (bf16, or fp16 with a gradient scaler), channels_last,
``torch.compile`` and deterministic algorithms; a CPU worker steps in float32, NCHW, with only the last two."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
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


def use_channels_last(config: dict[str, Any], device: torch.device) -> bool:
    """channels_last (NHWC) memory format for model and batches: CUDA workers with ``channels_last=true``."""
    return bool(config["channels_last"]) and device.type == "cuda"


def memory_format(config: dict[str, Any], device: torch.device) -> torch.memory_format:
    """The memory format of the model and its batches on ``device``: channels_last where :func:`use_channels_last`."""
    return torch.channels_last if use_channels_last(config, device) else torch.contiguous_format


def compiled_forward(module: nn.Module, config: dict[str, Any], fixed_batch_sizes: bool) -> Callable[..., Any]:
    """``torch.compile(module)`` when ``compile=true``, else the module itself: for static shapes (once per size)
    when the strategy's batch sizes are fixed for the run, else for a dynamic batch dimension."""
    return torch.compile(module, dynamic=not fixed_batch_sizes) if config["compile"] else module


def tune_convolutions(config: dict[str, Any], device: torch.device) -> None:
    """cuDNN's autotuner (``cudnn.benchmark``) on CUDA workers: every batch size lies on the scheduler's grid, so each
    shape is tuned once and reused. Off with ``deterministic=true``."""
    if device.type == "cuda" and not config["deterministic"]:
        torch.backends.cudnn.benchmark = True


def set_deterministic(config: dict[str, Any]) -> None:
    """``deterministic=true``: deterministic algorithms only (an op without one raises), no cuDNN autotuning;
    ``false``: torch's default, also where an earlier run in this process asked for determinism."""
    deterministic = bool(config["deterministic"])
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for deterministic GEMMs
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(deterministic)
