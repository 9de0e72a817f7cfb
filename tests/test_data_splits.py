"""Protocol splits: stratification, determinism, save/load round trip, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rsnet.data import DATASETS, Split, SplitMismatchError, build_datasets, scan_dataset, stratified_split


@pytest.fixture
def aid_scan(fake_archive):
    # uneven class sizes like the real AID (scaled down): 4..13 images a class
    counts = {c: 4 + i % 10 for i, c in enumerate(DATASETS["aid"].classes)}
    top = fake_archive("aid", per_class=counts, size=8)
    return top, counts, scan_dataset("aid", top, check_counts=False)


@pytest.mark.parametrize("ratio", [0.2, 0.5, 0.8])
def test_every_class_in_train_and_test_at_the_ratio(aid_scan, ratio):
    _, counts, scan = aid_scan
    split = stratified_split(scan.keys, scan.labels, ratio, seed=3, class_names=scan.spec.classes)
    assert set(split.train).isdisjoint(split.test)
    assert sorted(split.train + split.test) == sorted(scan.keys)
    for c, n in counts.items():
        n_train = sum(f.startswith(c + "/") for f in split.train)
        n_test = sum(f.startswith(c + "/") for f in split.test)
        assert n_train + n_test == n
        assert n_train >= 1 and n_test >= 1
        assert abs(n_train - ratio * n) <= 0.5 + 1e-9 or n_train in (1, n - 1)


def test_same_seed_same_split_different_seed_different(aid_scan):
    _, _, scan = aid_scan
    classes = scan.spec.classes
    a = stratified_split(scan.keys, scan.labels, 0.5, 0, classes)
    b = stratified_split(scan.keys, scan.labels, 0.5, 0, classes)
    c = stratified_split(scan.keys, scan.labels, 0.5, 1, classes)
    assert a.train == b.train and a.test == b.test
    assert set(a.train) != set(c.train)
    # independent of the order the files were listed in
    perm = np.random.default_rng(0).permutation(len(scan.keys))
    d = stratified_split([scan.keys[i] for i in perm], scan.labels[perm], 0.5, 0, classes)
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
    assert again.train.files == first.train.files and again.test.files == first.test.files
    assert np.array_equal(again.train.labels, first.train.labels)


def test_split_with_missing_files_is_a_clear_error(aid_scan, tmp_path):
    top, _, scan = aid_scan
    split = stratified_split(scan.keys, scan.labels, 0.5, 0, scan.spec.classes, "aid")
    split.train.append("Airport/airport_999.jpg")
    path = split.save(tmp_path / "split.json")
    with pytest.raises(SplitMismatchError, match=r"1 file\(s\) not found.*airport_999"):
        build_datasets("aid", top, 0.5, 0, 8, check_counts=False, split_file=path)
    with pytest.raises(FileNotFoundError, match="split_file"):
        build_datasets("aid", top, 0.5, 0, 8, check_counts=False, split_file=tmp_path / "nope.json")


@pytest.mark.parametrize("ratio", [0, 1, 1.5, -0.1, "half"])
def test_out_of_range_train_ratio_names_the_setting(mini_root, ratio):
    with pytest.raises(ValueError, match=r"dataset\.train_ratio"):
        build_datasets("ucmerced_mini", mini_root, ratio, 0, 32)
