"""Shared fixtures and doubles: fake archives in the real dataset layouts, the bundled/real sample data, an in-memory store.

``fake_archive(name, ...)`` writes a tiny archive of ``name`` ("ucmerced", "nwpu_resisc45", "aid",
"ucmerced_mini") under a temp folder, with the real class names and file naming, and returns the
archive's top folder (e.g. ``.../UCMerced_LandUse``). Every image is a solid colour that encodes its
label (red channel = ``label_value(label)``), so tests can check labels from pixels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pytest
from PIL import Image

from rsnet.data import DATASETS

REPO = Path(__file__).resolve().parents[1]
MINI_ROOT = REPO / "data" / "ucmerced-mini"
TIF_SAMPLE_ROOT = Path(__file__).resolve().parent / "fixtures" / "ucmerced-tif-sample"


CONF = Path(__file__).resolve().parents[1] / "conf"


def compose_command(config_name: str, *overrides: str):
    """A command's settings as its Hydra app receives them for these command-line ``overrides``
    (conf/<config_name>.yaml); pass them to the command's ``main(cfg)``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides))


def label_value(label: int) -> int:
    """Red-channel value of a fake image of class ``label`` (distinct for up to 45 classes)."""
    return 10 + 5 * label


def fake_file_name(name: str, cls: str, i: int) -> str:
    """File name of image ``i`` of class ``cls`` in the layout of dataset ``name``."""
    if name == "ucmerced":
        return f"{cls}{i:02d}.tif"
    if name == "ucmerced_mini":
        return f"{cls}{i:02d}.jpg"
    if name == "nwpu_resisc45":
        return f"{cls}_{i + 1:03d}.jpg"
    if name == "aid":
        return f"{cls.lower()}_{i + 1}.jpg"
    raise ValueError(name)


def write_image(path: Path, value: int, size: int = 16) -> None:
    arr = np.zeros((size, size, 3), np.uint8)
    arr[..., 0] = value
    arr[..., 1] = 128
    arr[..., 2] = 255 - value
    img = Image.fromarray(arr)
    if path.suffix == ".jpg":
        img.save(path, quality=95)
    else:
        img.save(path)


def truncate_file(path: Path, keep: float = 0.5) -> None:
    """Cut a file to a fraction of its bytes (a typical broken download)."""
    data = path.read_bytes()
    path.write_bytes(data[: max(1, int(len(data) * keep))])


def make_fake_archive(
    base: Path,
    name: str,
    per_class: int | dict[str, int] = 3,
    size: int = 16,
    classes: Iterable[str] | None = None,
    missing: Iterable[str] = (),
    extra: Iterable[str] = (),
    empty: Iterable[str] = (),
    odd_sizes: dict[str, int] | None = None,
) -> Path:
    """Write a fake archive of dataset ``name`` under ``base``; returns its top folder.

    Args:
        per_class: images per class (int, or class -> count).
        size: side of the images.
        classes: class list to write (default: the dataset's); ``missing`` are left out.
        extra: additional (unexpected) class folders, with images.
        empty: class folders created without images.
        odd_sizes: relative file -> side, for images of another size (e.g. UCM's 257 px files).
    """
    spec = DATASETS[name]
    top = Path(base) / spec.base_dir
    class_root = top / spec.images_subdir if spec.images_subdir else top
    class_root.mkdir(parents=True, exist_ok=True)
    missing = set(missing)
    empty = set(empty)
    odd_sizes = odd_sizes or {}
    wanted = [c for c in (classes or spec.classes) if c not in missing]
    for cls in [*wanted, *extra]:
        d = class_root / cls
        d.mkdir(exist_ok=True)
        if cls in empty:
            continue
        label = spec.classes.index(cls) if cls in spec.classes else 0
        n = per_class[cls] if isinstance(per_class, dict) else per_class
        for i in range(n):
            fname = fake_file_name(name, cls, i)
            write_image(d / fname, label_value(label), odd_sizes.get(f"{cls}/{fname}", size))
    return top


class DictStore:
    """An in-memory stand-in for the c10d store's atomic counter (``add``), for scheduler tests without processes."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]


@pytest.fixture
def fake_archive(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``fake_archive("aid", per_class=2, missing=["Beach"])`` -> archive top folder.

    Each call writes into its own sub-folder of the test's ``tmp_path``.
    """
    counter = iter(range(10_000))

    def make(name: str, **kwargs) -> Path:
        return make_fake_archive(tmp_path / f"archive{next(counter)}", name, **kwargs)

    return make


@pytest.fixture
def mini_root() -> Path:
    """The bundled real sample data/ucmerced-mini (21 classes × 20 jpg, 128 px)."""
    if not MINI_ROOT.is_dir():
        pytest.skip("data/ucmerced-mini is not present")
    return MINI_ROOT


@pytest.fixture
def tif_sample_root() -> Path:
    """tests/fixtures/ucmerced-tif-sample: one original UCM .tif per class (256 px)."""
    if not TIF_SAMPLE_ROOT.is_dir():
        pytest.skip("tests/fixtures/ucmerced-tif-sample is not present")
    return TIF_SAMPLE_ROOT
