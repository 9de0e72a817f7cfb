"""How a run's folder names its data and protocol: runs on other data (or other bands of it), or with another train
ratio, validation ratio, image size or starting weights, are not comparable and never share a folder."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from collections.abc import Sequence
from typing import Any

IMAGE_FOLDER = "image_folder"  # dataset.name of the user's own data (rsnet.data.specs, not imported: it needs torch)
ROOT_HASH_LENGTH = 8  # hex digits of the SHA-256 of an image folder's resolved root in its run folder's name


def dataset_folder(name: Any, root: Any, bands: Any = None) -> str:
    """The dataset part of a run's folder name: a shipped dataset's name, or ``image_folder``, the folder's name and a
    short hash of its resolved root (``image_folder-my_scenes-1a2b3c4d``); with ``dataset.bands``, the bands read
    (``eurosat_ms_bands-all``, ``eurosat_ms_bands-B04-B03-B02-B08``)."""
    folder = str(name)
    if name == IMAGE_FOLDER and root not in (None, ""):
        resolved = Path(str(root)).expanduser().resolve()
        readable = re.sub(r"[^\w.-]+", "_", resolved.name).strip("._") or "root"
        digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:ROOT_HASH_LENGTH]
        folder = f"{IMAGE_FOLDER}-{readable}-{digest}"
    if bands is None:
        return folder
    listed = "-".join(str(band) for band in bands) if isinstance(bands, Sequence) and not isinstance(bands, str) \
        else str(bands)
    return f"{folder}_bands-" + re.sub(r"[^\w.-]+", "_", listed)


def parse_pretrained(pretrained: Any) -> bool | Path:
    """``backbone.pretrained`` as False (no weights), True (the backbone's published weights) or the path of a
    weights file; the strings "true" and "false" (any case, spaces around) and "" are what they say."""
    if isinstance(pretrained, str) and pretrained.strip().lower() in ("true", "false", ""):
        return pretrained.strip().lower() == "true"
    if isinstance(pretrained, bool) or not pretrained:
        return bool(pretrained)
    return Path(str(pretrained)).expanduser()


def pretrained_tag(pretrained: Any) -> str:
    """``backbone.pretrained`` in a run's folder name and metrics.json: ``scratch`` (no weights), ``pretrained``
    (the backbone's published weights) or the weights file's name without its suffix."""
    parsed = parse_pretrained(pretrained)
    if isinstance(parsed, bool):
        return "pretrained" if parsed else "scratch"
    return parsed.stem


def protocol_folder(train_ratio: Any, val_ratio: Any, image_size: Any, pretrained: Any) -> str:
    """The protocol part of a run's folder name, e.g. ``r0.5_64px_scratch`` or ``r0.2_val0.1_224px_pretrained``:
    runs of one dataset that differ in it are not comparable and must not share a folder."""
    validation = f"_val{val_ratio}" if val_ratio not in (None, 0, 0.0, "0", "0.0") else ""
    return f"r{train_ratio}{validation}_{image_size}px_{pretrained_tag(pretrained)}"
