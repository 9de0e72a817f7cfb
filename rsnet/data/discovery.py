"""Finding a dataset on disk: :func:`find_class_root` searches breadth-first for the folder holding the class folders,
:func:`scan_dataset` lists and validates them."""

from __future__ import annotations

import importlib.resources
import os
import re
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DatasetCountWarning, DatasetNotFoundError, DatasetValidationError
from .specs import IMAGE_EXTENSIONS, IMAGE_FOLDER, DatasetSpec, get_spec, is_image_file

__all__ = ["ScanResult", "dataset_not_found", "default_root", "find_class_root", "scan_dataset"]

_MAX_DEPTH = 4  # how far below the given root the class folders may be
_MAX_DIRS = 5000  # stop searching after this many folders


def default_root(name: str) -> Path | None:
    """Default root: the bundled sample for ``ucmerced_mini`` (package data ``rsnet.sample``, else the checkout's
    data/ucmerced-mini), else None."""
    if get_spec(name).name != "ucmerced_mini":
        return None
    try:
        sample = importlib.resources.files("rsnet.sample") / "ucmerced-mini"
    except ModuleNotFoundError:
        sample = None
    if isinstance(sample, Path) and sample.is_dir():
        return sample
    return Path(__file__).resolve().parents[2] / "data" / "ucmerced-mini"


def dataset_not_found(spec: DatasetSpec, root: Path, why: str) -> DatasetNotFoundError:
    """The error for a dataset missing under ``root``: where it looked, the layout it expected, where to download."""
    return DatasetNotFoundError(
        f"{spec.title} ('{spec.name}') not found: {why}.\n"
        f"  looked in: '{root}' and its sub-folders down to {_MAX_DEPTH} levels\n"
        f"  expected layout: {spec.layout} ({spec.num_classes} class folders, e.g. "
        f"'{spec.classes[0]}', '{spec.classes[1]}')\n"
        f"  set dataset.root to the folder holding '{spec.base_dir}' or any folder down to the class folders\n"
        f"  download: {spec.url}"
    )


def _natural_key(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _subdirs(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def find_class_root(spec: DatasetSpec | str, root: str | os.PathLike) -> Path:
    """The folder whose sub-folders are the class folders, searched breadth-first from ``root``: the one with
    the most sub-folders named like classes wins (the shallowest on ties)."""
    spec = get_spec(spec, root)
    root = Path(root).expanduser()
    if not root.exists():
        raise dataset_not_found(spec, root, "the root folder does not exist")
    if not root.is_dir():
        raise dataset_not_found(spec, root, "the root is not a folder")
    if not any(root.iterdir()):
        raise dataset_not_found(spec, root, "the root folder is empty")
    classes = set(spec.classes)
    best: tuple[tuple[int, bool, int], Path] | None = None
    # the archive's own class-folder parent (base_dir/images_subdir) is searched too, however deep (EuroSAT MS: 6)
    direct = [root / spec.base_dir / spec.images_subdir, root / spec.images_subdir] if spec.images_subdir else []
    queue: deque[tuple[Path, int]] = deque([(root, 0), *((p, 0) for p in direct if p.is_dir())])
    seen = 0
    while queue and seen < _MAX_DIRS:
        d, depth = queue.popleft()
        seen += 1
        subs = _subdirs(d)
        hits = sum(p.name in classes for p in subs)
        if hits:
            # most class folders first; then prefer a folder inside the archive's own top folder
            # (e.g. UCMerced_LandUse over the bundled ucmerced-mini, which has the same classes)
            in_archive = spec.base_dir in d.resolve().parts
            score = (hits, in_archive, -depth)
            if best is None or score > best[0]:
                best = (score, d)
            if hits == len(classes) and in_archive:
                break
        if depth < _MAX_DEPTH:
            queue.extend((p, depth + 1) for p in subs if p.name not in classes)
    if best is None:
        raise dataset_not_found(spec, root, "no folder below it has sub-folders named like the classes")
    return best[1]


@dataclass
class ScanResult:
    """Files found in a dataset's class folders: relative ``names`` "<class>/<file>" in class order, and their
    ``labels``."""

    spec: DatasetSpec
    class_root: Path
    names: list[str]
    labels: np.ndarray

    @property
    def paths(self) -> list[str]:
        return [str(self.class_root / k) for k in self.names]

    def counts(self) -> dict[str, int]:
        n = np.bincount(self.labels, minlength=self.spec.num_classes)
        return dict(zip(self.spec.classes, n.tolist()))


def scan_dataset(spec: DatasetSpec | str, root: str | os.PathLike, check_counts: bool = True) -> ScanResult:
    """Find and validate the class folders of ``spec`` under ``root``: DatasetValidationError for missing,
    unexpected or empty class folders; DatasetCountWarning for unusual counts (``check_counts``)."""
    spec = get_spec(spec, root)
    class_root = find_class_root(spec, root)
    dirs = {p.name: p for p in _subdirs(class_root)}
    names: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    for label, c in enumerate(spec.classes):
        if c not in dirs:
            continue
        files = sorted((f.name for f in dirs[c].iterdir() if is_image_file(f)), key=_natural_key)
        if not files:
            empty.append(c)
        names += [f"{c}/{f}" for f in files]
        labels += [label] * len(files)
    _check_class_folders(spec, class_root, set(dirs), empty)
    result = ScanResult(spec, class_root, names, np.asarray(labels, np.int64))
    if check_counts:
        _warn_unexpected_counts(result)
    return result


def _check_class_folders(spec: DatasetSpec, class_root: Path, folders: set[str], empty: list[str]) -> None:
    """One :class:`DatasetValidationError` listing missing class folders, unexpected folders and classes without
    images."""
    missing = [c for c in spec.classes if c not in folders]
    # image_folder's classes are its sub-folders with images: the others are not classes, not errors
    unexpected = [] if spec.name == IMAGE_FOLDER else sorted(folders - set(spec.classes))
    problems = []
    if missing:
        problems.append(f"missing class folders ({len(missing)}): {missing}")
    if unexpected:
        problems.append(f"unexpected folders ({len(unexpected)}) that are not {spec.name} classes: {unexpected}")
    if empty:
        problems.append(f"class folders without images ({len(empty)}; extensions {list(IMAGE_EXTENSIONS)}): {empty}")
    if problems:
        raise DatasetValidationError(
            f"{spec.title} at '{class_root}' does not match the expected layout {spec.layout}:\n  "
            + "\n  ".join(problems)
        )


def _warn_unexpected_counts(scan: ScanResult) -> None:
    """A :class:`DatasetCountWarning` when per-class counts differ from the official archive."""
    spec, found = scan.spec, scan.counts()
    off = {c: (found[c], spec.counts[c]) for c in spec.classes if found[c] != spec.counts[c]}
    if off:
        sample = ", ".join(f"{c}: {n} (expected {e})" for c, (n, e) in list(off.items())[:5])
        warnings.warn(
            f"{spec.title} at '{scan.class_root}': {len(off)} of {spec.num_classes} classes hold a different "
            f"number of images than the official archive ({len(scan.names)} images, expected "
            f"{spec.num_images}): {sample}{' ...' if len(off) > 5 else ''}",
            DatasetCountWarning,
            stacklevel=3,
        )
