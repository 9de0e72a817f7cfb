"""Train a scene classifier: ``python scripts/train.py dataset=aid model=esd_mbenet backbone=resnet50``.

Every setting lives in ``conf/`` (Hydra); outputs go to the run directory (``hydra.run.dir``):
checkpoints/, metrics.json, split.json, tensorboard/. ``trainer.resume=true`` continues a run.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rsnet.cli import user_errors
from rsnet.engine.config_checks import check_top_level_keys
from rsnet.engine.trainer import NonFiniteLossError, train
from rsnet.files import DiskFullError, atomic_write
from rsnet.parallel.launcher import WorkerError

log = logging.getLogger("rsnet.train")
CONF = Path(__file__).resolve().parent.parent / "conf"
RECORD_SUBDIR = ".hydra"


@hydra.main(config_path=str(CONF), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train, print the final figures, and return the reported test accuracy (for Hydra sweeps).

    Under torchrun only rank 0 gets the figures; the other ranks return None without printing.
    """
    config = OmegaConf.to_container(cfg, resolve=True)
    with user_errors():
        check_top_level_keys(config, known_top_level_keys())
        try:
            summary = train(config, on_accepted=lambda run_dir: record_config(cfg, run_dir))
        except (NonFiniteLossError, WorkerError) as error:
            print(f"error: the run stopped: {error}", file=sys.stderr)
            sys.exit(1)
    if summary is None:
        return None
    print(f"run dir: {config['run_dir']}")
    print(f"test accuracy ({summary['reported_head']}): {summary['accuracy']:.2f} %  "
          f"(main branch {summary['oa']['main']:.2f} %, best {summary['best_accuracy']:.2f} %, "
          f"{summary['epochs']} epochs, {summary['wall_time_s']:.0f} s, {summary['images_per_s']:.1f} img/s)")
    return float(summary["accuracy"])


def record_config(cfg: DictConfig, run_dir: Path) -> None:
    """Write what Hydra would write to ``<run_dir>/.hydra/`` (config, hydra config, overrides), once the run is
    accepted: conf/config.yaml sets ``hydra.output_subdir: null`` so that a refused re-run leaves the earlier
    run's record untouched."""
    hydra_cfg = HydraConfig.get()
    folder = run_dir / RECORD_SUBDIR
    folder.mkdir(exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
                       ("overrides.yaml", hydra_cfg.overrides.task)):
        with atomic_write(folder / name, "w") as handle:
            handle.write(OmegaConf.to_yaml(node))


def known_top_level_keys() -> set[str]:
    """The top-level keys of conf/config.yaml and the config groups (the folders of conf/), as in a composed config."""
    keys = {str(key) for key in OmegaConf.load(CONF / "config.yaml")} - {"defaults", "hydra"}
    return keys | {p.name for p in CONF.iterdir() if p.is_dir()}


def argv_for_this_rank(argv: list[str]) -> list[str]:
    """``argv`` plus, on a torchrun rank other than 0, an override that keeps Hydra out of the run dir.

    Every rank runs Hydra, so without it all would append to ``train.log`` in the shared run dir at once.
    Appended last, it wins over the user's: console-only logging (the ``stdout`` job logging evaluate.py
    uses too). Rank 0 keeps the file, and only rank 0 records the config (:func:`record_config`).
    """
    if os.environ.get("RANK", "0") == "0":
        return argv
    return [*argv, "hydra/job_logging=stdout"]


if __name__ == "__main__":
    sys.argv = argv_for_this_rank(sys.argv)
    main()
