"""Model merging: θ ← Σ_i p_i θ_i over the members' parameters and buffers (elastic: θ_i moved α of the way),
p_i = w_i / Σ_j w_j, by all-reduces over flat buckets of one dtype after a small float64 header that every worker
joins; integer buffers take the first member's value."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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


def pack_header(weight: float, member: bool, meta: torch.Tensor, integer: list[torch.Tensor], source: bool,
                device: torch.device) -> torch.Tensor:
    """The merge's first all-reduce as one float64 vector on ``device``: [w_i, 1 for a member (0 else), meta...,
    integer buffers (the ``source``'s values, zeros elsewhere)], every part moved to ``device`` first."""
    # The count sums to the number of members: the divisor of the uniform average used when every weight is 0 (no
    # member updated in the interval): the weights alone would divide by zero there, and the replicas must still agree.
    parts = [torch.tensor([weight if member else 0.0, 1.0 if member else 0.0], dtype=torch.float64, device=device),
             meta.to(device=device, dtype=torch.float64)]
    parts += [t.detach().reshape(-1).to(device=device, dtype=torch.float64) * (1.0 if source else 0.0)
              for t in integer]
    return torch.cat(parts)


def merge_share(weight: float, total: float, members: float) -> float:
    """p_i = w_i / Σ_j w_j of a member; 1 / (number of members) where every weight is 0 (a uniform average)."""
    if members <= 0:
        raise ValueError("a merge needs at least one member")
    return 1.0 / members if total <= 0.0 else float(weight) / total


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_GROUPS: dict[tuple[int, tuple[int, ...]], Any] = {}


def members_group(members: Sequence[int]) -> Any:
    """The process group of ``members`` (None: every worker). Made once per set and process group; making it is a
    collective of every worker, which the merges call at the same point with the same members."""
    ranks = tuple(sorted(int(r) for r in members))
    if len(ranks) == dist.get_world_size():
        return None
    key = (id(dist.group.WORLD), ranks)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks))
    return _GROUPS[key]


def exchange_table(meta: torch.Tensor, comm_device: torch.device | str | None = None) -> MergeResult:
    """The merge's header alone: ``meta`` summed over every worker (the table the schedule moves on from), no
    tensor merged."""
    started = time.perf_counter()
    own = meta.detach().to(torch.float64).flatten()
    if dist.get_world_size() == 1:
        return MergeResult(meta=own.clone(), total_weight=0.0, idle_s=0.0, merge_s=0.0)
    header = own.to(torch.device(comm_device) if comm_device is not None else own.device)
    dist.all_reduce(header)
    idle = time.perf_counter() - started
    return MergeResult(meta=header.cpu(), total_weight=0.0, idle_s=idle, merge_s=time.perf_counter() - started)


def normalized_merge(module: nn.Module, weight: float, meta: torch.Tensor | None = None,
                     comm_device: torch.device | str | None = None, members: Sequence[int] | None = None,
                     bucket_bytes: int = BUCKET_BYTES, elastic: float = 1.0) -> MergeResult:
    """Replace each member's parameters and buffers by the members' average weighted by ``weight``, in place;
    ``members``: the ranks whose replicas merge (None: every worker; the others keep theirs and join the header
    only, where ``meta`` is summed over every worker alongside Σ w); ``elastic`` is α (θ_i ← θ_i + α(θ̄ − θ_i));
    integer buffers take the first member's values. Every worker calls it, with the same ``members``."""
    started = time.perf_counter()
    world, rank = dist.get_world_size(), dist.get_rank()
    ranks = _member_ranks(members, world)
    if not ranks:
        raise ValueError("normalized_merge needs at least one member")
    if world == 1:
        own = meta.detach().to(torch.float64).flatten().clone() if meta is not None else torch.zeros(0)
        return MergeResult(meta=own, total_weight=float(weight), idle_s=0.0, merge_s=0.0)
    member = rank in ranks
    floating, integer = merge_tensors(module)
    params_device = floating[0].device if floating else torch.device("cpu")
    comm = torch.device(comm_device) if comm_device is not None else params_device
    extra = meta.detach().to(torch.float64).flatten() if meta is not None else torch.zeros(0, dtype=torch.float64)
    header = pack_header(float(weight), member, extra, integer, rank == ranks[0], comm)
    _synchronize(params_device)
    wait_started = time.perf_counter()
    dist.all_reduce(header)
    idle = time.perf_counter() - wait_started
    header = header.cpu()
    total = float(header[0])
    reduced_meta = header[2:2 + extra.numel()].clone()
    group = members_group(ranks)  # every worker makes a new group: before any returns
    if member and len(ranks) > 1:
        _merge_tensors(floating, integer, header[2 + extra.numel():], merge_share(weight, total, float(header[1])),
                       comm, params_device, group, bucket_bytes, elastic)
    _synchronize(params_device)
    return MergeResult(meta=reduced_meta, total_weight=total, idle_s=idle, merge_s=time.perf_counter() - started)


