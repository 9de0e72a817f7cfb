"""Datasets (UC Merced, NWPU-RESISC45, AID, bundled UCM mini, your own image folder), protocol splits,
decode-once caches, albumentations transforms, batched augmentation on the worker's device and the batch
prefetcher. Entry point: :func:`build_datasets`."""

from .cache import CACHE_MODES, build_store, default_cache_dir
from .datasets import DataBundle, build_datasets, build_datasets_from_config
from .decode import HIGH_BIT_DEPTH_MODES, DecodeReport, decode_image
from .discovery import ScanResult, default_root, find_class_root, scan_dataset
from .errors import (
    CorruptImageError,
    CorruptImageWarning,
    DatasetCountWarning,
    DatasetNotFoundError,
    DatasetValidationError,
    HighBitDepthWarning,
    SplitMismatchError,
)
from .device_augment import DeviceAugment, augments_on_device, check_on_device
from .loader import BatchPrefetcher, PreparedBatch, device_batches
from .normalize import to_float_chw
from .scene_dataset import SceneDataset
from .specs import DATASETS, DatasetSpec, get_spec
from .splits import Split, SplitRows, check_train_ratio, check_val_ratio, stratified_split
from .store import ImageStore
from .transforms import IMAGENET_MEAN, IMAGENET_STD, eval_transform, train_transform

__all__ = [
    "CACHE_MODES", "HIGH_BIT_DEPTH_MODES", "BatchPrefetcher", "DATASETS", "IMAGENET_MEAN", "IMAGENET_STD",
    "CorruptImageError", "CorruptImageWarning", "DataBundle", "DatasetCountWarning", "DatasetNotFoundError",
    "DatasetSpec", "DatasetValidationError", "DecodeReport", "DeviceAugment", "HighBitDepthWarning", "ImageStore",
    "PreparedBatch", "ScanResult", "SceneDataset", "Split", "SplitMismatchError", "SplitRows", "augments_on_device",
    "build_datasets", "build_datasets_from_config", "build_store", "check_on_device", "check_train_ratio",
    "check_val_ratio", "decode_image", "default_cache_dir", "default_root", "device_batches", "eval_transform",
    "find_class_root", "get_spec", "scan_dataset", "stratified_split", "to_float_chw", "train_transform"
]
