"""Dataset discovery and validation on fake archives in the real layouts, and on the real samples."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import dataset_config, label_value, truncate_file

from rsnet.data import (
    DATASETS,
    CorruptImageError,
    CorruptImageWarning,
    DatasetCountWarning,
    DatasetNotFoundError,
    DatasetValidationError,
    build_datasets,
    find_class_root,
    scan_dataset,
)

REAL = ["ucmerced", "nwpu_resisc45", "aid"]


def _depths(name: str, top: Path) -> list[Path]:
    spec = DATASETS[name]
    class_root = top / spec.images_subdir if spec.images_subdir else top
    roots = [top.parent, top, class_root]
    return list(dict.fromkeys(roots))


def test_specs_match_official_archives():
    assert DATASETS["ucmerced"].num_classes == 21 and DATASETS["ucmerced"].num_images == 2100
    assert DATASETS["nwpu_resisc45"].num_classes == 45 and DATASETS["nwpu_resisc45"].num_images == 31500
    assert DATASETS["aid"].num_classes == 30 and DATASETS["aid"].num_images == 10000
    assert DATASETS["ucmerced_mini"].num_images == 420
    aid = DATASETS["aid"].counts
    assert min(aid.values()) == 220 and max(aid.values()) == 420
    assert "baseball_diamond" in DATASETS["nwpu_resisc45"].classes
    for spec in DATASETS.values():
        assert list(spec.classes) == sorted(spec.classes)  # label order = sorted folder names


@pytest.mark.parametrize("name", REAL)
def test_discovery_from_every_root_depth(fake_archive, name):
    top = fake_archive(name, per_class=2)
    spec = DATASETS[name]
    expected = top / spec.images_subdir if spec.images_subdir else top
    for root in _depths(name, top):
        assert find_class_root(name, root) == expected, root
        with pytest.warns(DatasetCountWarning):
            scan = scan_dataset(name, root)
        assert scan.class_root == expected
        assert len(scan.names) == 2 * spec.num_classes
        assert scan.counts() == {c: 2 for c in spec.classes}
        # class order = spec order; labels grouped by class
        assert np.array_equal(scan.labels, np.repeat(np.arange(spec.num_classes), 2))
        assert scan.names[0].startswith(spec.classes[0] + "/")


def test_file_naming_matches_layout(fake_archive):
    top = fake_archive("aid", per_class=1)
    assert (top / "Airport" / "airport_1.jpg").is_file()
    top = fake_archive("nwpu_resisc45", per_class=1)
    assert (top / "baseball_diamond" / "baseball_diamond_001.jpg").is_file()
    top = fake_archive("ucmerced", per_class=1)
    assert (top / "Images" / "agricultural" / "agricultural00.tif").is_file()


@pytest.mark.parametrize("name", REAL)
def test_build_reads_every_layout_with_correct_labels(fake_archive, name):
    top = fake_archive(name, per_class=4, size=20)
    bundle = build_datasets(name, top, 0.5, 0, 16, check_counts=False)
    assert bundle.class_names == list(DATASETS[name].classes)
    assert len(bundle.train) + len(bundle.test) == 4 * len(bundle.class_names)
    for ds in (bundle.train, bundle.test):
        for i in range(0, len(ds), 7):
            img = ds.raw(i)
            assert img.shape == (16, 16, 3) and img.dtype == np.uint8
            assert abs(int(img[..., 0].mean()) - label_value(int(ds.labels[i]))) <= 3
            assert Path(ds.paths[i]).is_file()
            assert Path(ds.paths[i]).parent.name == bundle.class_names[ds.labels[i]]


def test_missing_unexpected_and_empty_classes_are_errors(fake_archive):
    top = fake_archive("ucmerced", per_class=1, missing=["beach"])
    with pytest.raises(DatasetValidationError, match=r"missing class folders.*beach"):
        scan_dataset("ucmerced", top)
    top = fake_archive("ucmerced", per_class=1, extra=["volcano"])
    with pytest.raises(DatasetValidationError, match=r"unexpected.*volcano"):
        scan_dataset("ucmerced", top)
    top = fake_archive("nwpu_resisc45", per_class=1, empty=["sea_ice"])
    with pytest.raises(DatasetValidationError, match=r"without images.*sea_ice"):
        scan_dataset("nwpu_resisc45", top)


def test_hidden_folders_and_non_image_files_are_ignored(fake_archive):
    top = fake_archive("ucmerced", per_class=1)
    (top / "Images" / ".ipynb_checkpoints").mkdir()
    (top / "Images" / "beach" / "Thumbs.db").write_bytes(b"x")
    scan = scan_dataset("ucmerced", top, check_counts=False)
    assert len(scan.names) == 21


def test_count_mismatch_is_a_warning_naming_the_class(fake_archive):
    counts = {c: 20 for c in DATASETS["ucmerced_mini"].classes}
    counts["golfcourse"] = 19
    top = fake_archive("ucmerced_mini", per_class=counts, size=8)
    with pytest.warns(DatasetCountWarning, match=r"1 of 21 classes.*golfcourse: 19 \(expected 20\)"):
        scan_dataset("ucmerced_mini", top)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DatasetCountWarning)
        scan_dataset("ucmerced_mini", top, check_counts=False)


def test_mini_sample_has_exact_counts_and_no_warning(mini_root):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DatasetCountWarning)
        bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 64)
    assert len(bundle.class_names) == 21
    assert len(bundle.train) + len(bundle.test) == 420
    assert np.bincount(bundle.train.labels).tolist() == [10] * 21
    assert bundle.train.raw(0).shape == (64, 64, 3)
    # the default root of ucmerced_mini is the bundled sample
    assert build_datasets("ucmerced_mini", None, 0.5, 0, 32).root == mini_root / "Images"


def test_real_ucm_tif_sample(tif_sample_root, tmp_path):
    # the sample holds one .tif a class; a second name (a symlink to it) gives every class a test image
    root = tmp_path / "UCMerced_LandUse"
    for tif in sorted(tif_sample_root.glob("Images/*/*.tif")):
        folder = root / "Images" / tif.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / tif.name).symlink_to(tif)
        (folder / f"{tif.parent.name}99.tif").symlink_to(tif)
    with pytest.warns(DatasetCountWarning):
        bundle = build_datasets("ucmerced", root, 0.5, 0, 256)
    assert len(bundle.class_names) == 21
    assert len(bundle.train) == 21 and len(bundle.test) == 21
    img = bundle.train.raw(0)
    assert img.shape == (256, 256, 3) and img.dtype == np.uint8 and img.std() > 5
    assert bundle.train.paths[0].endswith(".tif")
    from PIL import Image

    with Image.open(bundle.train.paths[0]) as im:  # stored pixels are the file's, unchanged at 256 px
        assert np.array_equal(img, np.asarray(im.convert("RGB")))
    x, y = bundle.train.get_batch([0, 5])
    assert x.shape == (2, 3, 256, 256) and y.tolist() == [0, 5]


def test_odd_sized_images_are_resized(fake_archive):
    top = fake_archive("ucmerced", per_class=2, size=24, odd_sizes={"beach/beach01.tif": 25})
    bundle = build_datasets("ucmerced", top, 0.5, 0, 24, check_counts=False)
    assert bundle.train.images.shape[1:] == (24, 24, 3)


@pytest.mark.parametrize("kind", ["missing", "empty", "unrelated", "file"])
def test_wrong_root_says_where_and_what(tmp_path, kind):
    root = tmp_path / "data"
    if kind == "empty":
        root.mkdir()
    elif kind == "unrelated":
        (root / "photos" / "holiday").mkdir(parents=True)
    elif kind == "file":
        root.write_text("x")
    with pytest.raises(DatasetNotFoundError) as err:
        build_datasets("nwpu_resisc45", root, 0.2, 0, 32)
    msg = str(err.value)
    assert str(root) in msg
    assert "NWPU-RESISC45/<class>/<class>_NNN.jpg" in msg
    assert "download" in msg and "gcheng-nwpu.github.io" in msg


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="valid names"):
        build_datasets("cifar10", "/nowhere", 0.5, 0, 32)


@pytest.mark.parametrize("name", ["ucmerced", "aid"])
def test_corrupt_file_is_named_or_skipped(fake_archive, name):
    top = fake_archive(name, per_class=3)
    spec = DATASETS[name]
    class_root = top / spec.images_subdir if spec.images_subdir else top
    bad = sorted((class_root / spec.classes[2]).iterdir())[1]
    truncate_file(bad)
    with pytest.raises(CorruptImageError) as err:
        build_datasets(name, top, 0.5, 0, 16, check_counts=False)
    assert bad.name in str(err.value) and err.value.path == str(bad)

    with pytest.warns(CorruptImageWarning, match="skipped 1 undecodable"):
        bundle = build_datasets(name, top, 0.5, 0, 16, check_counts=False, skip_corrupt=True)
    key = f"{spec.classes[2]}/{bad.name}"
    assert bundle.skipped == [key]
    assert len(bundle.train) + len(bundle.test) == 3 * spec.num_classes - 1
    assert key not in bundle.split.train + bundle.split.test
    assert str(bad) not in bundle.train.paths + bundle.test.paths


def test_prefers_the_archive_folder_when_two_datasets_share_class_names(fake_archive, tmp_path):
    mini = fake_archive("ucmerced_mini", per_class=1)
    full = fake_archive("ucmerced", per_class=1)
    both = tmp_path / "datasets"
    both.mkdir()
    (both / "a").symlink_to(mini.parent)
    (both / "b").symlink_to(full.parent)
    assert find_class_root("ucmerced", both) == both / "b" / "UCMerced_LandUse" / "Images"
    assert find_class_root("ucmerced_mini", both) == both / "a" / "ucmerced-mini" / "Images"


def test_build_from_a_dataset_config_honours_its_settings_and_the_size_override() -> None:
    from rsnet.data import build_datasets_from_config

    config = dataset_config("ucmerced_mini", train_ratio=0.25, image_size=64, cache="memory")
    bundle = build_datasets_from_config(config, seed=3, image_size=32)
    assert bundle.image_size == 32 and bundle.train.raw(0).shape == (32, 32, 3)
    assert len(bundle.class_names) == 21 and len(bundle.train) == 21 * 5
