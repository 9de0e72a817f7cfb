"""One decode per machine: with ``dataset.cache=memory`` the first worker decodes into a file in ``/dev/shm``, the
others map it, and the file is removed once all have mapped it."""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rsnet.data.datasets import DataBundle
from rsnet.files import DiskFullError

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger(__name__)

# How long the machine's other workers wait for its first one to decode (a large dataset on a slow disk takes
# minutes; if that worker dies, the launcher or torchrun stops the others).
DECODE_WAIT = datetime.timedelta(hours=2)


def shared_memory_folder() -> Path:
    """RAM-backed ``/dev/shm`` where the system has it, else the temporary folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def load_decoded_once(dataset: dict[str, Any], build: Callable[[dict[str, Any]], DataBundle], *, store: dist.Store,
                      rank: int, local_rank: int, local_world: int) -> DataBundle:
    """``build(dataset)`` on every worker, decoded by the machine's first worker only with ``cache=memory``; every
    worker of the machine must call it."""
    if dataset.get("cache") != "memory" or local_world == 1:
        return build(dataset)
    leader = rank - local_rank  # a machine's workers are numbered contiguously
    key = f"rsnet/decode/{leader}"
    if local_rank == 0:
        folder = Path(tempfile.mkdtemp(prefix="rsnet-decode-", dir=shared_memory_folder()))
        try:
            data = build({**dataset, "cache": "disk", "cache_dir": str(folder)})
        except DiskFullError as error:  # no room in /dev/shm: every worker decodes its own copy
            log.warning("no room to share the decoded images in %s (%s): every worker decodes its own", folder, error)
            shutil.rmtree(folder, ignore_errors=True)
            store.set(f"{key}/folder", "")
            return build(dataset)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            if not store.check([f"{key}/folder"]):  # also on failure: the others then fail as this one did
                store.set(f"{key}/folder", str(folder))
        store.wait([f"{key}/mapped/{rank}" for rank in range(leader + 1, leader + local_world)], DECODE_WAIT)
        shutil.rmtree(folder, ignore_errors=True)
    else:
        store.wait([f"{key}/folder"], DECODE_WAIT)
        shared = store.get(f"{key}/folder").decode()
        if not shared or not Path(shared).is_dir():  # no room to share, or the first worker failed (fail as it did)
            return build(dataset)
        data = build({**dataset, "cache": "disk", "cache_dir": shared})
        store.set(f"{key}/mapped/{rank}", "1")
    data.train.store.keep_in_memory()
    return data

