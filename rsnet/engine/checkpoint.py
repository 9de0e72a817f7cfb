"""Training checkpoints: atomic writes, JSON-safe metadata, model rebuilt from the file alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from rsnet.files import atomic_write

CHECKPOINT_FORMAT = 1
REQUIRED_KEYS = ("format_version", "model_config", "model_state", "class_names", "image_size", "mean", "std")


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (temp file in the same folder, then rename); a full disk raises
    :class:`rsnet.files.DiskFullError` and leaves the previous file as it was."""
    with atomic_write(path) as handle:
        torch.save({"format_version": CHECKPOINT_FORMAT, **payload}, handle)
    return Path(path)


def last_checkpoint(run_dir: str | Path) -> tuple[Path, int] | None:
    """A run's ``checkpoints/last.pt`` and the epoch it holds (its tensors mapped, not read), or None if the run
    has written none."""
    last = Path(run_dir) / "checkpoints" / "last.pt"
    if not last.is_file():
        return None
    return last, load_checkpoint(last, mmap=True)["epoch"]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False) -> dict[str, Any]:
    """Load an rsnet checkpoint, with a clear error when the file is missing or not one of ours. ``mmap``: map the
    tensors from the file instead of reading them (cheap when only the metadata, e.g. the config, is needed)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass the path of a run's checkpoints/last.pt or best.pt")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ValueError(f"{path} could not be read as an rsnet checkpoint ({error})") from error
    if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED_KEYS):
        missing = [key for key in REQUIRED_KEYS if not isinstance(payload, dict) or key not in payload]
        raise ValueError(f"{path} is not an rsnet training checkpoint (missing {missing}); "
                         "export and evaluation need a file written by scripts/train.py")
    return payload


def model_from_checkpoint(checkpoint: dict[str, Any], source: str | Path = "the checkpoint") -> nn.Module:
    """Rebuild the trained model from a loaded checkpoint (eval mode, no pretrained download).

    Raises ``ValueError`` naming ``source`` when the model config is incomplete, the class names do not match
    ``num_classes``, or the weights do not fit the model the config names.
    """
    from rsnet.models import build_model

    config = checkpoint["model_config"]
    if not isinstance(config, dict) or not {"arch", "backbone", "num_classes"} <= set(config):
        raise ValueError(f"{source}: model_config {config!r} lacks arch/backbone/num_classes; not an rsnet checkpoint")
    classes = list(checkpoint["class_names"])
    if len(classes) != config["num_classes"]:
        raise ValueError(f"{source}: class-count mismatch: {len(classes)} class names but the model has "
                         f"num_classes={config['num_classes']}")
    model = build_model(**{**config, "pretrained": False})
    state = checkpoint["model_state"]
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = sorted(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                        for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or mismatched:
        raise ValueError(
            f"{source}: the weights do not fit the model it names (arch={config['arch']}, "
            f"backbone={config['backbone']}, num_classes={config['num_classes']}); missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, shape mismatches {mismatched[:5]} — is it a checkpoint of another model?")
    model.load_state_dict(state)
    return model.eval()
