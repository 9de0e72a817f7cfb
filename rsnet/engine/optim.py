"""The optimizer, built by timm: any ``timm.optim`` name, no weight decay on norm layers and biases."""

from __future__ import annotations

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


def build_optimizer(model: nn.Module, optimizer: dict[str, Any]) -> torch.optim.Optimizer:
    """``timm.optim.create_optimizer_v2`` from the ``optimizer`` settings (name, lr, momentum, weight_decay):
    parameters of norm layers and biases form a group without weight decay."""
    return timm.optim.create_optimizer_v2(model, opt=check_optimizer_name(optimizer["name"]),
                                          lr=optimizer["lr"], weight_decay=optimizer["weight_decay"],
                                          momentum=optimizer["momentum"], filter_bias_and_bn=True)
