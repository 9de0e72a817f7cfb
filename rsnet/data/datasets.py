"""Scene-classification datasets: locate the class folders, validate them, split, decode once. ``build_datasets`` is the
trainer's one entry point (docs/data.md, Python API)."""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .cache import build_store
from .decode import DEFAULT_HIGH_BIT_DEPTH, describe_rescaled
from .discovery import ScanResult, dataset_not_found, default_root, scan_dataset
from .download import download_dataset
from .errors import CorruptImageWarning, DatasetValidationError, HighBitDepthWarning
from .raster import Bands, band_statistics, max_pixel_value, open_raster, resolve_bands, training_footprint
from .scene_dataset import SceneDataset
from .specs import DatasetSpec, get_spec
from .splits import Split, SplitRows, check_train_ratio, check_val_ratio, stratified_split
from .store import ImageStore
from .device_augment import DeviceAugment
from .transforms import IMAGENET_MEAN, IMAGENET_STD, augmentation_options, eval_transform, train_transform

__all__ = ["DataBundle", "build_datasets", "build_datasets_from_config"]

log = logging.getLogger(__name__)


@dataclass
class DataBundle:
    """What ``build_datasets`` returns: the splits as views into one decoded store, the normalisation, the split's file
    lists, the train and eval augmentations of whole stored batches on a worker's device, and the ``bands`` of a
    multispectral dataset (None: RGB pictures)."""

    train: SceneDataset
    test: SceneDataset
    class_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    image_size: int
    split: Split
    skipped: list[str] = field(default_factory=list)
    root: Path | None = None
    spec: DatasetSpec | None = None
    val: SceneDataset | None = None
    train_augment: DeviceAugment | None = None
    eval_augment: DeviceAugment | None = None
    bands: Bands | None = None
    footprint: dict[str, float | None] = field(default_factory=dict)  # a training image's size: pixels, metres

    @property
    def channels(self) -> int:
        """Bands of a model input: 3 for RGB pictures."""
        return 3 if self.bands is None else self.bands.channels


def build_datasets(name: str, root: str | os.PathLike | None, train_ratio: float, seed: int, image_size: int,
                   cache: str = "memory", cache_dir: str | os.PathLike | None = None, skip_corrupt: bool = False,
                   split_file: str | os.PathLike | None = None, *, check_counts: bool = True,
                   mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                   high_bit_depth: str = DEFAULT_HIGH_BIT_DEPTH, augment: Mapping[str, Any] | None = None,
                   val_ratio: float = 0.0, bands: Any = None, max_pixels: int | None = None) -> DataBundle:
    """Locate, validate, split and decode the dataset ``name`` (a key of ``DATASETS`` or "image_folder") below ``root``
    (None: the bundled sample), docs/data.md; raises DatasetValidationError for a class without images in a part.
    ``bands`` (``dataset.bands``) reads N-band rasters, normalised with the training split's per-band statistics
    instead of ``mean``/``std``, none of more than ``max_pixels`` pixels (``dataset.max_pixels``; None: the default)."""
    spec = get_spec(name, root)
    if split_file is None:
        train_ratio, val_ratio = check_train_ratio(train_ratio), check_val_ratio(val_ratio)
    image_size = int(image_size)
    if image_size < 8:
        raise ValueError(f"dataset.image_size must be at least 8 px, got {image_size}")
    augmentation = augmentation_options(augment)
    scan = scan_dataset(spec, _root(spec, root), check_counts=check_counts)
    # split before the (long) decode so a class without a test image is refused at once
    split, rows = _checked_split(scan, [], train_ratio, val_ratio, seed, split_file)
    given = isinstance(bands, Bands)  # a trained model's bands: read them, normalised with its mean/std
    raster_bands = (bands.with_max_pixels(max_pixels, "dataset.max_pixels") if given else
                    resolve_bands(bands, scan.paths[0], spec.band_names, spec.rgb_bands, spec.name, max_pixels))
    if raster_bands is None:
        _require_pictures(spec, scan.paths[0])
    store = build_store(spec.name, scan.names, scan.paths, image_size, cache, cache_dir, skip_corrupt,
                        raster_bands or high_bit_depth)
    skipped = _report_decoding(scan, store)
    if skipped:  # skipping undecodable files can only remove images: draw the split again and recheck it
        split, rows = _checked_split(scan, skipped, train_ratio, val_ratio, seed, split_file)
    mean_t, std_t = tuple(float(m) for m in mean), tuple(float(s) for s in std)
    if raster_bands is not None and not given:
        mean_t, std_t = _band_normalisation(spec.name, raster_bands, store, rows.train)
    pixel_scale = max_pixel_value(raster_bands)
    train, test, val = _views(scan, store, rows, image_size, mean_t, std_t, augmentation, pixel_scale)
    held_out = f" / {len(val)} val" if val is not None else ""
    paths = scan.paths  # built anew at each access: once here, not once a row
    log.info("%s: %d train%s / %d test images, %d classes, %d px, cache=%s",
             spec.name, len(train), held_out, len(test), spec.num_classes, image_size, cache)
    return DataBundle(train, test, list(spec.classes), mean_t, std_t, image_size, split, skipped,
                      scan.class_root, spec, val,
                      DeviceAugment.for_training(image_size, mean_t, std_t, **augmentation,
                                                 max_pixel_value=pixel_scale),
                      DeviceAugment(image_size, mean_t, std_t, max_pixel_value=pixel_scale), raster_bands,
                      training_footprint([paths[r] for r in rows.train], spec.ground_resolution_m))


