"""Datasets, protocol splits, decode-once caches, the training augmentation (host and device), the evaluation transform
and the batch prefetcher. Entry point: :func:`build_datasets`."""

from __future__ import annotations

import importlib
from typing import Any

# name -> the submodule that defines it. Imported on first use (PEP 562), so that ``from rsnet.data.errors import
# CorruptImageError`` (every command's error handling) does not import torch, OpenCV and albumentations.
_EXPORTS = {
    **dict.fromkeys(["CACHE_MODES", "build_store", "default_cache_dir"], "cache"),
    **dict.fromkeys(["DataBundle", "build_datasets", "build_datasets_from_config"], "datasets"),
    **dict.fromkeys(["HIGH_BIT_DEPTH_MODES", "DecodeReport", "decode_image"], "decode"),
    **dict.fromkeys(["ScanResult", "default_root", "find_class_root", "scan_dataset"], "discovery"),
    **dict.fromkeys(["CorruptImageError", "CorruptImageWarning", "DatasetCountWarning", "DatasetNotFoundError",
                     "DatasetValidationError", "HighBitDepthWarning", "SplitMismatchError"], "errors"),
    **dict.fromkeys(["DeviceAugment", "augments_on_device", "check_on_device"], "device_augment"),
    **dict.fromkeys(["BatchPrefetcher", "PreparedBatch"], "loader"),
    **dict.fromkeys(["to_float_chw"], "normalize"),
    **dict.fromkeys(["Bands", "resolve_bands"], "raster"),
    **dict.fromkeys(["download_dataset"], "download"),
    **dict.fromkeys(["SceneDataset"], "scene_dataset"),
    **dict.fromkeys(["DATASETS", "DatasetSpec", "get_spec"], "specs"),
    **dict.fromkeys(["Split", "SplitRows", "check_train_ratio", "check_val_ratio", "stratified_split"], "splits"),
    **dict.fromkeys(["ImageStore"], "store"),
    **dict.fromkeys(["AugmentSettings"], "augment_params"),
    **dict.fromkeys(["IMAGENET_MEAN", "IMAGENET_STD", "HostAugment", "eval_transform", "train_transform"],
                    "transforms"),
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "CACHE_MODES", "HIGH_BIT_DEPTH_MODES", "AugmentSettings", "Bands", "BatchPrefetcher", "DATASETS", "IMAGENET_MEAN",
    "IMAGENET_STD", "CorruptImageError", "CorruptImageWarning", "DataBundle", "DatasetCountWarning",
    "DatasetNotFoundError", "DatasetSpec", "DatasetValidationError", "DecodeReport", "DeviceAugment",
    "HighBitDepthWarning", "HostAugment", "ImageStore", "PreparedBatch", "ScanResult", "SceneDataset", "Split",
    "SplitMismatchError", "SplitRows", "augments_on_device", "build_datasets", "build_datasets_from_config",
    "build_store", "check_on_device", "check_train_ratio", "check_val_ratio", "decode_image", "default_cache_dir",
    "default_root", "download_dataset", "eval_transform", "find_class_root", "get_spec", "resolve_bands",
    "scan_dataset", "stratified_split", "to_float_chw", "train_transform"
]
