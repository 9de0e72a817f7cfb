"""The epoch's state copied off the live tensors, so that it can be written while the next epoch changes them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def host_snapshot(tree: T) -> T:
    """A deep copy of ``tree`` (dicts, lists and tuples of tensors and plain values, e.g. a checkpoint's payload) whose
    tensors are host copies of the live ones: a CUDA tensor is copied into page-locked memory without blocking, and
    one wait per device follows the last copy; a CPU tensor is cloned; strides (channels_last) are kept."""
    tensors = list(_tensors(tree))
    copies: dict[int, Any] = {id(tensor): _host_copy(tensor) for tensor in tensors}
    for device in {tensor.device for tensor in tensors if tensor.device.type == "cuda"}:
        torch.cuda.current_stream(device).synchronize()
    return copy.deepcopy(tree, memo=copies)


def _tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor of ``tree``'s dicts, lists and tuples."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, Mapping):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [tensor for item in tree for tensor in _tensors(item)]
    return []


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``tensor``: for a CUDA one, pinned and enqueued (valid once its stream is synchronised)."""
    tensor = tensor.detach()
    if tensor.device.type != "cuda":
        return tensor.to("cpu", copy=True)
    channels_last = (tensor.dim() == 4 and not tensor.is_contiguous()
                     and tensor.is_contiguous(memory_format=torch.channels_last))
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True,
                       memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return host.copy_(tensor, non_blocking=True)
