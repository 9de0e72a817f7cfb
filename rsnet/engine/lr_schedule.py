"""Learning-rate schedules as pure functions of (fractional) epoch."""

from __future__ import annotations

import math
from collections.abc import Sequence

SCHEDULES = ("cosine", "step")


def check_schedule_name(name: str) -> str:
    """Return ``name``; ValueError naming ``lr_schedule.name`` unless it is one of :data:`SCHEDULES`."""
    if name not in SCHEDULES:
        raise ValueError(f"lr_schedule.name={name!r} is not known; use {' or '.join(map(repr, SCHEDULES))}")
    return name


def check_schedule_settings(lr_schedule: dict) -> None:
    """The ``lr_schedule.*`` settings in range (ValueError naming the setting)."""
    check_schedule_name(lr_schedule["name"])
    warmup, gamma, floor = lr_schedule["warmup_epochs"], lr_schedule["gamma"], lr_schedule["min_lr_ratio"]
    if not 0 <= warmup < math.inf:
        raise ValueError(f"lr_schedule.warmup_epochs={warmup!r}: must be a finite number >= 0 (0: no warm-up)")
    if not 0 < gamma < math.inf:
        raise ValueError(f"lr_schedule.gamma={gamma!r}: must be a finite number > 0 (the lr factor at each milestone)")
    if not 0 <= floor <= 1:
        raise ValueError(f"lr_schedule.min_lr_ratio={floor!r}: must be in [0, 1] (the cosine floor as a fraction "
                         "of lr)")
    milestones = lr_schedule["milestones"]
    if not isinstance(milestones, (list, tuple)) or not all(
            isinstance(m, (int, float)) and not isinstance(m, bool) and 0 < m <= 1 for m in milestones):
        raise ValueError(f"lr_schedule.milestones={milestones!r}: must be a list of fractions of training in (0, 1], "
                         "e.g. [0.5, 0.75]")


def learning_rate(epoch: float, *, base_lr: float, epochs: int, name: str = "cosine", warmup_epochs: float = 0.0,
                  milestones: Sequence[float] = (0.5, 0.75), gamma: float = 0.1, min_lr_ratio: float = 0.0) -> float:
    """Learning rate at the fractional ``epoch``: linear warm-up, then ``cosine`` decay to ``min_lr_ratio *
    base_lr`` or ``step`` decay by ``gamma`` at each milestone (fractions of ``epochs``)."""
    check_schedule_name(name)
    if warmup_epochs > 0 and epoch < warmup_epochs:
        return base_lr * (epoch + 1e-3) / warmup_epochs
    if name == "cosine":
        span = max(epochs - warmup_epochs, 1e-8)
        progress = min(max((epoch - warmup_epochs) / span, 0.0), 1.0)
        floor = base_lr * min_lr_ratio
        return floor + (base_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    passed = sum(1 for milestone in milestones if epoch >= milestone * epochs)  # name == "step"
    return base_lr * gamma**passed
