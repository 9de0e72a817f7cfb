"""ESD-MBENet (reconstruction): compact multi-branch ensemble with embedded self-distillation (docs/models.md, Models).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rsnet.models.base import RSNetModel, register_model
from rsnet.models.branches import FeatureAugmentation, GapLinear, gap
from rsnet.models.geometry import feature_map_sides, fit_dilation
from rsnet.models.output import MultiBranchOutput

AUX_BRANCHES = ("dilated", "copy")


@register_model
class ESDMBENet(RSNetModel):
    arch = "esd_mbenet"

    def __init__(self, backbone: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 num_branches: int = 3, aux_branch: str = "dilated", dilations: Sequence[int] | None = None,
                 fam_width: int | None = None, image_size: int | None = None, in_chans: int = 3,
                 main_pool: str = "avg") -> None:
        """``image_size``: the training image size the FAM dilations are fitted to (``rsnet.models.geometry``);
        None keeps ``dilations`` as given, in pixels of S3. ``main_pool``: how the main branch pools S4 into its
        classifier (avg | gem | avgmax | grid2; docs/models.md); the auxiliary and ensemble heads average."""
        if not isinstance(num_branches, int) or num_branches < 2:
            raise ValueError(f"num_branches must be an int >= 2 (main + auxiliaries), got {num_branches!r}")
        if aux_branch not in AUX_BRANCHES:
            raise ValueError(f"aux_branch must be one of {AUX_BRANCHES}, got {aux_branch!r}")
        dilations = [int(d) for d in dilations] if dilations is not None else list(range(2, num_branches + 1))
        if len(dilations) != num_branches - 1 or min(dilations) < 1:
            raise ValueError(f"dilations needs {num_branches - 1} positive ints (one per auxiliary branch), "
                             f"got {dilations}")
        super().__init__(backbone, num_classes, pretrained, drop_rate, in_chans, main_pool=main_pool,
                         num_branches=num_branches, aux_branch=aux_branch, dilations=dilations, fam_width=fam_width,
                         image_size=image_size)
        if image_size is not None:
            s3_side = feature_map_sides(backbone, image_size)[2]
            dilations = [fit_dilation(d, s3_side) for d in dilations]
        self.fitted_dilations = dilations
        c3, c4 = self.backbone.channels[2], self.backbone.channels[3]
        stride = max(1, self.backbone.reductions[3] // self.backbone.reductions[2])
        width = int(fam_width) if fam_width else max(c4 // 4, 8)
        if aux_branch == "copy":
            self.aux = nn.ModuleList(self.backbone.stage4_copy() for _ in dilations)
        else:
            self.aux = nn.ModuleList(FeatureAugmentation(c3, c4, stride, d, width) for d in dilations)
        self.aux_heads = nn.ModuleList(GapLinear(c4, num_classes, drop_rate) for _ in dilations)
        self.gate = nn.Linear(c3, num_branches)
        self.feature_head = GapLinear(c4, num_classes, drop_rate)

    def forward(self, x: Tensor) -> MultiBranchOutput:
        s3 = self.backbone.trunk(x)[-1]
        s4, head_map, z_main = self.main_branch(s3)
        logits = {"main": z_main}
        features = {"main": head_map, "stage4": s4}
        maps = [s4]
        for i, (branch, head) in enumerate(zip(self.aux, self.aux_heads), start=1):
            f = branch(s3, s4.shape[-2:]) if isinstance(branch, FeatureAugmentation) else branch(s3)
            if f.shape[-2:] != s4.shape[-2:]:
                f = nn.functional.adaptive_avg_pool2d(f, s4.shape[-2:])
            logits[f"aux{i}"] = head(f)
            features[f"aux{i}"] = f
            maps.append(f)
        gate = torch.softmax(self.gate(gap(s3)), dim=1)
        stacked = torch.stack([logits["main"]] + [logits[f"aux{i}"] for i in range(1, len(maps))], dim=1)
        logits["gate_ensemble"] = (gate.unsqueeze(-1) * stacked).sum(dim=1)
        f_ens = torch.stack(maps, dim=0).mean(dim=0)
        features["feature_ensemble"] = f_ens
        logits["feature_ensemble"] = self.feature_head(f_ens)
        logits["ensemble"] = 0.5 * (logits["gate_ensemble"] + logits["feature_ensemble"])
        return MultiBranchOutput(logits=logits, features=features, ensemble="ensemble")

    def cam_classifiers(self) -> dict[str, nn.Linear]:
        heads = {"main": self.backbone.classifier}
        heads.update({f"aux{i}": head.fc for i, head in enumerate(self.aux_heads, start=1)})
        heads["feature_ensemble"] = self.feature_head.fc
        return heads


