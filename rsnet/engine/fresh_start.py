"""Starting a run afresh in a run dir that holds an earlier one (``overwrite=true``, or a run that stopped before
its first checkpoint). The earlier run's outputs are set aside in ``.earlier-run/`` (a rename in the same folder:
no bytes are copied or lost), so they do not mix with the new run's. If the new run stops before its first
checkpoint (a bad input, Ctrl-C, a crash), they are put back; they are deleted when it ends, or stops later."""

from __future__ import annotations

import fnmatch
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rsnet.checkpoint import run_checkpoint_path
from rsnet.engine.run_lock import LOCK_NAME, OWNER_NAME, WORKER_LOCK_GLOB
from rsnet.viz.figures import FIGURE_FORMATS

log = logging.getLogger(__name__)

FIGURE_EXTENSIONS = tuple(dict.fromkeys(extension for formats in FIGURE_FORMATS.values() for extension in formats))
# what a training run writes into its run dir (docs/usage.md): .hydra/ is the run's record of its config, written
# once the run is accepted; train.log is appended to (the earlier run's lines stay in front of the new run's)
EARLIER_RUN_OUTPUTS = ("checkpoints", "tensorboard", "metrics.json", "split.json", "history.csv", ".hydra",
                       *(f"{stem}.{extension}" for stem in ("curves", "confusion") for extension in FIGURE_EXTENSIONS))
SET_ASIDE = ".earlier-run"
# what a run dir holds before a run's first output: Hydra's train.log and the run lock (the workers' locks too)
NO_RUN_YET = ("train.log", LOCK_NAME, OWNER_NAME)


@contextmanager
def set_aside_earlier_run(run_dir: Path) -> Iterator[list[str]]:
    """For the block, move the outputs an earlier run left in ``run_dir`` to ``run_dir/.earlier-run/`` and yield
    their names. Kept in place they would mix with the new run's: TensorBoard draws the events of both runs as one
    set of curves, and a ``best.pt`` selected on validation would outlive a new run that selects none. Should the
    block stop before the new run has written ``checkpoints/last.pt``, the new run's outputs go and the earlier
    ones come back; otherwise (the block ends, or stops after a checkpoint) the earlier ones are deleted."""
    put_back_or_drop_an_unfinished_set_aside(run_dir)
    names = [name for name in EARLIER_RUN_OUTPUTS if _exists(run_dir / name)]
    if names:
        aside = run_dir / SET_ASIDE
        aside.mkdir()
        for name in names:
            (run_dir / name).rename(aside / name)
    try:
        yield names
    except BaseException:
        if names and not run_checkpoint_path(run_dir).is_file():
            _put_back(run_dir)
            log.warning("the new run stopped before its first checkpoint: the earlier run's %s are back in %s",
                        ", ".join(names), run_dir)
        else:
            _drop(run_dir)
        raise
    _drop(run_dir)


def holds_no_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is missing or holds nothing but :data:`NO_RUN_YET` and workers' locks."""
    return not run_dir.is_dir() or all(path.name in NO_RUN_YET or fnmatch.fnmatch(path.name, WORKER_LOCK_GLOB)
                                       for path in run_dir.iterdir())


def put_back_or_drop_an_unfinished_set_aside(run_dir: Path) -> None:
    """An earlier run set aside by a process that was killed (``kill -9``, a power cut) before it could decide: put
    it back where the new run wrote no checkpoint, else delete it (the new run had got going)."""
    if not (run_dir / SET_ASIDE).is_dir():
        return
    if run_checkpoint_path(run_dir).is_file():
        _drop(run_dir)
        return
    _put_back(run_dir)
    log.warning("%s held a run set aside by an overwrite that was killed before its first checkpoint: it is back "
                "in place", run_dir)


def _put_back(run_dir: Path) -> None:
    """Replace whatever the new run wrote by the set-aside outputs (renames, in the same folder)."""
    aside = run_dir / SET_ASIDE
    for name in EARLIER_RUN_OUTPUTS:
        _remove(run_dir / name)
    for path in sorted(aside.iterdir()):
        path.rename(run_dir / path.name)
    aside.rmdir()


def _drop(run_dir: Path) -> None:
    aside = run_dir / SET_ASIDE
    if aside.is_dir():
        shutil.rmtree(aside)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif _exists(path):
        path.unlink()
