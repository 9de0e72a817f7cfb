"""Main-branch extraction: the trained model's main branch as a plain timm classifier, and back."""

from __future__ import annotations

from collections.abc import Mapping

import timm
from torch import Tensor, nn

from rsnet.models.baseline import Baseline


def extract_main_branch(model: nn.Module) -> nn.Module:
    """Return ``timm.create_model(backbone, num_classes=N)`` carrying the main branch's weights (a strict load
    of ``backbone.net``, no key remapping), in eval mode."""
    backbone = getattr(model, "backbone", None)
    net = getattr(backbone, "net", None)
    if net is None or not hasattr(model, "model_config"):
        raise TypeError(f"{type(model).__name__} is not an rsnet model (built by rsnet.models.build_model)")
    config = model.model_config
    plain = timm.create_model(config["backbone"], pretrained=False, num_classes=config["num_classes"],
                              **({"in_chans": config["in_chans"]} if "in_chans" in config else {}))
    plain.load_state_dict(net.state_dict(), strict=True)
    return plain.eval()


def baseline_from_main_branch(state: Mapping[str, Tensor], backbone: str, num_classes: int,
                              in_chans: int = 3) -> Baseline:
    """The inverse of :func:`extract_main_branch`: a plain timm classifier's state dict (of images of ``in_chans``
    bands) as an rsnet ``Baseline`` (its one head, with the feature maps CAM and Grad-CAM draw on); strict load, eval
    mode."""
    model = Baseline(backbone, num_classes, **({"in_chans": in_chans} if in_chans != 3 else {}))
    model.backbone.net.load_state_dict(state, strict=True)
    return model.eval()
