"""Bad input in one clear line: every corrupt file at once, classes left without a test image, a disk
cache whose pixels changed, an unusable cache folder."""

from __future__ import annotations

import errno
import json
import logging
import pickle

import numpy as np
import pytest
from helpers import label_value, make_fake_archive, truncate_file

import rsnet.data.cache as cache_mod
from rsnet.data import (
    DATASETS,
    CorruptImageError,
    CorruptImageWarning,
    DatasetValidationError,
    build_datasets,
)


def _ucm(tmp_path, per_class=3):
    top = make_fake_archive(tmp_path / "a", "ucmerced", per_class=per_class, size=16)
    return top, top / "Images"


def _build(top, **kwargs):
    return build_datasets("ucmerced", top, 0.5, 0, 16, check_counts=False, **kwargs)


@pytest.mark.parametrize("cache", ["memory", "disk", "none"])
def test_every_corrupt_file_is_named_in_one_line(tmp_path, cache):
    top, images = _ucm(tmp_path)
    bad = sorted(images.glob("*/*00.tif"))[:12]
    for f in bad:
        truncate_file(f)
    cdir = tmp_path / "cache"
    with pytest.raises(CorruptImageError) as err:
        _build(top, cache=cache, cache_dir=cdir)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("cannot decode 12 images")
    assert all(f"'{f}'" in msg for f in bad[:10]) and str(bad[10]) not in msg and "... and 2 more" in msg
    assert "pass dataset.skip_corrupt=true to skip them" in msg
    assert err.value.paths == [str(f) for f in bad] and err.value.path == str(bad[0])

    with pytest.warns(CorruptImageWarning, match="skipped 12 undecodable"):
        bundle = _build(top, cache=cache, cache_dir=cdir, skip_corrupt=True)
    assert len(bundle.train) + len(bundle.test) == 63 - 12
    if cache == "disk":  # the cache written by the failed run is reused by the run that skips
        assert bundle.train.store.decoded == 0


def test_corrupt_image_error_pickles_with_its_files():
    err = CorruptImageError(["/d/a.tif", "/d/b.tif"], OSError("image file is truncated"))
    clone = pickle.loads(pickle.dumps(err))
    assert clone.paths == err.paths and str(clone) == str(err) and "OSError: image file is truncated" in str(clone)


def test_skip_corrupt_that_empties_a_class_is_refused_naming_it(tmp_path):
    top, images = _ucm(tmp_path, per_class=2)
    for f in (images / "beach").iterdir():
        truncate_file(f)
    with pytest.warns(CorruptImageWarning), pytest.raises(DatasetValidationError) as err:
        _build(top, skip_corrupt=True)
    assert str(err.value) == (
        f"ucmerced under '{images}' after skipping 2 undecodable file(s): 'beach' has 0 image(s) left (0 train, "
        "0 test); every class needs at least 2 images, one for train and one for test: add images to those class "
        "folders or replace the undecodable files")


def test_class_with_one_image_is_refused_before_decoding(tmp_path, monkeypatch):
    counts = {c: 3 for c in DATASETS["ucmerced"].classes}
    counts["beach"] = 1
    top = make_fake_archive(tmp_path / "a", "ucmerced", per_class=counts, size=16)
    monkeypatch.setattr(cache_mod, "decode_image", lambda *a: pytest.fail("decoded before the class check"))
    with pytest.raises(DatasetValidationError, match=r"'beach' has 1 image\(s\) \(1 train, 0 test\).*at least 2"):
        _build(top)


def test_saved_split_left_without_a_test_image_is_refused(tmp_path):
    top, images = _ucm(tmp_path, per_class=2)
    split = _build(top).split.save(tmp_path / "split.json")
    test_file = next(f for f in json.loads(split.read_text())["test"] if f.startswith("forest/"))
    truncate_file(images / test_file)
    with pytest.warns(CorruptImageWarning), pytest.raises(DatasetValidationError, match=r"'forest'.*split.json"):
        _build(top, skip_corrupt=True, split_file=split)


def test_disk_cache_with_changed_pixels_is_rebuilt(tmp_path, caplog):
    top, _ = _ucm(tmp_path, per_class=2)
    cdir = tmp_path / "cache"
    _build(top, cache="disk", cache_dir=cdir)
    npy = next(cdir.glob("*.npy"))
    assert json.loads(npy.with_suffix(".json").read_text())["checksum"].startswith("crc32:")
    pixels = np.load(npy, mmap_mode="r+")  # zero the pixels in place; the .npy header stays intact
    pixels[:] = 0
    pixels.flush()
    del pixels
    with caplog.at_level(logging.WARNING, logger="rsnet.data.cache"):
        again = _build(top, cache="disk", cache_dir=cdir)
    assert f"disk cache {npy} does not match the checksum written with it (its pixels changed); rebuilding" in [
        r.getMessage() for r in caplog.records]
    assert again.train.store.decoded == 42
    for ds in (again.train, again.test):
        for i in range(len(ds)):
            assert abs(int(ds.raw(i)[..., 0].mean()) - label_value(int(ds.labels[i]))) <= 3


def test_cache_dir_that_is_a_file_is_one_clear_line(tmp_path, capsys):
    from rsnet.cli import user_errors

    top, _ = _ucm(tmp_path, per_class=2)
    a_file = tmp_path / "cache.txt"
    a_file.write_text("x")
    with pytest.raises(SystemExit) as stop, user_errors():
        _build(top, cache="disk", cache_dir=a_file)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: dataset.cache_dir '{a_file}' is a file, not a folder")
    with pytest.raises(ValueError, match=r"dataset\.cache_dir '.*cache\.txt/sub' cannot be created"):
        _build(top, cache="disk", cache_dir=a_file / "sub")


def test_unwritable_cache_dir_says_so(tmp_path, monkeypatch):
    top, _ = _ucm(tmp_path, per_class=2)

    def refuse(*args, **kwargs):  # as root, chmod cannot make a folder unwritable
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache_mod.np.lib.format, "open_memmap", refuse)
    with pytest.raises(ValueError, match=r"cannot write the disk cache in dataset\.cache_dir '.*' \(Permission denied"):
        _build(top, cache="disk", cache_dir=tmp_path / "cache")



def test_full_disk_while_creating_the_disk_cache_is_one_clear_error(tmp_path, monkeypatch):
    """The whole cache file is allocated before decoding: a full disk is an error, not a SIGBUS mid-decode."""
    from rsnet.files import DiskFullError

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "posix_fallocate", full)
    root = make_fake_archive(tmp_path / "ucm", "ucmerced", per_class=2, size=16)
    with pytest.raises(DiskFullError, match=r"no space left on device while writing .*\.npy"):
        build_datasets("ucmerced", root, 0.5, 0, 16, cache="disk", cache_dir=tmp_path / "cache", check_counts=False)
    assert not any((tmp_path / "cache").glob(".*tmp*"))  # no partial file left behind
