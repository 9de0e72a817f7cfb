"""Small fake EuroSAT archives in the real layouts: ``write_eurosat_ms`` (13-band uint16 GeoTIFFs) and
``write_eurosat_rgb`` (JPEGs). Pixel values depend on the class, so a classifier could learn them."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import rasterio
from PIL import Image
from rasterio.transform import Affine

from rsnet.data import DATASETS

MS_CLASS_DIR = Path("ds/images/remote_sensing/otherDatasets/sentinel_2/tif")


def ms_reflectance(label: int) -> np.ndarray:
    """The mean reflectance (0..10000) of each of the 13 bands for class ``label``: a per-class spectrum."""
    bands = np.arange(13)
    return 1000.0 + 400.0 * label + 300.0 * ((bands * (label + 1)) % 7)


def _classes(classes: Iterable[str] | None) -> list[str]:
    return list(classes) if classes is not None else list(DATASETS["eurosat_ms"].classes)


def write_eurosat_ms(root: str | Path, per_class: int = 3, size: int = 16,
                     classes: Iterable[str] | None = None) -> Path:
    """``root/ds/images/remote_sensing/otherDatasets/sentinel_2/tif/<class>/<class>_<n>.tif`` (n from 1): 13-band
    uint16 GeoTIFFs (EPSG:32632, 10 m pixels) in band order B01..B12, B8A; returns ``root/ds``."""
    spec = DATASETS["eurosat_ms"]
    rng = np.random.default_rng(0)
    for cls in _classes(classes):
        label = spec.classes.index(cls)
        folder = Path(root) / MS_CLASS_DIR / cls
        folder.mkdir(parents=True, exist_ok=True)
        for n in range(1, per_class + 1):
            noise = rng.normal(0, 50, (13, size, size))
            pixels = np.clip(ms_reflectance(label)[:, None, None] + noise, 0, 10000).astype(np.uint16)
            transform = Affine(10, 0, 500_000 + 1000 * n, 0, -10, 5_500_000 - 1000 * label)  # UTM 32N, 10 m
            with rasterio.open(folder / f"{cls}_{n}.tif", "w", driver="GTiff", width=size, height=size, count=13,
                               dtype="uint16", crs="EPSG:32632", transform=transform) as dst:
                dst.write(pixels)
    return Path(root) / "ds"


def write_eurosat_rgb(root: str | Path, per_class: int = 3, size: int = 16,
                      classes: Iterable[str] | None = None) -> Path:
    """``root/2750/<class>/<class>_<n>.jpg`` (n from 1), one solid colour per class; returns ``root/2750``."""
    spec = DATASETS["eurosat_rgb"]
    for cls in _classes(classes):
        label = spec.classes.index(cls)
        folder = Path(root) / "2750" / cls
        folder.mkdir(parents=True, exist_ok=True)
        colour = np.array([20 + 20 * label, 128, 235 - 20 * label], np.uint8)
        for n in range(1, per_class + 1):
            Image.fromarray(np.tile(colour, (size, size, 1))).save(folder / f"{cls}_{n}.jpg", quality=95)
    return Path(root) / "2750"
