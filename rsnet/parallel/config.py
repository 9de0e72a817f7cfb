"""Reading the trainer config (a dict or an OmegaConf node): one setting, and the options of a launch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def setting(trainer_cfg: Any, key: str, default: Any) -> Any:
    """``trainer_cfg[key]``, or ``default`` where it is missing or null."""
    readable = isinstance(trainer_cfg, Mapping) or hasattr(trainer_cfg, "get")
    value = trainer_cfg.get(key, default) if readable else default
    return default if value is None else value


def launch_options(trainer_cfg: Any) -> dict[str, Any]:
    """The keyword arguments of :func:`rsnet.parallel.launch` that come from the trainer config."""
    slowdown = setting(trainer_cfg, "slowdown", None)
    backend = setting(trainer_cfg, "backend", "auto")
    return {"timeout_s": float(setting(trainer_cfg, "timeout_s", 600.0)),
            "slowdown": [float(s) for s in slowdown] if slowdown else None,
            "backend": backend if backend != "auto" else None,
            "cpu_threads": setting(trainer_cfg, "cpu_threads", None)}
