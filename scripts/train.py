"""Train a scene classifier: ``python scripts/train.py dataset=aid model=esd_mbenet backbone=resnet50``.

Every setting lives in ``conf/`` (Hydra); outputs go to the run directory (``hydra.run.dir``):
checkpoints/, metrics.json, split.json, tensorboard/. ``trainer.resume=true`` continues a run.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from rsnet.cli import user_errors
from rsnet.engine.trainer import NonFiniteLossError, train
from rsnet.parallel.launcher import WorkerError

log = logging.getLogger("rsnet.train")


@hydra.main(config_path=str(Path(__file__).resolve().parent.parent / "conf"), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    """Train, print the final figures, and return the reported test accuracy (for Hydra sweeps)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    with user_errors():
        try:
            summary = train(config)
        except (NonFiniteLossError, WorkerError) as error:
            print(f"error: the run stopped: {error}", file=sys.stderr)
            sys.exit(1)
    print(f"run dir: {config['run_dir']}")
    print(f"test accuracy ({summary['reported_head']}): {summary['accuracy']:.2f} %  "
          f"(main branch {summary['oa']['main']:.2f} %, best {summary['best_accuracy']:.2f} %, "
          f"{summary['epochs']} epochs, {summary['wall_time_s']:.0f} s, {summary['images_per_s']:.1f} img/s)")
    return float(summary["accuracy"])


if __name__ == "__main__":
    main()
