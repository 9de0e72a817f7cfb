"""Settings the scripts share, checked with one-line errors that name the setting: devices, whole numbers,
output files; and how the backbone's weights are named in run folders."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsnet.files import check_writable_dir

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


def tta_setting(value: Any, setting: str = "tta") -> str:
    """``value`` if it names a test-time augmentation (``none`` or ``d4``); else one line naming ``setting``."""
    if value not in ("none", "d4"):
        raise ValueError(f"{setting}={value!r}: must be none or d4 (d4 averages the logits of the 8 flips and "
                         "90-degree rotations of each image)")
    return str(value)


def bool_setting(setting: str, value: Any) -> bool:
    """``value`` as a bool (true/false, as Hydra parses them); else one line naming ``setting``."""
    if not isinstance(value, bool):
        raise ValueError(f"{setting}={value!r}: must be true or false")
    return value


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


def check_writable(path: str | Path, setting: str) -> Path:
    """Fail fast, naming ``setting``, when the file ``path`` could not be written (its folder is created)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{setting}={path} is a folder; pass the path of a file (in that folder or elsewhere)")
    check_writable_dir(path.parent, setting)
    return path
