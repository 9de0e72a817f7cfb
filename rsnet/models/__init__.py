"""rsnet models: ``build_model(arch, backbone, num_classes, pretrained=False, **options)``."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch import nn

from rsnet.models.backbones import TimmBackbone, backbone_data_config, backbone_layout, validate_image_size
from rsnet.models.base import MODELS, RSNetModel, register_model
from rsnet.models.baseline import Baseline
from rsnet.models.esd_mbenet import ESDMBENet
from rsnet.models.mgml_fenet import MGMLFENet
from rsnet.models.output import MultiBranchOutput
from rsnet.models.main_branch import extract_main_branch
from rsnet.models.timm_classifier import BackboneError


def check_arch(arch: str, setting: str = "model.arch") -> str:
    """Return ``arch``; ValueError naming ``setting`` unless a model registered it (:data:`MODELS`)."""
    return MODELS.check(arch, setting)


def model_options(arch: str) -> list[str]:
    """Names of the options ``arch`` accepts besides backbone / num_classes / pretrained / in_chans (its
    ``__init__``'s)."""
    skip = {"self", "backbone", "num_classes", "pretrained", "options", "in_chans"}
    return [name for name in inspect.signature(MODELS[arch].__init__).parameters if name not in skip]


def options_for_size(options: Mapping[str, Any], image_size: int) -> dict[str, Any]:
    """``options`` with ``image_size: auto`` replaced by the training image size (the size the branches' geometry
    is fitted to: ``rsnet.models.geometry``)."""
    resolved = dict(options)
    if resolved.get("image_size") == "auto":
        resolved["image_size"] = int(image_size)
    return resolved


def build_model(arch: str, backbone: str, num_classes: int, pretrained: bool | str = False, in_chans: int = 3,
                **options: Any) -> nn.Module:
    """Build an rsnet model for images of ``in_chans`` bands; ``build_model(**model.model_config)`` rebuilds the same
    architecture."""
    check_arch(arch)
    unknown = sorted(set(options) - set(model_options(arch)))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for arch {arch!r}; valid: {model_options(arch)}")
    if options.get("image_size") == "auto":
        raise ValueError("image_size=auto stands for dataset.image_size: resolve it with options_for_size first")
    bands = {"in_chans": in_chans} if in_chans != 3 else {}  # a model of RGB pictures is built as before
    return MODELS[arch](backbone, num_classes, pretrained, **bands, **options)


__all__ = ["MODELS", "BackboneError", "Baseline", "ESDMBENet", "MGMLFENet", "MultiBranchOutput", "RSNetModel",
           "TimmBackbone", "backbone_data_config", "backbone_layout", "build_model", "check_arch",
           "extract_main_branch", "model_options", "options_for_size", "register_model", "validate_image_size"]
