"""Protocol splits: stratified per-class train ratio, seeded, saved as file lists.

A :class:`Split` holds relative file names (``<class>/<file>``) so it stays valid when the dataset is
moved; ``Split.save`` writes JSON (atomically) and ``Split.load`` reads it back, so a run can be
reproduced exactly from its run directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import SplitMismatchError

__all__ = ["Split", "stratified_split", "check_train_ratio"]

SPLIT_FORMAT = 1


def check_train_ratio(train_ratio: float, setting: str = "dataset.train_ratio") -> float:
    """Return ``train_ratio`` as float; ValueError naming the setting unless 0 < ratio < 1."""
    try:
        r = float(train_ratio)
    except (TypeError, ValueError):
        raise ValueError(f"{setting} must be a number in (0, 1), got {train_ratio!r}") from None
    if not 0.0 < r < 1.0:
        raise ValueError(f"{setting} must be in the open interval (0, 1), got {train_ratio!r}")
    return r


@dataclass
class Split:
    """A train/test partition of one dataset, as relative file names.

    Attributes:
        dataset: dataset name.
        train_ratio: fraction of every class put in train.
        seed: the seed that drew it.
        class_names: class order (label i = class_names[i]).
        train, test: relative file names "<class>/<file>".
    """

    dataset: str
    train_ratio: float
    seed: int
    class_names: list[str]
    train: list[str]
    test: list[str]
    format_version: int = field(default=SPLIT_FORMAT)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the split as JSON (temp file + rename). Returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Split":
        """Read a split written by :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"split file '{path}' does not exist (dataset.split_file)")
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in ("dataset", "train_ratio", "seed", "class_names", "train", "test")})
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"split file '{path}' is not a valid rsnet split: {exc}") from exc

    def indices(self, keys: Sequence[str], class_names: Sequence[str] | None = None, root: str = "") -> tuple[np.ndarray, np.ndarray]:
        """Positions of the train and test files in ``keys`` (the dataset's file list).

        Raises:
            SplitMismatchError: the split names classes or files the dataset does not have.
        """
        if class_names is not None and list(class_names) != list(self.class_names):
            raise SplitMismatchError(
                f"split of '{self.dataset}' has classes {self.class_names[:5]}... which differ from the "
                f"dataset's {list(class_names)[:5]}..."
            )
        pos = {k: i for i, k in enumerate(keys)}
        missing = [f for f in (*self.train, *self.test) if f not in pos]
        if missing:
            where = f" under '{root}'" if root else ""
            raise SplitMismatchError(
                f"split of '{self.dataset}' lists {len(missing)} file(s) not found{where}, e.g. "
                f"{missing[:3]}; the split was made from a different copy of the dataset"
            )
        return (np.array([pos[f] for f in self.train], np.int64),
                np.array([pos[f] for f in self.test], np.int64))

    def restricted(self, drop: set[str]) -> "Split":
        """The same split without the files in ``drop`` (e.g. skipped corrupt images)."""
        return Split(self.dataset, self.train_ratio, self.seed, list(self.class_names),
                     [f for f in self.train if f not in drop], [f for f in self.test if f not in drop])


def stratified_split(
    keys: Sequence[str],
    labels: Sequence[int] | np.ndarray,
    train_ratio: float,
    seed: int,
    class_names: Sequence[str],
    dataset: str = "",
) -> Split:
    """Draw ``round(train_ratio · n_c)`` files of every class c for train (at least one file in
    each part when the class has two or more), the rest for test.

    Deterministic in (file set, ratio, seed), independent of the order of ``keys``.
    """
    ratio = check_train_ratio(train_ratio)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train: list[str] = []
    test: list[str] = []
    by_class: dict[int, list[str]] = {c: [] for c in range(len(class_names))}
    for k, lab in zip(keys, labels.tolist()):
        by_class[int(lab)].append(k)
    for c in range(len(class_names)):
        files = sorted(by_class[c])
        n = len(files)
        n_train = int(np.floor(ratio * n + 0.5))  # round half up
        if n >= 2:
            n_train = min(max(n_train, 1), n - 1)
        perm = rng.permutation(n)
        chosen = set(perm[:n_train].tolist())
        train += [f for i, f in enumerate(files) if i in chosen]
        test += [f for i, f in enumerate(files) if i not in chosen]
    return Split(dataset, ratio, int(seed), list(class_names), train, test)
