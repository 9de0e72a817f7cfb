"""Starting a run afresh in a run dir that holds an earlier one (``overwrite=true``, or a run that stopped before
its first checkpoint): the earlier run's outputs go first, so they do not mix with the new run's."""

from __future__ import annotations

import shutil
from pathlib import Path

from rsnet.viz.figures import FIGURE_FORMATS

FIGURE_EXTENSIONS = tuple(dict.fromkeys(extension for formats in FIGURE_FORMATS.values() for extension in formats))
# what a training run writes into its run dir (docs/usage.md); the command's .hydra/ and train.log are Hydra's
EARLIER_RUN_OUTPUTS = ("checkpoints", "tensorboard", "metrics.json", "split.json", "history.csv",
                       *(f"{stem}.{extension}" for stem in ("curves", "confusion") for extension in FIGURE_EXTENSIONS))


def remove_earlier_run(run_dir: Path) -> list[str]:
    """Delete the outputs an earlier run left in ``run_dir``; return their names. Kept, they would mix with the new
    run's: TensorBoard draws the events of both runs as one set of curves, and a ``best.pt`` selected on validation
    would outlive a new run that selects none."""
    removed = []
    for name in EARLIER_RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed
