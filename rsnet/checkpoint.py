"""A run's training checkpoints: written atomically with the SHA-256 of their contents, read back with one-line
errors for a missing, damaged or foreign file, and turned back into the trained model."""

from __future__ import annotations

import hashlib
import io
import logging
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rsnet.files import atomic_write
from rsnet.integrity import content_digest, load_weights, unreadable_reason
from rsnet.models import build_model

log = logging.getLogger(__name__)

CHECKPOINT_NAMES = ("best.pt", "last.pt")  # a run's checkpoints, in order of preference
CHECKPOINT_FORMAT = 2  # 2: with the SHA-256 of its contents (DIGEST_KEY); 1: without (loaded, with a warning)
DIGEST_KEY = "sha256"
FILE_DIGEST_KEY = "file_sha256"  # set by load_checkpoint: the SHA-256 of the file's bytes it read; never saved
REQUIRED_KEYS = ("format_version", "model_config", "model_state", "class_names", "image_size", "mean", "std")


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (temp file in the same folder, then rename); a full disk raises
    :class:`rsnet.files.DiskFullError` and leaves the previous file as it was."""
    contents = {key: value for key, value in payload.items()
                if key not in (DIGEST_KEY, FILE_DIGEST_KEY)}  # a loaded checkpoint's are stale
    contents["format_version"] = CHECKPOINT_FORMAT
    contents[DIGEST_KEY] = content_digest(contents)
    with atomic_write(path) as handle:
        torch.save(contents, handle)
    return Path(path)


def run_checkpoint_path(run_dir: str | Path, name: str = "last.pt") -> Path:
    """Where a run keeps a checkpoint: ``<run_dir>/checkpoints/<name>`` (``last.pt``, or ``best.pt``)."""
    return Path(run_dir) / "checkpoints" / name


def last_checkpoint(run_dir: str | Path) -> tuple[Path, int] | None:
    """A run's ``checkpoints/last.pt`` and the epoch it holds (its tensors mapped, not read), or None if the run
    has written none."""
    last = run_checkpoint_path(run_dir)
    if not last.is_file():
        return None
    return last, load_checkpoint(last, mmap=True)["epoch"]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False,
                    verify: bool | None = None) -> dict[str, Any]:
    """Load an rsnet checkpoint; a missing, damaged (SHA-256) or foreign file is one line. ``mmap``: for the metadata
    only; else the file is read once (``FILE_DIGEST_KEY``: the SHA-256 of the bytes read)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; "
                                "pass the path of a run's checkpoints/last.pt or best.pt")
    file_bytes = None
    try:
        if not mmap:
            file_bytes = path.read_bytes()
        source = path if file_bytes is None else io.BytesIO(file_bytes)
        payload = load_weights(source, map_location=map_location, mmap=mmap)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ValueError(f"{path} cannot be read as an rsnet checkpoint: {unreadable_reason(path)}{_REPLACE}") \
            from error
    if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED_KEYS):
        missing = [key for key in REQUIRED_KEYS if not isinstance(payload, dict) or key not in payload]
        raise ValueError(f"{path} is not an rsnet training checkpoint (missing {missing}); "
                         "export and evaluation need a file written by scripts/train.py")
    if (not mmap) if verify is None else verify:
        _verify_digest(path, payload)
    if file_bytes is not None:
        payload[FILE_DIGEST_KEY] = hashlib.sha256(file_bytes).hexdigest()
    return payload


_REPLACE = ("; if it is a run's last.pt, resume from another copy or start the run again (overwrite=true); a best.pt "
            "can be rebuilt only by training")


def _verify_digest(path: Path, payload: dict[str, Any]) -> None:
    """Refuse a checkpoint whose contents differ from the digest written with them (a flipped bit, a damaged
    copy); warn once for one written before checkpoints carried a digest."""
    stored = payload.get(DIGEST_KEY)
    if stored is None:
        if payload["format_version"] >= 2:
            raise ValueError(f"{path} has lost its content hash ({DIGEST_KEY}): the file was altered{_REPLACE}")
        log.warning("%s was written by an rsnet without content hashes: its weights cannot be verified", path)
        return
    contents = {key: value for key, value in payload.items() if key != DIGEST_KEY}
    if content_digest(contents) != stored:
        raise ValueError(f"{path} is damaged: its contents do not match the SHA-256 written with them (a changed "
                         f"bit on disk or in a copy){_REPLACE}")


def check_normalisation(mean: Any, std: Any, channels: int, source: str | Path) -> None:
    """ValueError naming ``source`` unless ``mean`` and ``std`` (a model's normalisation, per input band) are
    ``channels`` finite numbers each, every std above 0: anything else gives NaN or wrong inputs without a word."""
    fix = "retrain, or restore the file from the run that wrote it"
    for name, values in (("mean", mean), ("std", std)):
        try:
            numbers = [float(value) for value in values]
        except (TypeError, ValueError):
            raise ValueError(f"{source}: its {name} {values!r} is not a list of numbers: {fix}") from None
        if len(numbers) != channels:
            raise ValueError(f"{source}: its {name} has {len(numbers)} entries, and the model reads {channels} "
                             f"band(s): {fix}")
        bad = [k + 1 for k, value in enumerate(numbers) if not math.isfinite(value) or name == "std" and value <= 0]
        if bad:
            what = "finite numbers above 0" if name == "std" else "finite numbers"
            raise ValueError(f"{source}: its {name} of band(s) {bad} is {[numbers[k - 1] for k in bad]}, and must be "
                             f"{what} (the model's inputs would be NaN or infinite): {fix}")


def model_from_checkpoint(checkpoint: dict[str, Any], source: str | Path = "the checkpoint") -> nn.Module:
    """Rebuild the trained model from a loaded checkpoint (eval mode, no pretrained download); ValueError naming
    ``source`` when its config, class names and weights do not fit together."""
    config = checkpoint["model_config"]
    if not isinstance(config, dict) or not {"arch", "backbone", "num_classes"} <= set(config):
        raise ValueError(f"{source}: model_config {config!r} lacks arch/backbone/num_classes; not an rsnet checkpoint")
    classes = list(checkpoint["class_names"])
    if len(classes) != config["num_classes"]:
        raise ValueError(f"{source}: class-count mismatch: {len(classes)} class names but the model has "
                         f"num_classes={config['num_classes']}")
    check_normalisation(checkpoint["mean"], checkpoint["std"], int(config.get("in_chans", 3)), source)
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
