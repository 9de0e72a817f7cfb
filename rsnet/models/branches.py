"""The extra branches of the multi-branch models: ESD-MBENet's feature augmentation, MGML-FENet's fusion
branch and feature generators, and the GAP -> FC head they share."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def gap(x: Tensor) -> Tensor:
    """Global average pooling (B, C, h, w) -> (B, C)."""
    return x.mean(dim=(2, 3))


class GapLinear(nn.Module):
    """GAP -> dropout -> Linear; ``logits == fc(GAP(x))`` in eval mode, so it supports CAM."""

    def __init__(self, channels: int, num_classes: int, drop_rate: float = 0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.drop(gap(x)))


def conv_bn_relu(cin: int, cout: int, kernel: int = 1, stride: int = 1, dilation: int = 1) -> nn.Sequential:
    padding = dilation * (kernel - 1) // 2
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding, dilation=dilation, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class FeatureAugmentation(nn.Module):
    """ESD-MBENet feature augmentation module: S3 -> an S4-shaped map through a bottleneck with a dilated,
    strided 3x3 conv; resized to S4's size where a backbone rounds odd sizes differently."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, dilation: int, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn_relu(in_channels, width, 1),
                                  conv_bn_relu(width, width, 3, stride=stride, dilation=dilation),
                                  conv_bn_relu(width, out_channels, 1))

    def forward(self, s3: Tensor, size: Sequence[int]) -> Tensor:
        out = self.body(s3)
        if tuple(out.shape[-2:]) != tuple(size):
            out = F.adaptive_avg_pool2d(out, tuple(size))
        return out


class ChannelSeparateGenerator(nn.Module):
    """CS-FG: split channels into len(grids) groups; group g is pooled over a g x g grid; concat (each channel
    is pooled once)."""

    def __init__(self, channels: int, grids: Sequence[int]) -> None:
        super().__init__()
        self.grids = [int(g) for g in grids]
        base, extra = divmod(channels, len(self.grids))
        self.splits = [base + (1 if i < extra else 0) for i in range(len(self.grids))]
        if min(self.splits) < 1:
            raise ValueError(f"cannot split {channels} channels into {len(self.grids)} groups")
        self.out_features = sum(c * g * g for c, g in zip(self.splits, self.grids))

    def forward(self, x: Tensor) -> Tensor:
        parts = torch.split(x, self.splits, dim=1)
        return torch.cat([F.adaptive_avg_pool2d(p, g).flatten(1) for p, g in zip(parts, self.grids)], dim=1)


class FusionBranch(nn.Module):
    """MGML-FFB: CS-FG on every level (with that level's grids) -> project to a common width -> concat levels
    -> FC."""

    def __init__(self, channels: Sequence[int], level_grids: Sequence[Sequence[int]], width: int, num_classes: int,
                 drop_rate: float = 0.0) -> None:
        super().__init__()
        self.generators = nn.ModuleList(ChannelSeparateGenerator(c, grids) for c, grids in zip(channels, level_grids))
        self.projections = nn.ModuleList(
            nn.Sequential(nn.Linear(gen.out_features, width, bias=False), nn.BatchNorm1d(width), nn.ReLU(inplace=True))
            for gen in self.generators)
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(width * len(channels), num_classes)

    def forward(self, levels: Sequence[Tensor]) -> Tensor:
        fused = torch.cat([proj(gen(x)) for gen, proj, x in zip(self.generators, self.projections, levels)], dim=1)
        return self.fc(self.drop(fused))


class FullChannelGenerator(nn.Module):
    """FC-FG for one level and one grid: pool all channels over a g x g grid -> FC."""

    def __init__(self, channels: int, grid: int, num_classes: int, drop_rate: float = 0.0) -> None:
        super().__init__()
        self.grid = int(grid)
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(channels * self.grid * self.grid, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.drop(F.adaptive_avg_pool2d(x, self.grid).flatten(1)))
