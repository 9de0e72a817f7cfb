"""cache=memory with several workers on one machine: one decode, shared pages, nothing left behind."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
from helpers import MINI_ROOT, dataset_config

from rsnet.data.datasets import build_datasets_from_config
from rsnet.data.shared_decode import load_decoded_once, shared_memory_folder
from rsnet.files import DiskFullError
from rsnet.parallel import launch

FOLDER_KEY = "rsnet/decode/0/folder"  # where the machine's first worker says which folder it decoded into
DATASET = dataset_config("ucmerced_mini", root=str(MINI_ROOT), train_ratio=0.5, image_size=32, cache="memory")


def _decode_worker(ctx, dataset: dict):
    data = load_decoded_once(dataset, lambda cfg: build_datasets_from_config(cfg, seed=0), store=ctx.store,
                             rank=ctx.rank, local_rank=ctx.rank, local_world=ctx.world_size)
    store = data.train.store
    return {"decoded": _gather(store.decoded), "modes": _gather(store.mode),
            "crc": _gather(zlib.crc32(np.ascontiguousarray(store.array))),
            "folder": ctx.store.get(FOLDER_KEY).decode() if ctx.store.check([FOLDER_KEY]) else None}


def _gather(value):
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def test_three_workers_decode_once_share_the_pixels_and_leave_nothing() -> None:
    out = launch(_decode_worker, ["cpu", "cpu", "cpu"], DATASET, timeout_s=120)
    assert out["decoded"] == [420, 0, 0]  # the first worker decoded, the others mapped its pages
    assert len(set(out["crc"])) == 1  # the same pixels on every worker
    assert out["modes"] == ["memory"] * 3  # shared with loader workers as memory, not by a removed file
    # this run's folder, not a listing of /dev/shm (other test processes decode into folders of their own meanwhile)
    folder = Path(out["folder"])
    assert folder.parent == shared_memory_folder() and folder.name.startswith("rsnet-decode-")
    assert not folder.exists()


def test_one_worker_or_another_cache_builds_as_before() -> None:
    out = launch(_decode_worker, ["cpu"], DATASET, timeout_s=120)
    assert out["decoded"] == [420] and out["modes"] == ["memory"]
    out = launch(_decode_worker, ["cpu", "cpu"], {**DATASET, "cache": "none"}, timeout_s=120)
    assert out["modes"] == ["none", "none"] and out["folder"] is None  # nothing shared, no folder


class _Store:
    """The c10d store calls load_decoded_once makes, for workers run one after the other in this process."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    def wait(self, keys: list[str], timeout=None) -> None:
        assert self.check(keys), f"would wait for {keys}"


def test_no_room_in_shared_memory_means_every_worker_decodes_its_own() -> None:
    store, built, folders = _Store(), [], []

    def build(cfg: dict):
        built.append(cfg["cache"])
        if cfg.get("cache_dir"):
            folders.append(Path(cfg["cache_dir"]))
        if cfg["cache"] == "disk":
            raise DiskFullError(Path(cfg["cache_dir"]) / "x.npy")
        return cfg["cache"]

    decoded = [load_decoded_once(DATASET, build, store=store, rank=rank, local_rank=rank, local_world=2)
               for rank in range(2)]
    assert decoded == ["memory", "memory"]
    assert built == ["disk", "memory", "memory"]  # the follower never tried the shared folder
    assert store.values[FOLDER_KEY] == b""  # the follower is told: nothing shared
    assert len(folders) == 1 and folders[0].name.startswith("rsnet-decode-")
    assert not folders[0].exists()  # the leader removed its folder
