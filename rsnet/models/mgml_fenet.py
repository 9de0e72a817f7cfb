"""MGML-FENet (reconstruction): multi-granularity multi-level feature ensemble network: a fusion branch (MGML-FFB) and
per-level, per-grid heads (MGML-FEM) beside the main branch, averaged into ``ensemble`` (docs/models.md, Models)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rsnet.models.base import RSNetModel, register_model
from rsnet.models.branches import FullChannelGenerator, FusionBranch
from rsnet.models.geometry import feature_map_sides, fit_grids
from rsnet.models.output import MultiBranchOutput


@register_model
class MGMLFENet(RSNetModel):
    arch = "mgml_fenet"

    def __init__(self, backbone: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 levels: Sequence[int] = (2, 3, 4), grids: Sequence[int] = (1, 2, 4), ffb_width: int = 512,
                 image_size: int | None = None, in_chans: int = 3, main_pool: str = "avg") -> None:
        """``image_size``: the training image size each level's pooling grids are fitted to
        (``rsnet.models.geometry``); None pools every level over ``grids`` as given. ``main_pool``: how the main
        branch pools S4 into its classifier (avg | gem | avgmax | grid2; docs/models.md), exported with it."""
        levels = sorted({int(level) for level in levels})
        grids = [int(g) for g in grids]
        if not levels or min(levels) < 1 or max(levels) > 4:
            raise ValueError(f"levels must be a non-empty subset of [1, 2, 3, 4] (S1..S4), got {levels}")
        if not grids or min(grids) < 1:
            raise ValueError(f"grids must be positive ints, got {grids}")
        super().__init__(backbone, num_classes, pretrained, drop_rate, in_chans, main_pool=main_pool, levels=levels,
                         grids=grids, ffb_width=int(ffb_width), image_size=image_size)
        self.levels, self.grids = levels, grids
        sides = feature_map_sides(backbone, image_size) if image_size is not None else None
        self.level_grids = {level: fit_grids(grids, sides[level - 1]) if sides else grids for level in levels}
        channels = [self.backbone.channels[level - 1] for level in levels]
        self.ffb = FusionBranch(channels, list(self.level_grids.values()), int(ffb_width), num_classes, drop_rate)
        self.fem = nn.ModuleDict({
            f"s{level}_g{grid}": FullChannelGenerator(c, grid, num_classes, drop_rate)
            for level, c in zip(levels, channels) for grid in self.level_grids[level]})

    def forward(self, x: Tensor) -> MultiBranchOutput:
        trunk = self.backbone.trunk(x)
        s4, head_map, z_main = self.main_branch(trunk[-1])
        maps = dict(zip((1, 2, 3, 4), [*trunk, s4]))
        logits = {"main": z_main}
        features = {"main": head_map, "stage4": s4}
        logits["ffb"] = self.ffb([maps[level] for level in self.levels])
        fem = []
        for name, generator in self.fem.items():
            level = int(name[1:name.index("_")])
            z = generator(maps[level])
            logits[f"fem_{name}"] = z
            fem.append(z)
            if generator.grid == 1:
                features[f"fem_{name}"] = maps[level]
        logits["fem"] = torch.stack(fem).mean(dim=0)
        logits["ensemble"] = (logits["main"] + logits["ffb"] + logits["fem"]) / 3.0
        return MultiBranchOutput(logits=logits, features=features, ensemble="ensemble")

    def cam_classifiers(self) -> dict[str, nn.Linear]:
        heads = {"main": self.backbone.classifier}
        heads.update({f"fem_{name}": gen.fc for name, gen in self.fem.items() if gen.grid == 1})
        return heads
