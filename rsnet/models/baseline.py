"""Baseline: backbone -> GAP -> FC (timm's own classifier), and the base class of every rsnet model."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from rsnet.models.backbones import TimmBackbone
from rsnet.models.output import MultiBranchOutput


class RSNetModel(nn.Module):
    """Common interface: ``forward(x) -> MultiBranchOutput``, ``model_config``, ``cam_classifiers()``.

    ``self.backbone.net`` is a complete timm classifier; it computes the main branch and is what
    ``rsnet.models.prune.extract_main_branch`` returns.
    """

    arch = "base"

    def __init__(self, backbone: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 **options: Any) -> None:
        super().__init__()
        self.backbone = TimmBackbone(backbone, num_classes, pretrained, drop_rate=drop_rate)
        self.num_classes = num_classes
        self.model_config: dict[str, Any] = {
            "arch": self.arch, "backbone": backbone, "num_classes": num_classes,
            "pretrained": pretrained if isinstance(pretrained, bool) else str(pretrained),
            "drop_rate": float(drop_rate), **options,
        }

    def _main(self, s3: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """S4, the map the main classifier pools, and the main logits."""
        s4 = self.backbone.stage4(s3)
        head_map = self.backbone.head_map(s4)
        return s4, head_map, self.backbone.head(head_map)

    def cam_classifiers(self) -> dict[str, nn.Linear]:
        return {"main": self.backbone.classifier}


class Baseline(RSNetModel):
    """The bare backbone classifier as an rsnet model with one head."""

    arch = "baseline"

    def forward(self, x: Tensor) -> MultiBranchOutput:
        s3 = self.backbone.trunk(x)[-1]
        s4, head_map, logits = self._main(s3)
        return MultiBranchOutput(logits={"main": logits}, features={"main": head_map, "stage4": s4})