def _band_normalisation(name: str, bands: Bands, store: ImageStore, train_rows: np.ndarray
                        ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-band mean and std of the training split's stored images (logged): a multispectral model's normalisation."""
    mean, std = band_statistics(store, train_rows, nodata=bands.nodata, names=bands.names)
    log.info("%s: bands %s (%s), per-band mean %s, std %s from the training split", name, list(bands.names),
             bands.dtype, [round(m, 2) for m in mean], [round(s, 2) for s in std])
    return mean, std


def _require_pictures(spec: DatasetSpec, first_file: str) -> None:
    """ValueError naming ``first_file`` when it has more bands than a picture (gray, RGB or RGBA) and
    ``dataset.bands`` is not set: its bands would be undecodable, or dropped."""
    if Path(first_file).suffix.lower() not in (".tif", ".tiff"):
        return
    try:
        with open_raster(first_file) as src:
            count = src.count
    except Exception:  # noqa: BLE001 - an unreadable file is reported by decoding
        return
    if count > 4:
        raise ValueError(f"'{first_file}' has {count} bands, and {spec.name} is read as RGB pictures "
                         "(dataset.bands=null): set dataset.bands=all, or the bands to read (e.g. "
                         "'dataset.bands=[4,3,2,8]'), to train on them")


def _root(spec: DatasetSpec, root: str | os.PathLike | None) -> str | os.PathLike:
    """``root``, or the dataset's default root (the bundled sample) when it is not set."""
    if root is not None and str(root) != "":
        return root
    sample = default_root(spec.name)
    if sample is None:
        raise dataset_not_found(spec, Path("<dataset.root not set>"), "dataset.root is not set")
    return sample


def _report_decoding(scan: ScanResult, store: ImageStore) -> list[str]:
    """Warn once about rescaled and once about skipped (undecodable) files; return the skipped relative names."""
    spec = scan.spec
    if store.rescaled:
        warnings.warn(f"{spec.name} under '{scan.class_root}': "
                      + describe_rescaled(store.rescaled.values(), len(store), str(store.decoding)),
                      HighBitDepthWarning, stacklevel=3)
    skipped = [scan.names[i] for i in store.corrupt]
    if skipped:
        warnings.warn(
            f"skipped {len(skipped)} undecodable image(s) of {spec.name} under '{scan.class_root}': "
            f"{skipped[:5]}{' ...' if len(skipped) > 5 else ''}",
            CorruptImageWarning,
            stacklevel=3,
        )
        log.warning("skipped %d undecodable images: %s", len(skipped), skipped[:20])
    return skipped


def _views(scan: ScanResult, store: ImageStore, rows: SplitRows, image_size: int, mean: tuple[float, ...],
           std: tuple[float, ...], augmentation: Mapping[str, Any], pixel_scale: float
           ) -> tuple[SceneDataset, SceneDataset, SceneDataset | None]:
    """The train (augmenting), test and validation (eval transform; None without a validation part) datasets,
    all views into ``store``."""
    spec = scan.spec

    def view(part: str, part_rows: np.ndarray, transform: Any) -> SceneDataset:
        return SceneDataset(store, part_rows, scan.labels[part_rows], [scan.names[r] for r in part_rows],
                            spec.classes, transform, f"{spec.name}/{part}")

    train = view("train", rows.train, train_transform(image_size, mean, std, **augmentation,
                                                      max_pixel_value=pixel_scale))
    test = view("test", rows.test, eval_transform(image_size, mean, std, pixel_scale))
    val = view("val", rows.val, eval_transform(image_size, mean, std, pixel_scale)) if len(rows.val) else None
    return train, test, val


def _checked_split(scan: ScanResult, skipped: list[str], train_ratio: float, val_ratio: float, seed: int,
                   split_file: str | os.PathLike | None) -> tuple[Split, SplitRows]:
    """The split without the ``skipped`` files (drawn, or read from ``split_file``) and its row indices, checked
    to leave every class a train and a test image (and a validation image when the split has a validation part)."""
    spec, drop = scan.spec, set(skipped)
    if split_file is not None:
        split = Split.load(split_file).restricted(drop)
        rows = split.indices(scan.names, spec.classes, str(scan.class_root))
    else:
        keep = [i for i, k in enumerate(scan.names) if k not in drop]
        split = stratified_split([scan.names[i] for i in keep], scan.labels[keep], train_ratio, seed,
                                 spec.classes, spec.name, val_ratio)
        rows = split.indices(scan.names)
    _require_train_and_test(scan, rows, split.val_ratio, len(skipped), split_file)
    return split, rows


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
    """:func:`build_datasets` from a composed ``dataset:`` config (``download``: fetch the archive into ``root``
    first); ``image_size`` overrides the config's."""
    if dataset.get("download"):
        if not dataset["root"]:
            raise ValueError("dataset.download=true needs dataset.root=<folder> to unpack the archive into")
        download_dataset(dataset["name"], dataset["root"])
    return build_datasets(
        dataset["name"], dataset["root"], train_ratio=dataset["train_ratio"], seed=seed,
        image_size=int(image_size or dataset["image_size"]), cache=dataset["cache"], cache_dir=dataset["cache_dir"],
        skip_corrupt=bool(dataset["skip_corrupt"]), split_file=split_file, high_bit_depth=dataset["high_bit_depth"],
        mean=mean, std=std, augment=augment, val_ratio=dataset["val_ratio"], bands=dataset.get("bands"),
        max_pixels=dataset.get("max_pixels"))
