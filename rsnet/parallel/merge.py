"""Model merging: θ ← Σ_i p_i θ_i over parameters and buffers (elastic: θ_i moved α of the way), p_i = w_i / Σ_j w_j, by
all-reduces over flat buckets of one dtype after a small float64 header; integer buffers take rank 0's value."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

BUCKET_BYTES = 32 * 1024 * 1024


@dataclass
class MergeResult:
    """``meta``: the all-reduced meta vector; ``total_weight``: Σ_j w_j; ``idle_s``: time in the first
    (meta) all-reduce, i.e. waiting for the slowest worker; ``merge_s``: the whole merge."""

    meta: torch.Tensor
    total_weight: float
    idle_s: float
    merge_s: float


def merge_tensors(module: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(floating tensors, integer tensors) of a module's parameters and buffers, in a fixed order."""
    floating: list[torch.Tensor] = []
    integer: list[torch.Tensor] = []
    for tensor in list(module.parameters()) + list(module.buffers()):
        (floating if tensor.is_floating_point() or tensor.is_complex() else integer).append(tensor)
    return floating, integer


def _buckets(tensors: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of one dtype and device, each at most ``bucket_bytes`` (a big tensor gets its own)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if (not buckets or buckets[-1][0].dtype != tensor.dtype or buckets[-1][0].device != tensor.device
                or size + nbytes > bucket_bytes):
            buckets.append([])
            size = 0
        buckets[-1].append(tensor)
        size += nbytes
    return buckets


def pack_header(weight: float, meta: torch.Tensor, integer: list[torch.Tensor], primary: bool,
                device: torch.device) -> torch.Tensor:
    """The merge's first all-reduce as one float64 vector on ``device``: [w_i, 1, meta..., integer buffers (the
    primary's values, zeros elsewhere)], every part moved to ``device`` first."""
    # The 1 sums to the number of workers: the divisor of the uniform average used when every weight is 0 (no worker
    # updated in the interval): the weights alone would divide by zero there, and the replicas must still agree.
    parts = [torch.tensor([weight, 1.0], dtype=torch.float64, device=device),
             meta.to(device=device, dtype=torch.float64)]
    parts += [t.detach().reshape(-1).to(device=device, dtype=torch.float64) * (1.0 if primary else 0.0)
              for t in integer]
    return torch.cat(parts)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def normalized_merge(module: nn.Module, weight: float, meta: torch.Tensor | None = None,
                     comm_device: torch.device | str | None = None, bucket_bytes: int = BUCKET_BYTES,
                     elastic: float = 1.0, tensors: bool = True) -> MergeResult:
    """Replace ``module``'s parameters and buffers by the average over all workers weighted by ``weight``, in place;
    ``meta`` is summed alongside Σ w, ``elastic`` is α (θ_i ← θ_i + α(θ̄ − θ_i)), ``tensors=False``: the header only."""
    started = time.perf_counter()
    if dist.get_world_size() == 1:
        own = meta.detach().to(torch.float64).flatten().clone() if meta is not None else torch.zeros(0)
        return MergeResult(meta=own, total_weight=float(weight), idle_s=0.0, merge_s=0.0)
    floating, integer = merge_tensors(module)
    params_device = floating[0].device if floating else torch.device("cpu")
    comm = torch.device(comm_device) if comm_device is not None else params_device
    extra = meta.detach().to(torch.float64).flatten() if meta is not None else torch.zeros(0, dtype=torch.float64)
    header = pack_header(float(weight), extra, integer, dist.get_rank() == 0, comm)
    _synchronize(params_device)
    wait_started = time.perf_counter()
    dist.all_reduce(header)
    idle = time.perf_counter() - wait_started
    header = header.cpu()
    total, count = float(header[0]), float(header[1])
    uniform = total <= 0.0
    scale = 1.0 / count if uniform else float(weight) / total
    reduced_meta = header[2:2 + extra.numel()].clone()
    offset = 2 + extra.numel()
    with torch.no_grad():
        for tensor in integer if tensors else []:
            n = tensor.numel()
            tensor.copy_(header[offset:offset + n].round().view_as(tensor).to(tensor.dtype))
            offset += n
        for bucket in _buckets(floating, bucket_bytes) if tensors else []:
            flat = torch.cat([t.detach().reshape(-1) for t in bucket]).to(comm)
            flat.mul_(scale)
            dist.all_reduce(flat)
            flat = flat.to(params_device)
            position = 0
            for tensor in bucket:
                n = tensor.numel()
                average = flat[position:position + n].view_as(tensor)
                if elastic >= 1.0:
                    tensor.copy_(average)
                else:
                    tensor.lerp_(average.to(tensor.dtype), elastic)
                position += n
    _synchronize(params_device)
    return MergeResult(meta=reduced_meta, total_weight=total, idle_s=idle, merge_s=time.perf_counter() - started)


def average_buffers(buffers: Iterable[torch.Tensor], comm_device: torch.device | str | None = None) -> None:
    """Uniform average of floating buffers (BatchNorm statistics); integer buffers take rank 0's value."""
    holder = nn.Module()
    for index, buffer in enumerate(buffers):
        holder.register_buffer(f"b{index}", buffer, persistent=False)
    if len(list(holder.buffers())):
        normalized_merge(holder, 1.0, comm_device=comm_device)
