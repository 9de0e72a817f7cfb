"""Baseline: backbone -> GAP -> FC (timm's own classifier) with one head."""

from __future__ import annotations

from torch import Tensor

from rsnet.models.base import RSNetModel, register_model
from rsnet.models.output import MultiBranchOutput


@register_model
class Baseline(RSNetModel):
    """The bare backbone classifier as an rsnet model with one head."""

    arch = "baseline"

    def forward(self, x: Tensor) -> MultiBranchOutput:
        main = self.main_branch(self.backbone.trunk(x)[-1])
        return MultiBranchOutput(logits={"main": main.logits}, features={"main": main.head_map, "stage4": main.stage4})
