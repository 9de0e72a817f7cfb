"""MGML-FENet (reconstruction): multi-granularity multi-level feature ensemble network: a fusion branch (MGML-FFB) and
per-level, per-grid heads (MGML-FEM) beside the main branch, averaged into ``ensemble``; the main branch may average
its own classifier with some of those heads (``main_heads``) (docs/models.md, Models)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rsnet.models.base import RSNetModel, register_model
from rsnet.models.branches import FullChannelGenerator, FusionBranch
from rsnet.models.geometry import feature_map_sides, fit_grids
from rsnet.models.output import MultiBranchOutput

AUTO_MAIN_HEAD = "s2_g4"  # main_heads=auto: the S2 head on a 4 x 4 grid, where it fits the budget (docs/models.md)
MAIN_HEADS_BUDGET = 0.02  # of the bare classifier's parameters: what main_heads=auto may add to the exported branch


@register_model
class MGMLFENet(RSNetModel):
    arch = "mgml_fenet"

    def __init__(self, backbone: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 levels: Sequence[int] = (2, 3, 4), grids: Sequence[int] = (1, 2, 4), ffb_width: int = 512,
                 image_size: int | None = None, in_chans: int = 3, main_pool: str = "avg",
                 main_heads: Sequence[str] | str = ()) -> None:
        """``image_size``: the training image size each level's pooling grids are fitted to
        (``rsnet.models.geometry``); None pools every level over ``grids`` as given. ``main_pool``: how the main
        branch pools S4 into its classifier (avg | gem | avgmax | grid2; docs/models.md), exported with it.
        ``main_heads``: FC-FG heads (``s<level>_g<grid>``, the grid fitted as the heads' are) whose logits the main
        branch averages with its own classifier's (``main_s4``); exported with it (a few linear layers more);
        ``"auto"``: :meth:`auto_main_heads`."""
        levels = sorted({int(level) for level in levels})
        grids = [int(g) for g in grids]
        if not levels or min(levels) < 1 or max(levels) > 4:
            raise ValueError(f"levels must be a non-empty subset of [1, 2, 3, 4] (S1..S4), got {levels}")
        if not grids or min(grids) < 1:
            raise ValueError(f"grids must be positive ints, got {grids}")
        # a lone name (model.options.main_heads=s2_g4 on the command line) is that head, not its letters
        if main_heads != "auto":
            main_heads = [main_heads] if isinstance(main_heads, str) else [str(head) for head in main_heads]
        super().__init__(backbone, num_classes, pretrained, drop_rate, in_chans, main_pool=main_pool, levels=levels,
                         grids=grids, ffb_width=int(ffb_width), image_size=image_size, main_heads=main_heads)
        self.levels, self.grids = levels, grids
        sides = feature_map_sides(backbone, image_size) if image_size is not None else None
        self.level_grids = {level: fit_grids(grids, sides[level - 1]) if sides else grids for level in levels}
        channels = [self.backbone.channels[level - 1] for level in levels]
        self.ffb = FusionBranch(channels, list(self.level_grids.values()), int(ffb_width), num_classes, drop_rate)
        self.fem = nn.ModuleDict({
            f"s{level}_g{grid}": FullChannelGenerator(c, grid, num_classes, drop_rate)
            for level, c in zip(levels, channels) for grid in self.level_grids[level]})
        if main_heads == "auto":
            main_heads = self.auto_main_heads()
        # fitted, equal ones kept once (as the grids are): the exported branch holds each head once
        self.main_heads = list(dict.fromkeys(fitted_head(head, levels, grids, self.level_grids) for head in main_heads))
        self.model_config["main_heads"] = list(self.main_heads)  # as fitted: build_model(**model_config) rebuilds it

    def auto_main_heads(self) -> list[str]:
        """``main_heads: auto``: :data:`AUTO_MAIN_HEAD` (fitted) where its linear layer has at most
        :data:`MAIN_HEADS_BUDGET` of the bare classifier's parameters, so the exported branch stays within 2 % of it
        (resnet18, resnet50, vgg16; densenet121 up to 17 classes: its S2 has 512 channels); else none (the 2 x 2
        grid, which would fit, measured no gain), and none where the model has no such level and grid."""
        level, grid = head_level(AUTO_MAIN_HEAD), head_grid(AUTO_MAIN_HEAD)
        if level not in self.levels or grid not in self.grids:
            return []
        head = fitted_head(AUTO_MAIN_HEAD, self.levels, self.grids, self.level_grids)
        budget = MAIN_HEADS_BUDGET * sum(p.numel() for p in self.backbone.parameters())
        return [head] if sum(p.numel() for p in self.fem[head].parameters()) <= budget else []

    def forward(self, x: Tensor) -> MultiBranchOutput:
        trunk = self.backbone.trunk(x)
        s4, head_map, z_main = self.main_branch(trunk[-1])
        maps = dict(zip((1, 2, 3, 4), [*trunk, s4]))
        logits = {"main": z_main}
        features = {"main": head_map, "stage4": s4}
        logits["ffb"] = self.ffb([maps[level] for level in self.levels])
        fem = {}
        for name, generator in self.fem.items():
            z = generator(maps[head_level(name)])
            logits[f"fem_{name}"] = fem[name] = z
            if generator.grid == 1:
                features[f"fem_{name}"] = maps[head_level(name)]
        logits["fem"] = torch.stack(list(fem.values())).mean(dim=0)
        if self.main_heads:  # the main branch: its own classifier's logits averaged with those heads'
            logits["main_s4"] = z_main
            logits["main"] = torch.stack([z_main, *(fem[head] for head in self.main_heads)]).mean(dim=0)
            features["main"] = maps[min(head_level(head) for head in self.main_heads)]  # Grad-CAM sees every part
        logits["ensemble"] = (logits["main"] + logits["ffb"] + logits["fem"]) / 3.0
        # with heads, the distillation trains the main branch's own classifier, as it trains main without them
        return MultiBranchOutput(logits=logits, features=features, ensemble="ensemble",
                                 student="main_s4" if self.main_heads else None)

    def cam_classifiers(self) -> dict[str, nn.Linear | None]:
        """A main branch that averages several heads has no single classifier: None (drawn by Grad-CAM)."""
        heads: dict[str, nn.Linear | None] = {"main": None if self.main_heads else self.backbone.classifier}
        heads.update({f"fem_{name}": gen.fc for name, gen in self.fem.items() if gen.grid == 1})
        return heads


def head_level(name: str) -> int:
    """The level of an FC-FG head's name ``s<level>_g<grid>``."""
    return int(name[1:name.index("_")])


def head_grid(name: str) -> int:
    """The grid of an FC-FG head's name ``s<level>_g<grid>``."""
    return int(name[name.index("_g") + 2:])


def fitted_head(name: str, levels: Sequence[int], grids: Sequence[int], level_grids: dict[int, list[int]]) -> str:
    """The FC-FG head ``s<level>_g<grid>`` (a level of ``levels``, a grid of ``grids``) as the model has it: the grid
    fitted to the level's map as the heads' are (``s2_g4`` is ``s2_g2`` where S2 is 2 x 2); a ValueError naming
    ``model.options.main_heads`` for any other name."""
    match = re.fullmatch(r"s(\d+)_g(\d+)", name)
    level, grid = (int(match[1]), int(match[2])) if match else (0, 0)
    if level not in levels or grid not in [*grids, *level_grids.get(level, [])]:
        heads = ", ".join(f"s{lv}_g{g}" for lv in levels for g in grids)
        raise ValueError(f"model.options.main_heads: {name!r} is not one of this model's FC-FG heads ({heads}: "
                         f"s<level>_g<grid> of model.options.levels and grids)")
    fitted = level_grids[level]
    return f"s{level}_g{grid if grid in fitted else max(fitted)}"
