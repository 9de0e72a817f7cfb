"""Main-branch extraction: the trained model's main branch as a plain timm classifier (with the FC-FG heads it averages,
where it has ``main_heads``), and back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import timm
import torch
from torch import Tensor, nn

from rsnet.models.backbones import TimmBackbone
from rsnet.models.baseline import Baseline
from rsnet.models.branches import FullChannelGenerator
from rsnet.models.mgml_fenet import head_grid, head_level
from rsnet.models.output import MultiBranchOutput
from rsnet.models.pooling import check_main_pool, set_main_pool


def main_pool_of(config: Mapping[str, Any] | None) -> str:
    """The main pool a ``model_config`` records (a checkpoint's, an export's): avg where it has none, the meaning of
    every checkpoint and export made before the setting."""
    return check_main_pool((config or {}).get("main_pool", "avg"))


def main_heads_of(config: Mapping[str, Any] | None) -> list[str]:
    """The FC-FG heads a ``model_config``'s main branch averages with its own classifier (MGML-FENet's
    ``main_heads``, as fitted): none where it has no such key, the meaning of every older checkpoint and export."""
    return [str(head) for head in (config or {}).get("main_heads") or []]


class MainBranchHeads(nn.Module):
    """The single-path classifier of a main branch that averages its own classifier with FC-FG heads: the timm
    classifier run once (``backbone.net``; trunk -> S4 -> pool -> linear) with a pool and a linear layer per head
    on the map of that head's level (``fem.<head>``); logits = the mean of the classifier's and the heads' logits.
    Its state dict keys are the full model's."""

    def __init__(self, backbone: str, num_classes: int, main_pool: str = "avg", in_chans: int = 3,
                 heads: Sequence[str] = ()) -> None:
        super().__init__()
        self.backbone = TimmBackbone(backbone, num_classes, in_chans=in_chans, main_pool=main_pool, verify=False)
        self.fem = nn.ModuleDict({head: FullChannelGenerator(self.backbone.channels[head_level(head) - 1],
                                                             head_grid(head), num_classes) for head in heads})

    def branch_output(self, x: Tensor) -> MultiBranchOutput:
        """The logits (head ``main``) with the maps Grad-CAM draws on: the shallowest level the heads read."""
        trunk = self.backbone.trunk(x)
        s4 = self.backbone.stage4(trunk[-1])
        maps = [*trunk, s4]
        own = self.backbone.head(self.backbone.head_map(s4))
        logits = torch.stack([own, *(head(maps[head_level(name) - 1]) for name, head in self.fem.items())]).mean(dim=0)
        shallowest = maps[min(head_level(name) for name in self.fem) - 1]
        return MultiBranchOutput(logits={"main": logits}, features={"main": shallowest, "stage4": s4})

    def forward(self, x: Tensor) -> Tensor:
        return self.branch_output(x).main_logits


class MainBranchHeadsModel(nn.Module):
    """A :class:`MainBranchHeads` as an rsnet model (``forward -> MultiBranchOutput``) for attention maps: its one
    head averages several classifiers, so it is drawn by Grad-CAM (``cam_classifiers`` gives None)."""

    def __init__(self, main: MainBranchHeads) -> None:
        super().__init__()
        self.main = main

    def forward(self, x: Tensor) -> MultiBranchOutput:
        return self.main.branch_output(x)

    def cam_classifiers(self) -> dict[str, nn.Linear | None]:
        return {"main": None}


def main_branch_classifier(backbone: str, num_classes: int, main_pool: str = "avg", in_chans: int = 3,
                           main_heads: Sequence[str] = ()) -> nn.Module:
    """The single-path classifier a main branch loads into: ``timm.create_model(backbone, num_classes=N)`` (for
    avg, exactly that), its global pool replaced by ``main_pool`` and its classifier widened to the pool's outputs
    (``rsnet.models.pooling.set_main_pool``: trunk -> pool -> linear, nothing else); with ``main_heads``, a
    :class:`MainBranchHeads` around it."""
    if main_heads:
        return MainBranchHeads(backbone, num_classes, main_pool, in_chans, main_heads)
    plain = timm.create_model(backbone, pretrained=False, num_classes=num_classes,
                              **({"in_chans": in_chans} if in_chans != 3 else {}))
    set_main_pool(plain, main_pool, backbone)
    return plain


def extract_main_branch(model: nn.Module) -> nn.Module:
    """Return ``timm.create_model(backbone, num_classes=N)`` (with the model's ``main_pool``:
    :func:`main_branch_classifier`) carrying the main branch's weights (a strict load of ``backbone.net``, no key
    remapping), in eval mode; where the main branch averages FC-FG heads, a :class:`MainBranchHeads` with theirs."""
    backbone = getattr(model, "backbone", None)
    net = getattr(backbone, "net", None)
    if net is None or not hasattr(model, "model_config"):
        raise TypeError(f"{type(model).__name__} is not an rsnet model (built by rsnet.models.build_model)")
    config = model.model_config
    heads = main_heads_of(config)
    plain = main_branch_classifier(config["backbone"], config["num_classes"], main_pool_of(config),
                                   int(config.get("in_chans", 3)), heads)
    if heads:
        prefixes = ("backbone.", *(f"fem.{head}." for head in heads))  # the backbone's own keys (VGG's pre-logits too)
        plain.load_state_dict({key: value for key, value in model.state_dict().items() if key.startswith(prefixes)},
                              strict=True)
    else:
        plain.load_state_dict(net.state_dict(), strict=True)
    return plain.eval()


def baseline_from_main_branch(state: Mapping[str, Tensor], backbone: str, num_classes: int,
                              in_chans: int = 3, main_pool: str = "avg",
                              main_heads: Sequence[str] = ()) -> Baseline | MainBranchHeadsModel:
    """The inverse of :func:`extract_main_branch`: a plain timm classifier's state dict (of images of ``in_chans``
    bands, pooled by ``main_pool``) as an rsnet ``Baseline`` (its one head, with the feature maps CAM and Grad-CAM
    draw on), or with ``main_heads`` a :class:`MainBranchHeadsModel`; strict load, eval mode."""
    if main_heads:
        main = MainBranchHeads(backbone, num_classes, main_pool, in_chans, main_heads)
        main.load_state_dict(state, strict=True)
        return MainBranchHeadsModel(main).eval()
    model = Baseline(backbone, num_classes, **({"in_chans": in_chans} if in_chans != 3 else {}), main_pool=main_pool)
    model.backbone.net.load_state_dict(state, strict=True)
    return model.eval()
