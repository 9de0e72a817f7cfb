"""The base class of every rsnet model: a timm classifier whose own head is the main branch."""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

from torch import Tensor, nn

from rsnet.models.backbones import TimmBackbone
from rsnet.models.pooling import check_main_pool
from rsnet.registry import Registry


class MainBranch(NamedTuple):
    """What the main branch computes from S3: S4, the map its classifier pools, and its logits."""

    stage4: Tensor
    head_map: Tensor
    logits: Tensor


MODELS: Registry[type[RSNetModel]] = Registry("model.arch", key="arch")  # filled by @register_model


class RSNetModel(nn.Module):
    """Common interface: ``forward(x) -> MultiBranchOutput``, ``model_config``, ``cam_classifiers()``,
    ``cam_inputs()``; ``self.backbone.net`` is a complete timm classifier, the main branch."""

    arch = "base"

    def __init__(self, backbone: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 in_chans: int = 3, main_pool: str = "avg", **options: Any) -> None:
        """``main_pool``: how the main branch pools its map into its classifier (avg | gem | avgmax | grid2;
        ``rsnet.models.pooling.MAIN_POOLS``); a model_config without it (an older checkpoint) means avg."""
        super().__init__()
        check_main_pool(main_pool)
        self.backbone = TimmBackbone(backbone, num_classes, pretrained, drop_rate=drop_rate, in_chans=in_chans,
                                     main_pool=main_pool)
        self.num_classes = num_classes
        self.model_config: dict[str, Any] = {
            "arch": self.arch, "backbone": backbone, "num_classes": num_classes,
            "pretrained": pretrained if isinstance(pretrained, bool) else str(pretrained),
            "drop_rate": float(drop_rate), **options}
        if in_chans != 3:  # a multispectral model (an RGB one's config stays as it was)
            self.model_config["in_chans"] = int(in_chans)
        # recorded where the model takes the option (build_model(**model_config) rebuilds it), or where it is not avg
        if main_pool != "avg" or "main_pool" in inspect.signature(type(self).__init__).parameters:
            self.model_config["main_pool"] = main_pool

    def main_branch(self, s3: Tensor) -> MainBranch:
        """Run the main branch (the backbone's stage 4 and its own classifier) on S3."""
        s4 = self.backbone.stage4(s3)
        head_map = self.backbone.head_map(s4)
        return MainBranch(s4, head_map, self.backbone.head(head_map))

    def cam_classifiers(self) -> dict[str, nn.Linear]:
        return {"main": self.backbone.classifier}

    def cam_inputs(self, head: str, features: Tensor) -> Tensor:
        """(B, D, h, w) maps whose means over the map are the D inputs of ``cam_classifiers()[head]``, given
        ``features[head]``: the CAM of class k is ``weight[k] . cam_inputs`` at each pixel. A GAP head's are its
        map; the main head's follow ``main_pool`` (``rsnet.models.pooling.pool_spatial_terms``)."""
        return self.backbone.cam_inputs(features) if head == "main" else features


register_model = MODELS.register  # class decorator: a model registers itself under its ``arch``
"""Class decorator: a model registers itself in ``MODELS`` under its ``arch`` (the value of ``model.arch``); a name
taken by another class is refused."""
