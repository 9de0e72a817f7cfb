"""How a run's folder and its metrics.json name the protocol: runs of one dataset that differ in train ratio,
validation ratio, image size or starting weights are not comparable and never share a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pretrained_tag(pretrained: Any) -> str:
    """``backbone.pretrained`` in a run's folder name and metrics.json: ``scratch`` (no weights), ``pretrained``
    (the backbone's published weights) or the weights file's name without its suffix."""
    if pretrained in (False, None, "", "false", "False"):
        return "scratch"
    if pretrained in (True, "true", "True"):
        return "pretrained"
    return Path(str(pretrained)).stem


def protocol_folder(train_ratio: Any, val_ratio: Any, image_size: Any, pretrained: Any) -> str:
    """The protocol part of a run's folder name, e.g. ``r0.5_64px_scratch`` or ``r0.2_val0.1_224px_pretrained``:
    runs of one dataset that differ in it are not comparable and must not share a folder."""
    validation = f"_val{val_ratio}" if val_ratio not in (None, 0, 0.0, "0", "0.0") else ""
    return f"r{train_ratio}{validation}_{image_size}px_{pretrained_tag(pretrained)}"
