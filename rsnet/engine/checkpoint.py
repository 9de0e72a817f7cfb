"""Training checkpoints: atomic writes, JSON-safe metadata, model rebuilt from the file alone."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

CHECKPOINT_FORMAT = 1
REQUIRED_KEYS = ("format_version", "model_config", "model_state", "class_names", "image_size", "mean", "std")


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format_version": CHECKPOINT_FORMAT, **payload}
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load an rsnet checkpoint, with a clear error when the file is missing or not one of ours."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass the path of a run's checkpoints/last.pt or best.pt")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ValueError(f"{path} could not be read as an rsnet checkpoint ({error})") from error
    if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED_KEYS):
        missing = [key for key in REQUIRED_KEYS if not isinstance(payload, dict) or key not in payload]
        raise ValueError(f"{path} is not an rsnet training checkpoint (missing {missing}); "
                         "export and evaluation need a file written by scripts/train.py")
    return payload


def model_from_checkpoint(checkpoint: dict[str, Any]) -> nn.Module:
    """Rebuild the trained model from a loaded checkpoint (no pretrained download)."""
    from rsnet.models import build_model

    config = {**checkpoint["model_config"], "pretrained": False}
    model = build_model(**config)
    model.load_state_dict(checkpoint["model_state"])
    return model