def _merge_tensors(floating: list[torch.Tensor], integer: list[torch.Tensor], integer_values: torch.Tensor,
                   share: float, comm: torch.device, params_device: torch.device, group: Any, bucket_bytes: int,
                   elastic: float) -> None:
    """A member's part of the merge: integer buffers from the header, floating ones by bucketed all-reduces of
    ``share`` × θ_i over ``group``."""
    offset = 0
    with torch.no_grad():
        for tensor in integer:
            n = tensor.numel()
            tensor.copy_(integer_values[offset:offset + n].round().view_as(tensor).to(tensor.dtype))
            offset += n
        for bucket in _buckets(floating, bucket_bytes):
            flat = _flat(bucket, comm).mul_(share)
            dist.all_reduce(flat, group=group)
            _move_towards(bucket, flat.to(params_device), elastic)


def _member_ranks(members: Sequence[int] | None, world: int) -> list[int]:
    """The sorted ranks of ``members`` (None: every worker)."""
    return sorted(range(world) if members is None else {int(r) for r in members})


def _flat(bucket: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A bucket's tensors as one flat tensor on ``device`` (a copy)."""
    return torch.cat([t.detach().reshape(-1) for t in bucket]).to(device)


def _move_towards(bucket: list[torch.Tensor], flat: torch.Tensor, elastic: float) -> None:
    """Each tensor of ``bucket`` becomes its slice of ``flat`` (elastic < 1: moves that part of the way there)."""
    position = 0
    for tensor in bucket:
        n = tensor.numel()
        target = flat[position:position + n].view_as(tensor)
        if elastic >= 1.0:
            tensor.copy_(target)
        else:
            tensor.lerp_(target.to(tensor.dtype), elastic)
        position += n


def broadcast_module(module: nn.Module, source: int = 0, comm_device: torch.device | str | None = None,
                     members: Sequence[int] | None = None, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Make the parameters and buffers of ``members`` (None: every worker; ``source`` among them) ``source``'s, in
    place. Every worker calls it, with the same arguments."""
    if dist.get_world_size() == 1:
        return
    ranks = sorted(set(_member_ranks(members, dist.get_world_size())) | {int(source)})
    group = members_group(ranks)
    if dist.get_rank() not in ranks or len(ranks) == 1:
        return
    floating, integer = merge_tensors(module)
    tensors = floating + integer
    params_device = tensors[0].device if tensors else torch.device("cpu")
    comm = torch.device(comm_device) if comm_device is not None else params_device
    _synchronize(params_device)
    with torch.no_grad():
        for bucket in _buckets(tensors, bucket_bytes):
            flat = _flat(bucket, comm)
            dist.broadcast(flat, src=int(source), group=group)
            _move_towards(bucket, flat.to(params_device), 1.0)
    _synchronize(params_device)


def average_buffers(buffers: Iterable[torch.Tensor], comm_device: torch.device | str | None = None) -> None:
    """Uniform average of floating buffers (BatchNorm statistics); integer buffers take rank 0's value."""
    holder = nn.Module()
    for index, buffer in enumerate(buffers):
        holder.register_buffer(f"b{index}", buffer, persistent=False)
    if len(list(holder.buffers())):
        normalized_merge(holder, 1.0, comm_device=comm_device)
