"""Scene-classification datasets: locate the class folders, validate them, split, decode once.

``build_datasets`` is the one entry point used by the trainer::

    bundle = build_datasets("ucmerced_mini", "data/ucmerced-mini", train_ratio=0.5, seed=0, image_size=128)
    x, y = bundle.train.get_batch([0, 1, 2])      # (3, 3, 128, 128) float, (3,) int64
    bundle.split.save(run_dir / "split.json")     # reproduce later with split_file=...

With ``val_ratio`` > 0 a validation part is carved from the training part (``bundle.val``).
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import re
import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from torch.utils.data import Dataset

from .cache import ImageStore, build_store
from .decode import DEFAULT_HIGH_BIT_DEPTH, describe_rescaled
from .errors import (
    CorruptImageWarning,
    DatasetCountWarning,
    DatasetNotFoundError,
    DatasetValidationError,
    HighBitDepthWarning,
)
from .specs import (DATASETS, IMAGE_EXTENSIONS, IMAGE_FOLDER, DatasetSpec, image_folder_spec,
                    is_image_file)
from .splits import Split, SplitRows, check_train_ratio, check_val_ratio, stratified_split
from .transforms import IMAGENET_MEAN, IMAGENET_STD, augmentation_options, eval_transform, train_transform

__all__ = [
    "DataBundle",
    "SceneDataset",
    "ScanResult",
    "build_datasets",
    "default_root",
    "find_class_root",
    "get_spec",
    "scan_dataset",
]

log = logging.getLogger(__name__)

_MAX_DEPTH = 4  # how far below the given root the class folders may be
_MAX_DIRS = 5000  # stop searching after this many folders


def get_spec(name: str | DatasetSpec, root: str | os.PathLike | None = None) -> DatasetSpec:
    """The :class:`DatasetSpec` of a config name; ValueError listing valid names.

    ``image_folder`` (the user's own data) has no fixed spec: it is read from ``root`` (required) by
    :func:`~rsnet.data.specs.image_folder_spec`; the other names ignore ``root``."""
    if isinstance(name, DatasetSpec):
        return name
    if name == IMAGE_FOLDER:
        return image_folder_spec(root)
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset.name {name!r}; valid names: {sorted([*DATASETS, IMAGE_FOLDER])}") from None


def default_root(name: str) -> Path | None:
    """Default root: the bundled sample for ``ucmerced_mini``, else None.

    The sample is the package data ``rsnet.sample`` (the checkout's data/ folder, installed inside the package);
    where that cannot be imported as a folder, the checkout's data/ucmerced-mini."""
    if get_spec(name).name != "ucmerced_mini":
        return None
    try:
        sample = importlib.resources.files("rsnet.sample") / "ucmerced-mini"
    except ModuleNotFoundError:
        sample = None
    if isinstance(sample, Path) and sample.is_dir():
        return sample
    return Path(__file__).resolve().parents[2] / "data" / "ucmerced-mini"


def _natural_key(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _subdirs(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def _not_found(spec: DatasetSpec, root: Path, why: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"{spec.title} ('{spec.name}') not found: {why}.\n"
        f"  looked in: '{root}' and its sub-folders down to {_MAX_DEPTH} levels\n"
        f"  expected layout: {spec.layout} ({spec.num_classes} class folders, e.g. "
        f"'{spec.classes[0]}', '{spec.classes[1]}')\n"
        f"  set dataset.root to the folder holding '{spec.base_dir}' or any folder down to the class folders\n"
        f"  download: {spec.url}"
    )


def find_class_root(spec: DatasetSpec | str, root: str | os.PathLike) -> Path:
    """The folder whose sub-folders are the class folders, searched breadth-first from ``root``.

    ``root`` may be the archive's top folder, its parent, or any folder down to the class folders
    (e.g. ``UCMerced_LandUse``, ``UCMerced_LandUse/Images``). The folder with the most sub-folders
    named like classes wins (the shallowest on ties).

    Raises:
        DatasetNotFoundError: root missing, empty, or no class folder found below it.
    """
    spec = get_spec(spec, root)
    root = Path(root).expanduser()
    if not root.exists():
        raise _not_found(spec, root, "the root folder does not exist")
    if not root.is_dir():
        raise _not_found(spec, root, "the root is not a folder")
    if not any(root.iterdir()):
        raise _not_found(spec, root, "the root folder is empty")
    classes = set(spec.classes)
    best: tuple[tuple[int, bool, int], Path] | None = None
    queue: deque[tuple[Path, int]] = deque([(root, 0)])
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
        raise _not_found(spec, root, "no folder below it has sub-folders named like the classes")
    return best[1]


@dataclass
class ScanResult:
    """Files found in a dataset's class folders.

    Attributes:
        spec: the dataset's spec.
        class_root: the folder holding the class folders.
        keys: relative file names "<class>/<file>", grouped by class in class order.
        labels: class index of every file.
    """

    spec: DatasetSpec
    class_root: Path
    keys: list[str]
    labels: np.ndarray

    @property
    def paths(self) -> list[str]:
        return [str(self.class_root / k) for k in self.keys]

    def counts(self) -> dict[str, int]:
        n = np.bincount(self.labels, minlength=self.spec.num_classes)
        return dict(zip(self.spec.classes, n.tolist()))


def scan_dataset(spec: DatasetSpec | str, root: str | os.PathLike, check_counts: bool = True) -> ScanResult:
    """Find and validate the class folders of ``spec`` under ``root``.

    Errors (:class:`DatasetValidationError`): missing classes, unexpected class folders, classes
    without images. Warning (:class:`DatasetCountWarning`): per-class counts that differ from the
    official archive (only when ``check_counts``). Hidden folders and non-image files are ignored.
    """
    spec = get_spec(spec, root)
    class_root = find_class_root(spec, root)
    dirs = {p.name: p for p in _subdirs(class_root)}
    missing = [c for c in spec.classes if c not in dirs]
    # image_folder's classes are its sub-folders with images: the others are not classes, not errors
    unexpected = [] if spec.name == IMAGE_FOLDER else sorted(set(dirs) - set(spec.classes))
    keys: list[str] = []
    labels: list[int] = []
    empty: list[str] = []
    for label, c in enumerate(spec.classes):
        if c not in dirs:
            continue
        files = sorted(
            (f.name for f in dirs[c].iterdir() if is_image_file(f)),
            key=_natural_key,
        )
        if not files:
            empty.append(c)
        keys += [f"{c}/{f}" for f in files]
        labels += [label] * len(files)
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
    result = ScanResult(spec, class_root, keys, np.asarray(labels, np.int64))
    if check_counts:
        found = result.counts()
        off = {c: (found[c], spec.counts[c]) for c in spec.classes if found[c] != spec.counts[c]}
        if off:
            sample = ", ".join(f"{c}: {n} (expected {e})" for c, (n, e) in list(off.items())[:5])
            warnings.warn(
                f"{spec.title} at '{class_root}': {len(off)} of {spec.num_classes} classes hold a different "
                f"number of images than the official archive ({len(keys)} images, expected "
                f"{spec.num_images}): {sample}{' ...' if len(off) > 5 else ''}",
                DatasetCountWarning,
                stacklevel=2,
            )
    return result


def _normalize_nchw(u8: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """uint8 (B, H, W, C) -> float32 (B, C, H, W) ``(x - mean) / std`` on the calling thread.

    ``cv2.split`` de-interleaves the whole batch into C contiguous planes in one call (numpy's strided
    HWC->CHW copy costs twice as much), then each plane is cast and normalised in place. The values
    equal torch's ``permute().float().sub_(mean).div_(std)`` bit for bit. No torch intra-op threads:
    they gain little on this memory-bound copy, and on a machine whose cores are busy (or while the
    training step runs beside the ``BatchPrefetcher`` thread) they can stall waiting for a descheduled worker."""
    b, h, w, c = u8.shape
    out = np.empty((b, c, h, w), np.float32)
    planes = cv2.split(np.ascontiguousarray(u8).reshape(b * h, w, c)) if c > 1 else [u8]
    for k in range(c):
        plane = out[:, k]
        plane[...] = planes[k].reshape(b, h, w)
        np.subtract(plane, mean[k], out=plane)
        np.divide(plane, std[k], out=plane)
    return out


class SceneDataset(Dataset):
    """One split of a scene dataset: an index view into a shared decoded :class:`ImageStore`.

    ``ds[i] -> (FloatTensor[3, S, S] normalized, int label)``; ``ds.raw(i)`` is the stored uint8
    image (resized, not augmented); ``ds.get_batch(indices)`` transforms and stacks a batch.

    Attributes:
        files: absolute file paths of this split, in index order.
        keys: relative file names "<class>/<file>" (as in the saved split).
        labels: int64 labels.
        class_names: class order.
        transform: the albumentations pipeline applied per image.
        store: the shared store (``store.array`` is the one (N, S, S, 3) uint8 array).
    """

    def __init__(
        self,
        store: ImageStore,
        rows: np.ndarray,
        labels: np.ndarray,
        keys: Sequence[str],
        class_names: Sequence[str],
        transform: Callable | None,
        name: str = "",
    ) -> None:
        self.store = store
        self.rows = np.asarray(rows, np.int64)
        self.labels = np.asarray(labels, np.int64)
        self.keys = list(keys)
        self.files = [store.paths[r] for r in self.rows]
        self.class_names = list(class_names)
        self.transform = transform
        self.name = name
        self._seeded_worker: int | None = None
        self._plan: tuple | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return (f"SceneDataset({self.name!r}, n={len(self)}, classes={len(self.class_names)}, "
                f"size={self.store.size}, cache={self.store.mode!r})")

    @property
    def images(self) -> np.ndarray | None:
        """The whole shared uint8 array (all splits); rows of this split are ``images[ds.rows]``."""
        return self.store.array

    @property
    def image_size(self) -> int:
        return self.store.size

    def raw(self, i: int) -> np.ndarray:
        """The stored uint8 H×W×3 image of item ``i`` (resized to the working size, not augmented)."""
        return self.store[int(self.rows[i])]

    def set_seed(self, seed: int) -> None:
        """Seed the augmentation RNG (albumentations keeps its own generator)."""
        for t in (self.transform, self._batch_plan()[0]):
            if hasattr(t, "set_random_seed"):
                t.set_random_seed(int(seed) % 2**32)

    def _batch_plan(self) -> tuple[Callable | None, np.ndarray | None, np.ndarray | None]:
        """(uint8 part of the transform, mean·255, std·255) when the transform ends with
        Normalize + ToTensorV2: get_batch then normalises the whole batch at once (same result)."""
        if self._plan is None:
            plan: tuple = (None, None, None)
            ts = list(getattr(self.transform, "transforms", []))
            if (isinstance(self.transform, A.Compose) and len(ts) >= 2 and isinstance(ts[-1], ToTensorV2)
                    and isinstance(ts[-2], A.Normalize) and getattr(ts[-2], "normalization", "standard") == "standard"):
                norm = ts[-2]
                scale = float(norm.max_pixel_value)
                mean = np.asarray(norm.mean, np.float32).reshape(-1) * np.float32(scale)
                std = np.asarray(norm.std, np.float32).reshape(-1) * np.float32(scale)
                pre = A.Compose(ts[:-2], is_check_shapes=getattr(self.transform, "is_check_shapes", True))
                plan = (pre, mean, std)
            self._plan = plan
        return self._plan

    def _reseed_in_worker(self) -> None:
        # forked DataLoader workers inherit the same albumentations RNG state; give each its own
        info = torch.utils.data.get_worker_info()
        if info is not None and self._seeded_worker != info.id:
            self.set_seed(info.seed)
            self._seeded_worker = info.id

    def _apply(self, img: np.ndarray) -> torch.Tensor:
        if self.transform is None:
            return torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255.0)
        return self.transform(image=np.asarray(img))["image"]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self._reseed_in_worker()
        return self._apply(self.raw(i)), int(self.labels[i])

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform items ``indices`` of this split and stack them: (B, 3, S, S) float, (B,) int64."""
        if isinstance(indices, torch.Tensor):
            indices = indices.cpu().numpy()
        idx = np.asarray(indices, np.int64).reshape(-1)
        self._reseed_in_worker()
        labels = torch.from_numpy(self.labels[idx].copy())
        pre, mean, std = self._batch_plan()
        if pre is None or len(idx) == 0:
            return torch.stack([self._apply(self.raw(i)) for i in idx]) if len(idx) else torch.empty(0), labels
        # uint8 augmentations per image (written straight into one batch array), then one
        # normalisation + HWC->CHW + float conversion for the whole batch
        u8 = None
        for k, i in enumerate(idx):
            img = pre(image=np.asarray(self.raw(i)))["image"]
            if u8 is None:
                u8 = np.empty((len(idx), *img.shape), img.dtype)
            u8[k] = img
        return torch.from_numpy(_normalize_nchw(u8, mean, std)), labels


@dataclass
class DataBundle:
    """What ``build_datasets`` returns.

    Attributes:
        train, test: the two splits (train augments, test uses the eval transform).
        val: the validation part carved from the training part (eval transform), None without one.
        class_names: label order.
        mean, std: normalisation used by the transforms (store them in checkpoints).
        image_size: working size in pixels.
        split: the file lists (``split.save(path)`` to reproduce the run).
        skipped: relative names of undecodable files that were skipped (``skip_corrupt=True``).
        root: the folder holding the class folders.
        spec: the dataset's metadata.
    """

    train: SceneDataset
    test: SceneDataset
    class_names: list[str]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    image_size: int
    split: Split
    skipped: list[str] = field(default_factory=list)
    root: Path | None = None
    spec: DatasetSpec | None = None
    val: SceneDataset | None = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)


def build_datasets(
    name: str,
    root: str | os.PathLike | None,
    train_ratio: float,
    seed: int,
    image_size: int,
    cache: str = "memory",
    cache_dir: str | os.PathLike | None = None,
    skip_corrupt: bool = False,
    split_file: str | os.PathLike | None = None,
    *,
    num_threads: int | None = None,
    check_counts: bool = True,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH,
    augment: Mapping[str, Any] | None = None,
    val_ratio: float = 0.0,
) -> DataBundle:
    """Locate, validate, split and decode a dataset.

    Args:
        name: a key of :data:`DATASETS` ("ucmerced", "nwpu_resisc45", "aid", "ucmerced_mini"), or
            "image_folder": the user's own data at ``root`` (one sub-folder of images per class).
        root: the archive's top folder or any folder down to the class folders (None: the bundled
            sample for ucmerced_mini).
        train_ratio: fraction of every class used for training, in (0, 1). Ignored when
            ``split_file`` is given.
        seed: seed of the stratified split.
        image_size: working size; images are decoded once and resized to it.
        cache: "memory" (one uint8 array in RAM), "disk" (memory-mapped .npy under ``cache_dir``,
            reused by later runs) or "none" (decode on every access).
        cache_dir: folder of the disk cache (default ``$RSNET_CACHE_DIR`` or ``~/.cache/rsnet``).
        skip_corrupt: skip undecodable images (reported by a :class:`CorruptImageWarning` and
            ``bundle.skipped``) instead of raising one :class:`CorruptImageError` naming them all.
        split_file: a split saved by ``Split.save``; its file lists are used instead of drawing one.
        num_threads: decoding threads.
        check_counts: warn when class counts differ from the official archive.
        mean, std: normalisation (ImageNet by default).
        high_bit_depth: how 16-bit/float images become 8 bit: "percentile" (2nd-98th percentile
            stretch per image), "minmax" or "refuse"; one :class:`HighBitDepthWarning` gives the count.
        augment: the training augmentation settings (``crop_scale``, ``color_jitter``; see
            :func:`~rsnet.data.transforms.augmentation_options`).
        val_ratio: fraction of every class's training part held out for validation, in [0, 1) (0: no
            validation part). Ignored when ``split_file`` is given (its validation list is used).

    Raises:
        DatasetValidationError: a class is left without a train or a test image (fewer than 2 images,
            e.g. after skipping undecodable files), or without a validation image when the split has one.
    """
    spec = get_spec(name, root)
    if split_file is None:
        train_ratio = check_train_ratio(train_ratio)
        val_ratio = check_val_ratio(val_ratio)
    image_size = int(image_size)
    if image_size < 8:
        raise ValueError(f"dataset.image_size must be at least 8 px, got {image_size}")
    augmentation = augmentation_options(augment, image_size)
    if root is None or str(root) == "":
        root = default_root(spec.name)
        if root is None:
            raise _not_found(spec, Path("<dataset.root not set>"), "dataset.root is not set")
    scan = scan_dataset(spec, root, check_counts=check_counts)
    # split before the (long) decode so a class without a test image is refused at once; skipping
    # undecodable files can only remove images, so the split is drawn again and rechecked below
    split, rows = _split(scan, set(), train_ratio, val_ratio, seed, split_file)
    _require_train_and_test(scan, rows, split.val_ratio, 0, split_file)
    store = build_store(spec.name, scan.keys, scan.paths, image_size, cache, cache_dir,
                        skip_corrupt, num_threads, high_bit_depth)
    if store.rescaled:
        warnings.warn(f"{spec.name} under '{scan.class_root}': "
                      + describe_rescaled(store.rescaled.values(), len(store), high_bit_depth),
                      HighBitDepthWarning, stacklevel=2)
    skipped = [scan.keys[i] for i in store.corrupt]
    if skipped:
        warnings.warn(
            f"skipped {len(skipped)} undecodable image(s) of {spec.name} under '{scan.class_root}': "
            f"{skipped[:5]}{' ...' if len(skipped) > 5 else ''}",
            CorruptImageWarning,
            stacklevel=2,
        )
        log.warning("skipped %d undecodable images: %s", len(skipped), skipped[:20])
        split, rows = _split(scan, set(skipped), train_ratio, val_ratio, seed, split_file)
        _require_train_and_test(scan, rows, split.val_ratio, len(skipped), split_file)

    mean_t = tuple(float(m) for m in mean)
    std_t = tuple(float(s) for s in std)
    classes = list(spec.classes)

    def view(rows: np.ndarray, transform, part: str) -> SceneDataset:
        return SceneDataset(store, rows, scan.labels[rows], [scan.keys[r] for r in rows], classes,
                            transform, f"{spec.name}/{part}")

    train = view(rows.train, train_transform(image_size, mean_t, std_t, **augmentation), "train")
    test = view(rows.test, eval_transform(image_size, mean_t, std_t), "test")
    val = view(rows.val, eval_transform(image_size, mean_t, std_t), "val") if len(rows.val) else None
    held_out = f" / {len(val)} val" if val is not None else ""
    log.info("%s: %d train%s / %d test images, %d classes, %d px, cache=%s",
             spec.name, len(train), held_out, len(test), len(classes), image_size, cache)
    return DataBundle(train, test, classes, mean_t, std_t, image_size, split, skipped,
                      scan.class_root, spec, val)


def _split(scan: ScanResult, drop: set[str], train_ratio: float, val_ratio: float, seed: int,
           split_file: str | os.PathLike | None) -> tuple[Split, SplitRows]:
    """The split without the files in ``drop`` (drawn, or read from ``split_file``) and its row indices."""
    spec = scan.spec
    if split_file is not None:
        split = Split.load(split_file).restricted(drop)
        return split, split.indices(scan.keys, spec.classes, str(scan.class_root))
    keep = [i for i, k in enumerate(scan.keys) if k not in drop]
    split = stratified_split([scan.keys[i] for i in keep], scan.labels[keep], train_ratio, seed,
                             spec.classes, spec.name, val_ratio)
    return split, split.indices(scan.keys)


def _require_train_and_test(scan: ScanResult, rows: SplitRows, val_ratio: float, num_skipped: int,
                            split_file: str | os.PathLike | None) -> None:
    """DatasetValidationError (one line, naming the classes) if a class has no train or no test image, or
    (when ``val_ratio`` > 0) no validation image."""
    k = scan.spec.num_classes
    n_train, n_val, n_test = (np.bincount(scan.labels[r], minlength=k) for r in rows)
    bad = [c for c in range(k) if n_train[c] == 0 or n_test[c] == 0]
    if not bad:
        if val_ratio > 0:
            _require_val(scan, n_train, n_val, val_ratio, num_skipped, split_file)
        return
    left = " left" if num_skipped else ""

    def counts(c: int) -> str:
        val = f"{n_val[c]} val, " if val_ratio > 0 else ""
        return (f"'{scan.spec.classes[c]}' has {n_train[c] + n_val[c] + n_test[c]} image(s){left} "
                f"({n_train[c]} train, {val}{n_test[c]} test)")

    found = ", ".join(counts(c) for c in bad[:5])
    more = f" ... and {len(bad) - 5} more classes" if len(bad) > 5 else ""
    skipped = f" after skipping {num_skipped} undecodable file(s)" if num_skipped else ""
    fix = ("add images to those class folders" + (" or replace the undecodable files" if num_skipped else "")
           + ("; the saved split (the run's split.json) leaves a side empty: draw a new split without it"
              if split_file is not None else ""))
    raise DatasetValidationError(
        f"{scan.spec.name} under '{scan.class_root}'{skipped}: {found}{more}; every class needs at least 2 "
        f"images, one for train and one for test: {fix}"
    )


def _require_val(scan: ScanResult, n_train: np.ndarray, n_val: np.ndarray, val_ratio: float, num_skipped: int,
                 split_file: str | os.PathLike | None) -> None:
    """DatasetValidationError (one line, naming the classes) if a class has no validation image."""
    bad = [c for c in range(scan.spec.num_classes) if n_val[c] == 0]
    if not bad:
        return
    found = ", ".join(f"'{scan.spec.classes[c]}' ({n_train[c]} train image(s))" for c in bad[:5])
    more = f" ... and {len(bad) - 5} more classes" if len(bad) > 5 else ""
    skipped = f" after skipping {num_skipped} undecodable file(s)" if num_skipped else ""
    fix = ("the saved split leaves them without one: draw a new split without it" if split_file is not None
           else "lower dataset.val_ratio (0: no validation part) or add images to those class folders")
    raise DatasetValidationError(
        f"{scan.spec.name} under '{scan.class_root}'{skipped}: no validation image for {found}{more} at "
        f"dataset.val_ratio={val_ratio}; a class needs at least 2 training images to hold one out: {fix}"
    )


def build_datasets_from_config(dataset: Mapping[str, Any], seed: int, image_size: int | None = None,
                               split_file: str | os.PathLike | None = None, mean: Sequence[float] = IMAGENET_MEAN,
                               std: Sequence[float] = IMAGENET_STD,
                               augment: Mapping[str, Any] | None = None) -> DataBundle:
    """:func:`build_datasets` from a ``conf/dataset/*.yaml`` mapping (``image_size`` overrides the config's;
    ``mean``/``std``: the model's normalisation; ``augment``: the ``augment:`` settings; ``val_ratio`` defaults
    to 0, no validation part)."""
    return build_datasets(
        dataset["name"], dataset.get("root"), train_ratio=dataset["train_ratio"], seed=seed,
        image_size=int(image_size or dataset["image_size"]), cache=dataset.get("cache", "memory"),
        cache_dir=dataset.get("cache_dir"), skip_corrupt=bool(dataset.get("skip_corrupt", False)),
        split_file=split_file, high_bit_depth=dataset.get("high_bit_depth", DEFAULT_HIGH_BIT_DEPTH), mean=mean, std=std,
        augment=augment, val_ratio=dataset.get("val_ratio", 0.0))
