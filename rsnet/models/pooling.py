"""The main branch's pooling (``model.options.main_pool``): the pools, the CAM terms whose means are their outputs,
and :func:`set_main_pool`, which puts one into a timm classifier in place of its global average."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import ClassifierHead, SelectAdaptivePool2d
from torch import Tensor, nn

from rsnet.models.timm_classifier import BackboneError

# How the main branch pools its map into its classifier (``model.options.main_pool``; docs/models.md, "The main
# branch's pooling"): avg is timm's own global average (every checkpoint and export without the setting); gem a
# generalised mean with a learnable exponent; avgmax the global average and the global max side by side (timm's
# ``catavgmax``: twice the classifier's inputs); grid2 the averages of a 2 x 2 grid (four times its inputs).
MAIN_POOLS = ("avg", "gem", "avgmax", "grid2")
TIMM_MAIN_POOLS = {"avg": "avg", "avgmax": "catavgmax"}  # the main pools a plain timm model builds from its config


def check_main_pool(main_pool: Any) -> str:
    """``main_pool``; a ValueError naming the setting and its values unless it is one of :data:`MAIN_POOLS`."""
    if not isinstance(main_pool, str) or main_pool not in MAIN_POOLS:
        raise ValueError(f"main_pool must be one of {MAIN_POOLS}, got {main_pool!r}")
    return main_pool


class GeneralizedMeanPool2d(nn.Module):
    """GeM (Radenović et al.): per channel ``mean(clamp(x, eps) ** p) ** (1 / p)`` over the map, ``p`` learnable
    (init 3; used as at least 1: p = 1 is the average, p -> inf the maximum); computed in float32 on the map divided
    by each channel's maximum, so that no power overflows (x ** p did for large maps and p: NaN losses)."""

    pool_type = "gem"

    def __init__(self, p: float = 3.0, eps: float = 1e-6, flatten: bool = True) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(1) * p)
        self.eps = eps
        self.flatten = flatten

    def _powered(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(x / peak) ** p`` in [0, 1], the channels' peaks and p (at least 1), in float32."""
        p = self.p.float().clamp(min=1.0)
        x = x.float().clamp(min=self.eps)
        peak = x.amax(dim=(-2, -1), keepdim=True)
        return (x / peak).pow(p), peak, p

    def forward(self, x: Tensor) -> Tensor:
        powered, peak, p = self._powered(x)
        pooled = (powered.mean(dim=(-2, -1), keepdim=True).pow(1.0 / p) * peak).to(x.dtype)
        return pooled.flatten(1) if self.flatten else pooled

    def feat_mult(self) -> int:
        return 1

    def is_identity(self) -> bool:
        return False

    def spatial_terms(self, x: Tensor) -> Tensor:
        """(B, C, h, w) maps whose mean over the map is this pool's output: each channel's GeM spread over the map in
        proportion to ``clamp(x, eps) ** p`` (p = 1: the map itself, the CAM of an average)."""
        powered = self._powered(x)[0]
        share = powered / powered.mean(dim=(-2, -1), keepdim=True)
        return (share * self.forward(x).float().reshape(*x.shape[:2], 1, 1)).to(x.dtype)


class GridAvgPool2d(nn.Module):
    """The averages of a ``grid`` x ``grid`` grid of cells (``F.adaptive_avg_pool2d``, the MGML-FENet heads'
    pooling), flattened channel by channel: ``grid ** 2`` inputs per channel; a map narrower than the grid repeats
    its pixels in several cells."""

    def __init__(self, grid: int = 2, flatten: bool = True) -> None:
        super().__init__()
        self.grid = int(grid)
        self.flatten = flatten
        self.pool_type = f"grid{self.grid}"

    def forward(self, x: Tensor) -> Tensor:
        pooled = F.adaptive_avg_pool2d(x, self.grid)
        return pooled.flatten(1) if self.flatten else pooled

    def feat_mult(self) -> int:
        return self.grid * self.grid

    def is_identity(self) -> bool:
        return False

    def spatial_terms(self, x: Tensor) -> Tensor:
        """(B, C * grid**2, h, w) maps whose means over the map are this pool's outputs, in its order: input
        ``c * grid**2 + cell`` is channel c inside the cell, times h * w / (the cell's pixels), zero outside."""
        height, width = x.shape[-2:]
        rows, cols = _cells(height, self.grid, x.device), _cells(width, self.grid, x.device)  # (grid, side) 0/1
        weight = (rows[:, None, :, None] / rows.sum(1)[:, None, None, None]) \
            * (cols[None, :, None, :] / cols.sum(1)[None, :, None, None]) * (height * width)
        terms = x[:, :, None] * weight.reshape(1, 1, self.grid * self.grid, height, width).to(x.dtype)
        return terms.flatten(1, 2)


def _cells(side: int, grid: int, device: torch.device) -> Tensor:
    """(grid, side) 0/1: the pixels each of ``F.adaptive_avg_pool2d``'s cells covers (start floor(i * side / grid),
    end ceil((i + 1) * side / grid): cells overlap where grid does not divide side)."""
    index = torch.arange(side, device=device)
    starts = [(i * side) // grid for i in range(grid)]
    ends = [-((-(i + 1) * side) // grid) for i in range(grid)]
    return torch.stack([((index >= start) & (index < end)).float() for start, end in zip(starts, ends)])


def _catavgmax_terms(x: Tensor) -> Tensor:
    """(B, 2C, h, w) maps whose means over the map are timm's ``catavgmax`` outputs: the map itself (the average's
    terms), then each channel's maximum times h * w at its first arg-max pixel, zero elsewhere."""
    flat = x.flatten(2)
    peak = torch.zeros_like(flat).scatter_(2, flat.argmax(dim=2, keepdim=True),
                                           flat.amax(dim=2, keepdim=True) * flat.shape[-1])
    return torch.cat([x, peak.reshape(x.shape)], dim=1)


def pool_spatial_terms(pool: nn.Module, x: Tensor) -> Tensor:
    """(B, D, h, w) maps whose means over the map are ``pool(x)`` (D of them, the classifier's inputs in its order),
    so that ``classifier.weight[k] . terms[:, :, i, j]`` is the CAM of class k with the property of an average's
    CAM: its mean over the map is the logit less the bias. An average pool's terms are the map itself."""
    if hasattr(pool, "spatial_terms"):
        return pool.spatial_terms(x)
    if getattr(pool, "pool_type", "") == "catavgmax":
        return _catavgmax_terms(x)
    return x


def _make_main_pool(main_pool: str) -> nn.Module:
    if main_pool == "gem":
        return GeneralizedMeanPool2d(flatten=True)
    if main_pool == "grid2":
        return GridAvgPool2d(2, flatten=True)
    return SelectAdaptivePool2d(pool_type=TIMM_MAIN_POOLS[main_pool], flatten=True)


def pool_holder(net: nn.Module) -> nn.Module | None:
    """The module whose ``global_pool`` (timm's, flattening, or one of :func:`set_main_pool`'s) feeds the classifier
    straight (dropout between at most): the timm model itself (ResNet, DenseNet, EfficientNet: global_pool ->
    fc/classifier) or its ClassifierHead (VGG, ByobNet, RegNet); None for other heads (a norm, a convolution or an
    MLP after the pool: ConvNeXt's, MobileNetV3's, a ViT's)."""
    classifier = net.get_classifier() if hasattr(net, "get_classifier") else None
    for holder in (net, getattr(net, "head", None)):
        if holder is not net and not isinstance(holder, ClassifierHead):
            continue
        pool = getattr(holder, "global_pool", None)
        flattens = isinstance(pool, SelectAdaptivePool2d) and isinstance(pool.flatten, nn.Flatten) \
            or isinstance(pool, (GeneralizedMeanPool2d, GridAvgPool2d)) and pool.flatten
        if flattens and isinstance(classifier, nn.Linear) and any(child is classifier for child in holder.children()):
            return holder
    return None


def set_main_pool(net: nn.Module, main_pool: str, name: str) -> nn.Module | None:
    """Give the timm classifier ``net`` the pool ``main_pool`` in place of its global average, with a classifier
    widened to the pool's outputs and started from timm's own (its weights repeated and divided by the cells for
    grid2, zero on avgmax's maxima: the logits start at, or for grid cells that overlap near, the average's, and
    the backbone's own initialisation is kept). Returns the pool (None for avg: ``net`` stays as timm built it)."""
    if check_main_pool(main_pool) == "avg":
        return None
    holder = pool_holder(net)
    if holder is None:
        head = getattr(net, "head", None)
        kind = type(head if isinstance(head, nn.Module) else net).__name__
        raise BackboneError(f"model.options.main_pool={main_pool} needs a timm classifier that pools its last map "
                            f"straight into a linear layer (global_pool -> fc: resnet*, densenet*, vgg*, "
                            f"efficientnet*); backbone.name={name!r} has a {kind} head: use main_pool=avg with it")
    old = net.get_classifier()
    pool = _make_main_pool(main_pool)
    widened = nn.Linear(old.in_features * pool.feat_mult(), old.out_features, bias=old.bias is not None,
                        device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        if main_pool == "grid2":
            widened.weight.copy_(old.weight.repeat_interleave(pool.feat_mult(), dim=1) / pool.feat_mult())
        elif main_pool == "avgmax":
            widened.weight.copy_(torch.cat([old.weight, torch.zeros_like(old.weight)], dim=1))
        else:
            widened.weight.copy_(old.weight)
        if old.bias is not None:
            widened.bias.copy_(old.bias)
    attribute = next(key for key, child in holder.named_children() if child is old)
    holder.global_pool = pool
    setattr(holder, attribute, widened)
    if isinstance(holder, ClassifierHead):
        holder.num_features = holder.in_features * pool.feat_mult()
    return pool

