"""The rule that fits the branches' geometry to the feature maps a training image size gives (docs/models.md,
"Geometry that follows the feature maps").

ESD-MBENet's feature augmentation modules and MGML-FENet's pooling grids are set in pixels of a feature map
(dilation 2 and 3 on S3, grids 1, 2 and 4 on S2..S4), which the papers chose for 224 px inputs (S3 14 x 14,
S4 7 x 7 on ResNet). On smaller inputs the same numbers ask for more than the map holds. The rule keeps each
setting where the map can hold it and shrinks it where it cannot:

* a 3 x 3 convolution of dilation d reaches d pixels from its centre; d is at most ``(side - 1) // 2`` (at
  least 1), so the kernel centred on the map's middle has all 9 taps on the map, none in the padding;
* a pooling grid of g x g cells has at most ``side`` cells per row, so every cell pools at least one pixel of
  its own; grids that become equal are kept once.

At 128 and 224 px the rule changes nothing on ResNet, VGG or DenseNet backbones (the maps are large enough);
at 64 px and below it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

from rsnet.models.backbones import TimmBackbone


def feature_map_sides(backbone: str, image_size: int) -> tuple[int, ...]:
    """The shorter side of S1..S4 for square inputs of ``image_size`` px, from a forward on the meta device
    (no weights, no compute)."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be auto, null or a positive int (pixels), got {image_size!r}")
    return _meta_forward_sides(backbone, image_size)


@lru_cache(maxsize=32)
def _meta_forward_sides(backbone: str, image_size: int) -> tuple[int, ...]:
    """Kept per process: the config check and the training build ask for the same sides."""
    with torch.device("meta"):
        net = TimmBackbone(backbone, 2, verify=False).eval()
        levels = net.trunk(torch.empty(1, 3, image_size, image_size))
        maps = [*levels, net.stage4(levels[-1])]
    return tuple(min(int(m.shape[-2]), int(m.shape[-1])) for m in maps)


def fit_dilation(dilation: int, side: int) -> int:
    """``dilation`` of a 3 x 3 kernel, shrunk so that the kernel centred on a map of ``side`` pixels has all its
    taps on the map."""
    return max(1, min(int(dilation), (int(side) - 1) // 2))


def fit_grids(grids: Sequence[int], side: int) -> list[int]:
    """``grids`` with each grid at most ``side`` cells per row, equal ones kept once, in their order."""
    fitted: list[int] = []
    for grid in grids:
        cells = min(int(grid), int(side))
        if cells not in fitted:
            fitted.append(cells)
    return fitted
