"""Protocol splits: stratified per-class train ratio, seeded, saved as relative file lists so a run can be reproduced
after the dataset moved; an optional validation part is carved from the training part (docs/data.md, Splits)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from rsnet.files import write_json

from .errors import SplitMismatchError

__all__ = ["Split", "SplitRows", "stratified_split", "check_train_ratio", "check_val_ratio"]

SPLIT_FORMAT = 1


def check_train_ratio(train_ratio: float, setting: str = "dataset.train_ratio") -> float:
    """Return ``train_ratio`` as float; ValueError naming the setting unless 0 < ratio < 1."""
    try:
        r = float(train_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"{setting} must be a number in (0, 1), got {train_ratio!r}") from None
    if not 0.0 < r < 1.0:
        raise ValueError(f"{setting}={train_ratio!r}: must lie strictly between 0 and 1 (the protocol uses e.g. "
                         "0.2/0.5 for AID, 0.1/0.2 for NWPU-RESISC45, 0.5/0.8 for UC-Merced)")
    return r


def check_val_ratio(val_ratio: float, setting: str = "dataset.val_ratio") -> float:
    """Return ``val_ratio`` as float; ValueError naming the setting unless 0 <= ratio < 1."""
    try:
        r = float(val_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"{setting} must be a number in [0, 1), got {val_ratio!r}") from None
    if not 0.0 <= r < 1.0:
        raise ValueError(f"{setting} must be in [0, 1) (the fraction of the training part held out for "
                         f"validation; 0: none), got {val_ratio!r}")
    return r


class SplitRows(NamedTuple):
    """Positions of a split's parts in the dataset's file list (int64 arrays; ``val`` may be empty)."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


@dataclass
class Split:
    """A train/val/test partition of one dataset, as relative file names ``<class>/<file>``; ``val`` is held out
    of the training part (``train_ratio`` of every class) at ``val_ratio``."""

    dataset: str
    train_ratio: float
    seed: int
    class_names: list[str]
    train: list[str]
    test: list[str]
    val: list[str] = field(default_factory=list)
    val_ratio: float = 0.0
    format_version: int = field(default=SPLIT_FORMAT)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the split as JSON (atomically). Returns the path."""
        path = Path(path)
        write_json(path, asdict(self), indent=1)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Split":
        """Read a split written by :meth:`save` (one written before validation parts existed has none)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"split file '{path}' does not exist: the run directory's split.json is missing")
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in ("dataset", "train_ratio", "seed", "class_names", "train", "test")},
                       val=data.get("val", []), val_ratio=data.get("val_ratio", 0.0))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"split file '{path}' is not a valid rsnet split: {exc}") from exc

    def indices(self, names: Sequence[str], class_names: Sequence[str] | None = None, root: str = "") -> SplitRows:
        """Positions of the train, val and test files in ``names`` (the dataset's file list); SplitMismatchError
    if the split names classes or files the dataset does not have."""
        if class_names is not None and list(class_names) != list(self.class_names):
            raise SplitMismatchError(
                f"split of '{self.dataset}' has classes {self.class_names[:5]}... which differ from the "
                f"dataset's {list(class_names)[:5]}..."
            )
        pos = {k: i for i, k in enumerate(names)}
        missing = [f for f in (*self.train, *self.val, *self.test) if f not in pos]
        if missing:
            where = f" under '{root}'" if root else ""
            raise SplitMismatchError(
                f"split of '{self.dataset}' lists {len(missing)} file(s) not found{where}, e.g. "
                f"{missing[:3]}; the split was made from a different copy of the dataset"
            )
        return SplitRows(*(np.array([pos[f] for f in part], np.int64) for part in (self.train, self.val, self.test)))

    def restricted(self, drop: set[str]) -> "Split":
        """The same split without the files in ``drop`` (e.g. skipped corrupt images)."""
        def keep(files: list[str]) -> list[str]:
            return [f for f in files if f not in drop]

        return replace(self, class_names=list(self.class_names), train=keep(self.train), val=keep(self.val),
                       test=keep(self.test))


def _part_size(ratio: float, n: int) -> int:
    """``round(ratio · n)`` (half up), kept within [1, n - 1] when ``n`` >= 2."""
    k = int(np.floor(ratio * n + 0.5))
    return min(max(k, 1), n - 1) if n >= 2 else k


def stratified_split(names: Sequence[str], labels: Sequence[int] | np.ndarray, train_ratio: float, seed: int,
                     class_names: Sequence[str], dataset: str = "", val_ratio: float = 0.0) -> Split:
    """Draw ``round(train_ratio · n_c)`` files of every class for train, the rest for test, then ``round(val_ratio ·
    t_c)`` of train for val (its own generator), whatever the order of ``names``."""
    ratio = check_train_ratio(train_ratio)
    val_ratio = check_val_ratio(val_ratio)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    val_rng = np.random.default_rng([int(seed), 1])
    train: list[str] = []
    val: list[str] = []
    test: list[str] = []
    by_class: dict[int, list[str]] = {c: [] for c in range(len(class_names))}
    for k, lab in zip(names, labels.tolist()):
        by_class[int(lab)].append(k)
    for c in range(len(class_names)):
        files = sorted(by_class[c])
        perm = rng.permutation(len(files))
        chosen = set(perm[:_part_size(ratio, len(files))].tolist())
        class_train = [f for i, f in enumerate(files) if i in chosen]
        test += [f for i, f in enumerate(files) if i not in chosen]
        n_val = _part_size(val_ratio, len(class_train)) if val_ratio > 0 and len(class_train) >= 2 else 0
        held = set(val_rng.permutation(len(class_train))[:n_val].tolist())
        train += [f for i, f in enumerate(class_train) if i not in held]
        val += [f for i, f in enumerate(class_train) if i in held]
    return Split(dataset, ratio, int(seed), list(class_names), train, test, val, val_ratio)
