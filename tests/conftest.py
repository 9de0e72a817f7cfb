"""Shared fixtures: fake archives in the real dataset layouts, the bundled/real sample data, two scene images and a
small training checkpoint.

The plain helpers and test doubles they use live in helpers.py (``from helpers import ...``).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from helpers import MINI_ROOT, TIF_SAMPLE_ROOT, make_fake_archive, write_checkpoint


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: a test process per core on an idle machine; where other processes keep the cores busy (a browser
    and an IDE, a shared lab box), one more per busy process up to twice the cores, so that the suite keeps its share
    of the machine instead of a third of it (more processes than cores cost an idle machine time: every process
    builds its own module fixtures). Busy: the median of five readings of the processes running now, less this one
    (the load average lags a minute behind). PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or not hasattr(os, "sched_getaffinity"):
        return None
    cores = len(os.sched_getaffinity(0))
    readings = []
    for _ in range(5):
        try:
            running = Path("/proc/loadavg").read_text().split()[3]  # e.g. "5/312": running / all
        except (OSError, IndexError):
            return None
        readings.append(int(running.split("/")[0]) - 1)
        time.sleep(0.05)  # readings spread over a quarter second, not a synchronisation
    return min(cores + sorted(readings)[2], 2 * cores)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``) each test process gets its own share of the cores, and what it starts (the
    training workers of an end-to-end test) inherits that share: N processes with a torch thread per core each
    would overload the machine and slow every test down."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    index = int(worker.removeprefix("gw"))
    # fewer processes than cores: every count-th core; more (several processes a core): one core each
    share = cores[index::count] if count <= len(cores) else [cores[index % len(cores)]]
    os.sched_setaffinity(0, share)
    torch.set_num_threads(len(share))


# Files whose tests start training workers or the real scripts (seconds to a minute each): run first, so that the
# test processes of ``make test`` end together on short tests instead of one waiting for the other's long last one.
LONG_FIRST = ("test_gpu_scripts.py", "test_torchrun.py", "test_install.py", "test_train_e2e.py", "test_parallel.py",
              "test_sharded_eval.py", "test_shared_decode.py", "test_run_lock.py", "test_inference_errors.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of LONG_FIRST's files first, in the order collected."""
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)


@pytest.fixture
def fake_archive(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``fake_archive("aid", per_class=2, missing=["Beach"])`` -> archive top folder (see
    ``helpers.make_fake_archive``).

    Each call writes into its own sub-folder of the test's ``tmp_path``.
    """
    counter = iter(range(10_000))

    def make(name: str, **kwargs) -> Path:
        return make_fake_archive(tmp_path / f"archive{next(counter)}", name, **kwargs)

    return make


@pytest.fixture
def mini_root() -> Path:
    """The bundled real sample data/ucmerced-mini (21 classes × 20 jpg, 128 px), tracked in git."""
    assert MINI_ROOT.is_dir(), f"{MINI_ROOT} is missing: it is tracked in git, restore it (git checkout -- data)"
    return MINI_ROOT


@pytest.fixture
def tif_sample_root() -> Path:
    """tests/fixtures/ucmerced-tif-sample: one original UCM .tif per class (256 px), tracked in git."""
    assert TIF_SAMPLE_ROOT.is_dir(), (f"{TIF_SAMPLE_ROOT} is missing: it is tracked in git, restore it "
                                      "(git checkout -- tests/fixtures)")
    return TIF_SAMPLE_ROOT


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training checkpoint of a seeded esd_mbenet on test_resnet (``helpers.write_checkpoint``), one per module."""
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "best.pt")


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """A folder with two bundled scene images: beach80.jpg and forest81.jpg."""
    folder = tmp_path / "images"
    folder.mkdir()
    for name in ("beach/beach80.jpg", "forest/forest81.jpg"):
        shutil.copy(MINI_ROOT / "Images" / name, folder)
    return folder
