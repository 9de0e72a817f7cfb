"""The base class of every rsnet model: a timm classifier whose own head is the main branch."""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor, nn

from rsnet.models.backbones import TimmBackbone
from rsnet.registry import Registry


class MainBranch(NamedTuple):
    """What the main branch computes from S3: S4, the map its classifier pools, and its logits."""

    stage4: Tensor
    head_map: Tensor
    logits: Tensor


MODELS: Registry[type[RSNetModel]] = Registry("model.arch", key="arch")  # filled by @register_model


class RSNetModel(nn.Module):
    """Common interface: ``forward(x) -> MultiBranchOutput``, ``model_config``, ``cam_classifiers()``;
    ``self.backbone.net`` is a complete timm classifier, the main branch."""

    arch = "base"

    def __init__(self, backbone: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 in_chans: int = 3, **options: Any) -> None:
        super().__init__()
        self.backbone = TimmBackbone(backbone, num_classes, pretrained, drop_rate=drop_rate, in_chans=in_chans)
        self.num_classes = num_classes
        self.model_config: dict[str, Any] = {
            "arch": self.arch, "backbone": backbone, "num_classes": num_classes,
            "pretrained": pretrained if isinstance(pretrained, bool) else str(pretrained),
            "drop_rate": float(drop_rate), **options}
        if in_chans != 3:  # a multispectral model (an RGB one's config stays as it was)
            self.model_config["in_chans"] = int(in_chans)

    def main_branch(self, s3: Tensor) -> MainBranch:
        """Run the main branch (the backbone's stage 4 and its own classifier) on S3."""
        s4 = self.backbone.stage4(s3)
        head_map = self.backbone.head_map(s4)
        return MainBranch(s4, head_map, self.backbone.head(head_map))

    def cam_classifiers(self) -> dict[str, nn.Linear]:
        return {"main": self.backbone.classifier}


register_model = MODELS.register  # class decorator: a model registers itself under its ``arch``
"""Class decorator: a model registers itself in ``MODELS`` under its ``arch`` (the value of ``model.arch``); a name
taken by another class is refused."""
