"""Decode-once caches: disk cache reuse, shared memory, loader workers, batches and transforms."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from helpers import label_value
import torch.multiprocessing  # noqa: F401  (registers the tensor reductions)
from multiprocessing.reduction import ForkingPickler
from torch.utils.data import DataLoader

import rsnet.data.cache as cache_mod
import rsnet.data.store as store_mod
from rsnet.data import DATASETS, HIGH_BIT_DEPTH_MODES, build_datasets
from rsnet.data.transforms import IMAGENET_MEAN, IMAGENET_STD


def _no_decode(*args, **kwargs):
    raise AssertionError("decode_image was called although the disk cache should be reused")


def test_disk_cache_is_reused_without_decoding(fake_archive, tmp_path, monkeypatch):
    top = fake_archive("nwpu_resisc45", per_class=2, size=20)
    cdir = tmp_path / "cache"
    first = build_datasets("nwpu_resisc45", top, 0.5, 0, 16, cache="disk", cache_dir=cdir, check_counts=False)
    assert first.train.store.decoded == 90
    files = sorted(p.name for p in cdir.iterdir())
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".npy")  # no temp files left
    assert files[1].startswith("nwpu_resisc45_16px_n90_")
    assert isinstance(first.train.images, np.memmap)

    monkeypatch.setattr(cache_mod, "decode_image", _no_decode)
    second = build_datasets("nwpu_resisc45", top, 0.5, 1, 16, cache="disk", cache_dir=cdir, check_counts=False)
    assert second.train.store.decoded == 0
    assert np.array_equal(np.asarray(second.train.images), np.asarray(first.train.images))
    for i in range(len(second.test)):  # other seed, same cache: rows still match their files
        assert abs(int(second.test.raw(i)[..., 0].mean()) - label_value(int(second.test.labels[i]))) <= 3

    # another size is another cache entry (and needs decoding)
    with pytest.raises(AssertionError, match="decode_image was called"):
        build_datasets("nwpu_resisc45", top, 0.5, 0, 12, cache="disk", cache_dir=cdir, check_counts=False)


def test_disk_cache_ignores_an_unfinished_file(fake_archive, tmp_path):
    top = fake_archive("ucmerced", per_class=2, size=8)
    cdir = tmp_path / "cache"
    build_datasets("ucmerced", top, 0.5, 0, 8, cache="disk", cache_dir=cdir, check_counts=False)
    meta = next(cdir.glob("*.json"))
    meta.unlink()  # as if the run died before the completion marker was written
    again = build_datasets("ucmerced", top, 0.5, 0, 8, cache="disk", cache_dir=cdir, check_counts=False)
    assert again.train.store.decoded == 42 and meta.exists()


def test_memory_cache_is_one_shared_array(mini_root):
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 32)
    train, test = bundle.train, bundle.test
    assert train.images is test.images
    assert train.images.shape == (420, 32, 32, 3) and train.images.dtype == np.uint8
    assert np.shares_memory(train.raw(0), train.images)
    assert np.shares_memory(test.raw(3), train.images)


def test_dataloader_workers_return_correct_labels(fake_archive):
    top = fake_archive("ucmerced", per_class=4, size=16)
    bundle = build_datasets("ucmerced", top, 0.5, 0, 16, check_counts=False)
    ds = bundle.test
    loader = DataLoader(ds, batch_size=8, num_workers=2, shuffle=False)
    xs, ys = zip(*loader)
    x, y = torch.cat(xs), torch.cat(ys)
    assert y.tolist() == ds.labels.tolist()
    red = x[:, 0] * IMAGENET_STD[0] + IMAGENET_MEAN[0]  # un-normalise the red channel
    expected = torch.tensor([label_value(int(v)) / 255 for v in y])
    assert torch.allclose(red.mean(dim=(1, 2)), expected, atol=3 / 255)


def test_store_pickles_by_sharing_not_copying(mini_root, tmp_path):
    # what spawn/forkserver workers receive: a shared-memory tensor or the memmap's path
    mem = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 16).train
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(mem)
    assert len(buf.getvalue()) < mem.images.nbytes / 4
    clone = pickle.loads(buf.getvalue())
    pixels = mem.raw(5).copy()
    assert np.array_equal(clone.raw(5), pixels)
    mem.raw(5)[...] = 255 - pixels  # the clone maps the same shared memory, so it sees the write
    assert np.array_equal(clone.raw(5), 255 - pixels)

    disk = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 16, cache="disk", cache_dir=tmp_path).train
    blob = pickle.dumps(disk)
    assert len(blob) < disk.images.nbytes / 4
    clone = pickle.loads(blob)
    assert isinstance(clone.images, np.memmap) and np.array_equal(clone.raw(5), disk.raw(5))


def test_get_batch_and_item_contract(mini_root):
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 48)
    x, y = bundle.train.get_batch([3, 0, 7])
    assert x.shape == (3, 3, 48, 48) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and y.tolist() == bundle.train.labels[[3, 0, 7]].tolist()
    assert torch.equal(x, bundle.train.get_batch(torch.tensor([3, 0, 7]))[0])  # one draw per (seed, epoch, index)
    assert not torch.equal(x, bundle.train.get_batch([3, 0, 7], epoch=1)[0])  # augmented: another epoch's draw
    # eval transform is deterministic and only normalises the stored image
    t, label = bundle.test[4]
    assert label == int(bundle.test.labels[4])
    ref = (torch.from_numpy(bundle.test.raw(4)).permute(2, 0, 1).float() / 255
           - torch.tensor(bundle.mean).view(3, 1, 1)) / torch.tensor(bundle.std).view(3, 1, 1)
    assert torch.allclose(t, ref, atol=1e-5)
    xe, ye = bundle.test.get_batch([4])
    assert torch.allclose(xe[0], t) and ye.tolist() == [label]


def test_no_cache_decodes_on_access(fake_archive, monkeypatch):
    top = fake_archive("aid", per_class=2, size=12)
    bundle = build_datasets("aid", top, 0.5, 0, 12, cache="none", check_counts=False)
    assert bundle.train.images is None
    calls = []
    real = store_mod.decode_image
    monkeypatch.setattr(store_mod, "decode_image", lambda p, *a: calls.append(p) or real(p, *a))
    img = bundle.train.raw(0)
    assert img.shape == (12, 12, 3) and calls == [bundle.train.paths[0]]


def test_bad_cache_mode(mini_root):
    with pytest.raises(ValueError, match="dataset.cache"):
        build_datasets("ucmerced_mini", mini_root, 0.5, 0, 16, cache="gpu")


def test_hydra_dataset_configs():
    from helpers import compose_command

    for name in DATASETS:
        cfg = compose_command("config", f"dataset={name}").dataset  # with the shared conf/_base/dataset.yaml
        assert cfg.name == name
        assert set(cfg) >= {"name", "root", "train_ratio", "image_size", "cache", "cache_dir", "skip_corrupt",
                            "high_bit_depth"}
        assert 0 < cfg.train_ratio < 1 and cfg.cache in ("memory", "disk", "none")
        assert cfg.high_bit_depth in HIGH_BIT_DEPTH_MODES


def test_prefetcher_yields_get_batch_in_order_and_raises_its_errors(mini_root):
    from rsnet.data import BatchPrefetcher

    test = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 16).test
    batches = [list(range(i, i + 8)) for i in range(0, 40, 8)]
    prefetcher = BatchPrefetcher(test.get_batch, "cpu")
    got = list(prefetcher.batches(iter(batches)))
    assert len(got) == 5
    for idx, batch in zip(batches, got):
        ex, ey = test.get_batch(idx)
        assert torch.equal(batch.images, ex) and torch.equal(batch.labels, ey)
    with pytest.raises(IndexError, match="index 10000 is out of bounds"):  # the bad batch's own error
        list(prefetcher.batches(iter([[0, 1], [10_000]])))
    prefetcher.close()


def test_a_memory_cache_larger_than_the_machine_is_refused_before_decoding() -> None:
    """A memory cache larger than the machine is refused in one line, before any image is opened, with its size
    and what to change (dataset.image_size, dataset.cache=disk)."""
    from rsnet.data.cache import build_store

    paths = [f"/nowhere/scene{i}.jpg" for i in range(100_000)]  # never opened: the check comes first
    with pytest.raises(ValueError) as refused:
        build_store("aid", ["x"] * len(paths), paths, 4096, mode="memory")
    message = str(refused.value)
    assert message.startswith("dataset.cache=memory: 100000 images at 4096 px need 4.6 TiB") and "\n" not in message
    assert "available" in message and "dataset.image_size" in message and "dataset.cache=disk" in message


def test_building_a_dataset_lists_its_paths_a_few_times_not_once_a_row(mini_root, monkeypatch) -> None:
    """The file list is built anew at each ``ScanResult.paths``: building the datasets reads it a fixed number of
    times, whatever their size (once per training row, it made every worker's start quadratic in the dataset: 5 s
    on aid-dev's 900 training images, minutes on AID's)."""
    from rsnet.data.discovery import ScanResult

    reads = []
    real = ScanResult.paths.fget
    monkeypatch.setattr(ScanResult, "paths", property(lambda scan: reads.append(1) or real(scan)))
    bundle = build_datasets("ucmerced_mini", mini_root, 0.5, 0, 16)
    assert len(bundle.train) == 210 and len(reads) <= 5, len(reads)  # was 215: once more per training row
