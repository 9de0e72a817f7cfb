"""Values of the commands' settings, checked with one-line errors that name the setting: whole numbers, true/false,
test-time augmentation, output files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rsnet.files import check_writable_dir


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


def check_writable(path: str | Path, setting: str) -> Path:
    """Fail fast, naming ``setting``, when the file ``path`` could not be written (its folder is created)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{setting}={path} is a folder; pass the path of a file (in that folder or elsewhere)")
    check_writable_dir(path.parent, setting)
    return path
