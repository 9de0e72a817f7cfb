"""Main-branch extraction: the trained model's main branch as a plain timm classifier, and back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import timm
from torch import Tensor, nn

from rsnet.models.backbones import check_main_pool, set_main_pool
from rsnet.models.baseline import Baseline


def main_pool_of(config: Mapping[str, Any] | None) -> str:
    """The main pool a ``model_config`` records (a checkpoint's, an export's): avg where it has none, the meaning of
    every checkpoint and export made before the setting."""
    return check_main_pool((config or {}).get("main_pool", "avg"))


def main_branch_classifier(backbone: str, num_classes: int, main_pool: str = "avg", in_chans: int = 3) -> nn.Module:
    """The single-path classifier a main branch loads into: ``timm.create_model(backbone, num_classes=N)`` (for
    avg, exactly that), its global pool replaced by ``main_pool`` and its classifier widened to the pool's outputs
    (``rsnet.models.backbones.set_main_pool``: trunk -> pool -> linear, nothing else)."""
    plain = timm.create_model(backbone, pretrained=False, num_classes=num_classes,
                              **({"in_chans": in_chans} if in_chans != 3 else {}))
    set_main_pool(plain, main_pool, backbone)
    return plain


def extract_main_branch(model: nn.Module) -> nn.Module:
    """Return ``timm.create_model(backbone, num_classes=N)`` (with the model's ``main_pool``:
    :func:`main_branch_classifier`) carrying the main branch's weights (a strict load of ``backbone.net``, no key
    remapping), in eval mode."""
    backbone = getattr(model, "backbone", None)
    net = getattr(backbone, "net", None)
    if net is None or not hasattr(model, "model_config"):
        raise TypeError(f"{type(model).__name__} is not an rsnet model (built by rsnet.models.build_model)")
    config = model.model_config
    plain = main_branch_classifier(config["backbone"], config["num_classes"], main_pool_of(config),
                                   int(config.get("in_chans", 3)))
    plain.load_state_dict(net.state_dict(), strict=True)
    return plain.eval()


def baseline_from_main_branch(state: Mapping[str, Tensor], backbone: str, num_classes: int,
                              in_chans: int = 3, main_pool: str = "avg") -> Baseline:
    """The inverse of :func:`extract_main_branch`: a plain timm classifier's state dict (of images of ``in_chans``
    bands, pooled by ``main_pool``) as an rsnet ``Baseline`` (its one head, with the feature maps CAM and Grad-CAM
    draw on); strict load, eval mode."""
    model = Baseline(backbone, num_classes, **({"in_chans": in_chans} if in_chans != 3 else {}), main_pool=main_pool)
    model.backbone.net.load_state_dict(state, strict=True)
    return model.eval()
