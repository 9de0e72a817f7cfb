"""The options of a launch, read from the trainer config (its values live in conf/trainer/ and conf/_base/)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def launch_options(trainer_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`rsnet.parallel.launch` that come from the trainer config."""
    slowdown = trainer_cfg["slowdown"]
    backend = trainer_cfg["backend"]
    return {"timeout_s": float(trainer_cfg["timeout_s"]),
            "slowdown": [float(s) for s in slowdown] if slowdown else None,
            "backend": backend if backend != "auto" else None,
            "cpu_threads": trainer_cfg["cpu_threads"]}
