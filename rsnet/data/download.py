"""Fetching a dataset whose spec names an archive (``DatasetSpec.download_url``): :func:`download_dataset`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .discovery import dataset_not_found, find_class_root
from .errors import DatasetNotFoundError
from .specs import DatasetSpec, get_spec

__all__ = ["download_dataset"]


def _is_present(spec: DatasetSpec, root: Path) -> bool:
    """Every class folder of ``spec`` is below ``root``, inside the archive's own top folder (EuroSAT RGB and MS
    share their class names: one must not pass for the other)."""
    try:
        class_root = find_class_root(spec, root)
    except DatasetNotFoundError:
        return False
    return spec.base_dir in class_root.resolve().parts and all((class_root / c).is_dir() for c in spec.classes)


def download_dataset(name: str, root: str | os.PathLike) -> Path:
    """Download the archive of dataset ``name`` into ``root`` and unpack it there (md5 checked; the archive is
    deleted once unpacked), unless its layout is already below ``root``; returns ``root``.

    ValueError for a dataset without a download (the message says where to get it by hand); DatasetNotFoundError
    when the unpacked archive does not hold the expected layout."""
    spec = get_spec(name)
    if not spec.download_url:
        raise ValueError(f"dataset {spec.name!r} cannot be downloaded by rsnet; get it by hand from {spec.url}")
    root = Path(root).expanduser()
    if not _is_present(spec, root):
        _download(spec, root)
        if not _is_present(spec, root):
            raise dataset_not_found(spec, root, f"the archive {spec.download_url} did not unpack to the layout")
    return root


def _download(spec: DatasetSpec, root: Path) -> None:
    """Fetch and unpack ``spec``'s archive into ``root``; a failed download (no network, a refused connection, a
    damaged archive) is one :class:`DatasetNotFoundError` line, and a ``root`` it created is removed again."""
    from torchvision.datasets.utils import download_and_extract_archive  # imports torch: only when needed

    created = not root.exists()
    try:
        download_and_extract_archive(spec.download_url, root, md5=spec.download_md5, remove_finished=True)
    except (OSError, RuntimeError) as error:  # OSError: urllib's URLError too; RuntimeError: torchvision's md5 check
        if created:
            shutil.rmtree(root, ignore_errors=True)
        reason = getattr(error, "reason", None) or error
        raise DatasetNotFoundError(
            f"dataset.download=true: cannot download {spec.download_url} ({reason}); check the network (a proxy is "
            f"read from https_proxy), or get the archive by hand from {spec.url}, unpack it and set dataset.root to "
            "its folder") from None
