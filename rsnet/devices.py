"""The device a command runs on: ``auto``, ``cpu`` or ``cuda[:i]``, checked against this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def resolve_device(name: str, setting: str = "device") -> torch.device:
    """``auto`` (CUDA when present, else the CPU), ``cpu`` or an existing ``cuda[:i]``; else an error naming it."""
    import torch  # here, not at the top: the commands import this module before they know they will run

    count = torch.cuda.device_count()
    if name == "auto":
        return torch.device("cuda" if count else "cpu")
    present = ", ".join(["cpu", *(f"cuda:{i}" for i in range(count))])
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"{setting}={name}: not a device rsnet runs on; use auto, cpu or cuda:<index> "
                         f"(this machine has: {present})")
    if device.type == "cuda" and (device.index or 0) >= count:
        raise ValueError(f"{setting}={name}: no such CUDA device here (this machine has: {present}); "
                         f"use {setting}=cpu or {setting}=auto")
    return device
