"""Settings the scripts share, checked with one-line errors that name the setting: devices, whole numbers,
output files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rsnet.files import check_writable_dir


def resolve_device(name: str, setting: str = "device") -> torch.device:
    """``auto`` (CUDA when present, else the CPU), ``cpu`` or an existing ``cuda[:i]``; else an error naming it."""
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


def int_setting(setting: str, value: Any, minimum: int | None = None) -> int:
    """``value`` (an int or its text) as an int of at least ``minimum``; else one line naming ``setting``."""
    number = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, str):
        try:
            number = int(value)
        except ValueError:
            number = None
    if number is None or (minimum is not None and number < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"{setting}={value!r}: must be a whole number{bound}")
    return number


def bool_setting(setting: str, value: Any) -> bool:
    """``value`` as a bool (true/false, as Hydra parses them); else one line naming ``setting``."""
    if not isinstance(value, bool):
        raise ValueError(f"{setting}={value!r}: must be true or false")
    return value


def check_writable(path: str | Path, setting: str) -> Path:
    """Fail fast, naming ``setting``, when the file ``path`` could not be written (its folder is created)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{setting}={path} is a folder; pass the path of a file (in that folder or elsewhere)")
    check_writable_dir(path.parent, setting)
    return path
