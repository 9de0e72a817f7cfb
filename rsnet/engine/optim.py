"""The optimizer, built by timm: any ``timm.optim`` name, no weight decay on norm layers and biases."""

from __future__ import annotations

import math
from typing import Any

import timm.optim
import torch
from torch import nn


def check_optimizer_name(name: Any) -> str:
    """``optimizer.name`` must be one of timm's optimizers; ValueError naming the setting otherwise."""
    known = timm.optim.list_optimizers()
    if name not in known:
        import difflib

        close = difflib.get_close_matches(str(name), known, n=3)
        raise ValueError(f"optimizer.name={name!r} is not a timm optimizer"
                         + (f" (did you mean {', '.join(close)}?)" if close else "")
                         + "; e.g. sgd (Nesterov momentum), momentum (plain momentum), adamw, lamb")
    return name


def check_optimizer_settings(optimizer: dict[str, Any]) -> None:
    """The ``optimizer.*`` settings in range (ValueError naming the setting): lr > 0, momentum in [0, 1),
    weight_decay >= 0, all finite."""
    check_optimizer_name(optimizer["name"])
    lr, momentum, decay = optimizer["lr"], optimizer["momentum"], optimizer["weight_decay"]
    if not 0 < lr < math.inf:
        raise ValueError(f"optimizer.lr={lr!r}: must be a finite number > 0 (e.g. 0.05)")
    if not 0 <= momentum < 1:
        raise ValueError(f"optimizer.momentum={momentum!r}: must be in [0, 1) (e.g. 0.9)")
    if not 0 <= decay < math.inf:
        raise ValueError(f"optimizer.weight_decay={decay!r}: must be a finite number >= 0 (e.g. 5e-4)")


def build_optimizer(model: nn.Module, optimizer: dict[str, Any]) -> torch.optim.Optimizer:
    """``timm.optim.create_optimizer_v2`` from the ``optimizer`` settings (name, lr, momentum, weight_decay):
    parameters of norm layers and biases form a group without weight decay."""
    return timm.optim.create_optimizer_v2(model, opt=check_optimizer_name(optimizer["name"]),
                                          lr=optimizer["lr"], weight_decay=optimizer["weight_decay"],
                                          momentum=optimizer["momentum"], filter_bias_and_bn=True)
