"""How a training step runs on its device: channels_last, ``torch.compile`` and deterministic algorithms; a CPU
worker steps in NCHW, with only the last two. Mixed precision (the autocast dtype, the gradient scaler):
:mod:`rsnet.precision`, which evaluation shares."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


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
