"""Protocol splits: stratification, determinism, save/load round trip, errors; the validation part."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from helpers import dataset_config, label_value

from rsnet.data import (
    DATASETS,
    DatasetValidationError,
    Split,
    SplitMismatchError,
    SplitRows,
    build_datasets,
    build_datasets_from_config,
    check_val_ratio,
    scan_dataset,
    stratified_split,
)


@pytest.fixture
def aid_scan(fake_archive):
    # uneven class sizes like the real AID (scaled down): 4..13 images a class
    counts = {c: 4 + i % 10 for i, c in enumerate(DATASETS["aid"].classes)}
    top = fake_archive("aid", per_class=counts, size=8)
    return top, counts, scan_dataset("aid", top, check_counts=False)


@pytest.mark.parametrize("ratio", [0.2, 0.5, 0.8])
def test_every_class_in_train_and_test_at_the_ratio(aid_scan, ratio):
    _, counts, scan = aid_scan
    split = stratified_split(scan.names, scan.labels, ratio, seed=3, class_names=scan.spec.classes)
    assert set(split.train).isdisjoint(split.test)
    assert sorted(split.train + split.test) == sorted(scan.names)
    for c, n in counts.items():
        n_train = sum(f.startswith(c + "/") for f in split.train)
        n_test = sum(f.startswith(c + "/") for f in split.test)
        assert n_train + n_test == n
        assert n_train >= 1 and n_test >= 1
        assert abs(n_train - ratio * n) <= 0.5 + 1e-9 or n_train in (1, n - 1)


def test_same_seed_same_split_different_seed_different(aid_scan):
    _, _, scan = aid_scan
    classes = scan.spec.classes
    a = stratified_split(scan.names, scan.labels, 0.5, 0, classes)
    b = stratified_split(scan.names, scan.labels, 0.5, 0, classes)
    c = stratified_split(scan.names, scan.labels, 0.5, 1, classes)
    assert a.train == b.train and a.test == b.test
    assert set(a.train) != set(c.train)
    # independent of the order the files were listed in
    perm = np.random.default_rng(0).permutation(len(scan.names))
    d = stratified_split([scan.names[i] for i in perm], scan.labels[perm], 0.5, 0, classes)
    assert sorted(d.train) == sorted(a.train)


def test_save_load_round_trip_reproduces_the_run(aid_scan, tmp_path):
    top, _, _ = aid_scan
    first = build_datasets("aid", top, 0.2, 7, 8, check_counts=False)
    path = first.split.save(tmp_path / "run" / "split.json")
    data = json.loads(path.read_text())
    assert data["seed"] == 7 and data["train_ratio"] == 0.2 and data["dataset"] == "aid"
    assert Split.load(path) == first.split
    # a different seed/ratio in the call is overridden by the split file
    again = build_datasets("aid", top, 0.5, 99, 8, check_counts=False, split_file=path)
    assert again.train.paths == first.train.paths and again.test.paths == first.test.paths
    assert np.array_equal(again.train.labels, first.train.labels)


def test_split_with_missing_files_is_a_clear_error(aid_scan, tmp_path):
    top, _, scan = aid_scan
    split = stratified_split(scan.names, scan.labels, 0.5, 0, scan.spec.classes, "aid")
    split.train.append("Airport/airport_999.jpg")
    path = split.save(tmp_path / "split.json")
    with pytest.raises(SplitMismatchError, match=r"1 file\(s\) not found.*airport_999"):
        build_datasets("aid", top, 0.5, 0, 8, check_counts=False, split_file=path)
    with pytest.raises(FileNotFoundError, match="nope.json' does not exist: the run directory's split.json is missing"):
        build_datasets("aid", top, 0.5, 0, 8, check_counts=False, split_file=tmp_path / "nope.json")


@pytest.mark.parametrize("ratio", [0, 1, 1.5, -0.1, "half"])
def test_out_of_range_train_ratio_names_the_setting(mini_root, ratio):
    with pytest.raises(ValueError, match=r"dataset\.train_ratio"):
        build_datasets("ucmerced_mini", mini_root, ratio, 0, 32)


def _per_class(files: list[str], cls: str) -> int:
    return sum(f.startswith(cls + "/") for f in files)


@pytest.mark.parametrize("val_ratio", [0.1, 0.25, 0.5, 0.9])
def test_val_is_carved_from_train_per_class_and_test_is_unchanged(aid_scan, val_ratio):
    _, counts, scan = aid_scan
    classes = scan.spec.classes
    plain = stratified_split(scan.names, scan.labels, 0.5, 3, classes)
    split = stratified_split(scan.names, scan.labels, 0.5, 3, classes, val_ratio=val_ratio)
    assert split.test == plain.test
    assert sorted(split.train + split.val) == sorted(plain.train)
    assert set(split.val).isdisjoint(split.train) and set(split.val).isdisjoint(split.test)
    assert split.val_ratio == val_ratio and split.train_ratio == plain.train_ratio
    for c in counts:
        n_train = _per_class(plain.train, c)  # the train part before validation is carved (>= 2 here)
        n_val = _per_class(split.val, c)
        assert 1 <= n_val <= n_train - 1
        assert abs(n_val - val_ratio * n_train) <= 0.5 + 1e-9 or n_val in (1, n_train - 1)
        assert _per_class(split.train, c) == n_train - n_val


def test_train_and_test_of_a_seed_are_those_drawn_before_val_existed():
    # pinned values: holding out a validation part leaves the train/test draw of a seed unchanged
    keys = [f"a/{i}.jpg" for i in range(6)] + [f"b/{i}.jpg" for i in range(5)]
    labels = [0] * 6 + [1] * 5
    for val_ratio in (0.0, 0.5):
        split = stratified_split(keys, labels, 0.5, 11, ["a", "b"], val_ratio=val_ratio)
        assert split.test == ["a/0.jpg", "a/2.jpg", "a/5.jpg", "b/0.jpg", "b/1.jpg"]
        assert sorted(split.train + split.val) == ["a/1.jpg", "a/3.jpg", "a/4.jpg", "b/2.jpg", "b/3.jpg", "b/4.jpg"]
    assert [_per_class(split.val, c) for c in "ab"] == [2, 2]  # round(0.5 * 3) half up, as for train


def test_val_ratio_zero_gives_the_plain_split(aid_scan):
    _, _, scan = aid_scan
    classes = scan.spec.classes
    split = stratified_split(scan.names, scan.labels, 0.2, 5, classes, "aid", val_ratio=0.0)
    assert split == stratified_split(scan.names, scan.labels, 0.2, 5, classes, "aid")
    assert split.val == [] and split.val_ratio == 0.0
    rows = split.indices(scan.names)
    assert isinstance(rows, SplitRows) and len(rows.val) == 0
    assert sorted([*rows.train, *rows.test]) == list(range(len(scan.names)))


def test_val_is_deterministic_and_independent_of_key_order(aid_scan):
    _, _, scan = aid_scan
    classes = scan.spec.classes
    a = stratified_split(scan.names, scan.labels, 0.5, 0, classes, val_ratio=0.3)
    b = stratified_split(scan.names, scan.labels, 0.5, 0, classes, val_ratio=0.3)
    c = stratified_split(scan.names, scan.labels, 0.5, 1, classes, val_ratio=0.3)
    assert (a.train, a.val, a.test) == (b.train, b.val, b.test)
    assert set(a.val) != set(c.val)
    perm = np.random.default_rng(0).permutation(len(scan.names))
    d = stratified_split([scan.names[i] for i in perm], scan.labels[perm], 0.5, 0, classes, val_ratio=0.3)
    assert (d.train, d.val, d.test) == (a.train, a.val, a.test)


def test_indices_give_the_val_rows_and_check_val_files(aid_scan):
    _, _, scan = aid_scan
    split = stratified_split(scan.names, scan.labels, 0.5, 0, scan.spec.classes, "aid", val_ratio=0.25)
    rows = split.indices(scan.names, scan.spec.classes)
    assert [scan.names[r] for r in rows.val] == split.val
    assert [scan.names[r] for r in rows.train] == split.train and [scan.names[r] for r in rows.test] == split.test
    split.val.append("Airport/airport_999.jpg")
    with pytest.raises(SplitMismatchError, match=r"1 file\(s\) not found.*airport_999"):
        split.indices(scan.names)


def test_restricted_drops_from_val_too(aid_scan):
    _, _, scan = aid_scan
    split = stratified_split(scan.names, scan.labels, 0.5, 0, scan.spec.classes, "aid", val_ratio=0.25)
    drop = {split.train[0], split.val[0], split.test[0]}
    kept = split.restricted(drop)
    assert kept.val == split.val[1:] and kept.train == split.train[1:] and kept.test == split.test[1:]
    assert kept.val_ratio == 0.25 and kept.seed == split.seed


def test_save_load_round_trip_keeps_val(aid_scan, tmp_path):
    _, _, scan = aid_scan
    split = stratified_split(scan.names, scan.labels, 0.5, 4, scan.spec.classes, "aid", val_ratio=0.25)
    path = split.save(tmp_path / "run" / "split.json")
    data = json.loads(path.read_text())
    assert data["val"] == split.val and data["val_ratio"] == 0.25 and len(split.val) > 0
    assert Split.load(path) == split
    assert [p.name for p in path.parent.iterdir()] == ["split.json"]  # no temporary file left beside it


def test_old_split_file_without_val_loads_with_no_val(aid_scan, tmp_path):
    top, _, scan = aid_scan
    split = stratified_split(scan.names, scan.labels, 0.5, 0, scan.spec.classes, "aid")
    old = {k: v for k, v in json.loads(split.save(tmp_path / "new.json").read_text()).items()
           if k not in ("val", "val_ratio")}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = Split.load(path)
    assert loaded == split and loaded.val == [] and loaded.val_ratio == 0.0
    bundle = build_datasets("aid", top, 0.5, 0, 8, check_counts=False, split_file=path, val_ratio=0.5)
    assert bundle.val is None and bundle.train.names == split.train


@pytest.mark.parametrize("val_ratio", [-0.1, 1.0, 1.5, "x", None])
def test_bad_val_ratio_names_the_setting(aid_scan, val_ratio):
    _, _, scan = aid_scan
    with pytest.raises(ValueError, match=r"dataset\.val_ratio"):
        check_val_ratio(val_ratio)
    with pytest.raises(ValueError, match=r"dataset\.val_ratio"):
        stratified_split(scan.names, scan.labels, 0.5, 0, scan.spec.classes, val_ratio=val_ratio)


@pytest.mark.parametrize("val_ratio", [-0.1, 1.0, "x"])
def test_build_refuses_a_bad_val_ratio(fake_archive, val_ratio):
    top = fake_archive("ucmerced_mini", per_class=4, size=8)
    with pytest.raises(ValueError, match=r"dataset\.val_ratio"):
        build_datasets("ucmerced_mini", top, 0.5, 0, 8, check_counts=False, val_ratio=val_ratio)


def test_build_datasets_returns_the_val_part(fake_archive, caplog):
    top = fake_archive("ucmerced_mini", per_class=8, size=8)
    num_classes = DATASETS["ucmerced_mini"].num_classes
    with caplog.at_level(logging.INFO, logger="rsnet.data.datasets"):
        bundle = build_datasets("ucmerced_mini", top, 0.5, 0, 8, check_counts=False, val_ratio=0.25)
    # 8 a class: 4 test, 4 train of which round(0.25 * 4) = 1 held out for validation
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (3 * num_classes, num_classes, 4 * num_classes)
    assert bundle.val.names == bundle.split.val and bundle.val.name == "ucmerced_mini/val"
    assert sorted(bundle.val.labels.tolist()) == list(range(num_classes))
    for i in range(len(bundle.val)):
        label = int(bundle.val.labels[i])
        assert bundle.val.names[i].split("/")[0] == bundle.class_names[label]
        assert abs(int(bundle.val.raw(i)[..., 0].mean()) - label_value(label)) <= 3
    assert set(bundle.val.names).isdisjoint(bundle.train.names + bundle.test.names)
    image, _ = bundle.val[0]  # eval transform: no augmentation, same as test
    assert repr(bundle.val.transform) == repr(bundle.test.transform) != repr(bundle.train.transform)
    assert tuple(image.shape) == (3, 8, 8)
    assert f"{3 * num_classes} train / {num_classes} val / {4 * num_classes} test images" in caplog.text

    plain = build_datasets("ucmerced_mini", top, 0.5, 0, 8, check_counts=False)
    assert plain.val is None and plain.test.names == bundle.test.names


def test_split_file_val_is_used_and_val_ratio_ignored(fake_archive, tmp_path):
    top = fake_archive("ucmerced_mini", per_class=8, size=8)
    first = build_datasets("ucmerced_mini", top, 0.5, 0, 8, check_counts=False, val_ratio=0.25)
    path = first.split.save(tmp_path / "split.json")
    again = build_datasets("ucmerced_mini", top, 0.8, 9, 8, check_counts=False, split_file=path, val_ratio=0.5)
    assert again.val.names == first.val.names and again.train.names == first.train.names


def test_build_from_config_reads_val_ratio(fake_archive):
    top = fake_archive("ucmerced_mini", per_class=20, size=8)  # the official count: no DatasetCountWarning
    config = dataset_config("ucmerced_mini", root=str(top), train_ratio=0.5, image_size=8)
    assert config["val_ratio"] == 0.0 and build_datasets_from_config(config, seed=0).val is None
    bundle = build_datasets_from_config({**config, "val_ratio": 0.5}, seed=0)
    assert len(bundle.val) == 5 * DATASETS["ucmerced_mini"].num_classes  # half of the 10 train images a class


def test_a_class_without_a_val_image_is_named(fake_archive):
    classes = DATASETS["ucmerced_mini"].classes
    top = fake_archive("ucmerced_mini", per_class={c: 2 if c in ("beach", "forest") else 6 for c in classes}, size=8)
    with pytest.raises(DatasetValidationError) as err:
        build_datasets("ucmerced_mini", top, 0.5, 0, 8, check_counts=False, val_ratio=0.25)
    assert str(err.value) == (
        f"ucmerced_mini under '{top / 'Images'}': no validation image for 'beach' (1 train image(s)), 'forest' "
        "(1 train image(s)) at dataset.val_ratio=0.25; a class needs at least 2 training images to hold one out: "
        "lower dataset.val_ratio (0: no validation part) or add images to those class folders")
