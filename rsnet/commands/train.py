"""Train a scene classifier: ``rsnet-train dataset=aid model=esd_mbenet backbone=resnet50`` (in a checkout also ``python
scripts/train.py ...``); settings in ``conf/``, outputs in ``hydra.run.dir`` (docs/usage.md, Training)."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rsnet.cli import USER_ERRORS, counted, user_errors
from rsnet.commands import conf_folder, config_groups, hydra_config_path
from rsnet.commands.overrides import check_overrides
from rsnet.config_schema import TRAIN_CONFIG, register_schemas
from rsnet.files import DiskFullError, atomic_write

# torch, timm and the training code are imported where a run starts (main), not here: --help and a refused
# override answer without them (a few seconds of imports on a busy machine)
if TYPE_CHECKING:
    from rsnet.parallel.launcher import WorkerError

log = logging.getLogger("rsnet.train")
CONF = conf_folder()  # the package rsnet.conf: the checkout's conf/ or its installed copy
RECORD_SUBDIR = ".hydra"


register_schemas()  # the types of the settings, named by conf/config.yaml's defaults list (rsnet/config_schema.py)


@hydra.main(config_path=hydra_config_path(), config_name=TRAIN_CONFIG, version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Train, print the final figures, and return the reported test accuracy (for Hydra sweeps); None on a
    torchrun rank other than 0."""
    from rsnet.engine.config_checks import check_top_level_keys
    from rsnet.engine.epoch_loop import NonFiniteLossError
    from rsnet.engine.trainer import train
    from rsnet.parallel.launcher import WorkerError

    config = OmegaConf.to_container(cfg, resolve=True)
    with user_errors(), no_stub_left_on_bad_input(Path(config["run_dir"])):
        check_top_level_keys(config, known_top_level_keys())
        try:
            summary = train(config, on_accepted=lambda run_dir: record_config(cfg, run_dir))
        except WorkerError as error:
            report_worker_error(error, config)
        except NonFiniteLossError as error:
            stop(error)
        except KeyboardInterrupt:
            interrupted(config)
    if summary is None:
        return None
    print(f"run dir: {config['run_dir']}")
    selected = (f"epoch {summary['selected_epoch']} selected on validation ({summary['val_accuracy']:.2f} %), "
                if "selected_epoch" in summary else "")
    print(f"test accuracy ({summary['reported_head']}): {summary['accuracy']:.2f} %  "
          f"(main branch {summary['oa']['main']:.2f} %, {selected}"
          f"{counted(summary['epochs'], 'epoch')}, {summary['wall_time_s']:.0f} s, "
          f"{summary['images_per_s']:.1f} img/s)")
    run_dir = Path(config["run_dir"])
    suffix = "pdf" if config["log"]["figure_format"] == "pdf" else "png"
    print(f"curves: {run_dir / 'curves'}.{suffix} (table: history.csv; confusion matrix: confusion.{suffix}); every "
          f"figure and the attention maps: tensorboard --logdir {shlex.quote(str(run_dir / 'tensorboard'))}")
    return float(summary["accuracy"])


@contextmanager
def no_stub_left_on_bad_input(run_dir: Path) -> Iterator[None]:
    """A run dir that held no run when this command started (Hydra made it for train.log) is removed again where the
    command stops on a bad input (a user error, also one a worker found) before a checkpoint: no stub folder is left.
    A crash or Ctrl-C keeps it, with train.log saying what happened; a run dir holding a run is never touched."""
    from rsnet.engine.fresh_start import holds_no_run

    stub = os.environ.get("RANK", "0") == "0" and holds_no_run(run_dir)
    try:
        yield
    except USER_ERRORS:
        from rsnet.checkpoint import run_checkpoint_path

        if stub and not run_checkpoint_path(run_dir).is_file():
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def report_worker_error(error: WorkerError, config: dict | None = None) -> NoReturn:
    """A worker's input error or full disk is reported as if it had happened here (one line); a diverged loss
    in one line too; anything else (a bug, a killed or stopped worker) with what the workers said and, with the
    run's ``config``, how to continue it."""
    if isinstance(error.cause, (*USER_ERRORS, DiskFullError)):
        raise error.cause from None
    from rsnet.engine.epoch_loop import NonFiniteLossError

    if isinstance(error.cause, NonFiniteLossError):
        stop(error.cause)
    if config is None:
        stop(error)
    stop(error, how_to_continue(config) or "no checkpoint was written before it stopped: nothing to resume")


def stop(error: BaseException, then: str = "") -> NoReturn:
    """The run stopped (exit status 1): why (and ``then``, what to do next), on the console and in the run's
    train.log."""
    message = f"the run stopped: {error}" + (f"\n{then}" if then else "")
    print(f"error: {message}", file=sys.stderr)
    log_to_files(message)
    sys.exit(1)


def how_to_continue(config: dict) -> str | None:
    """What the run dir keeps and the command that continues the run from it; None where it keeps no checkpoint."""
    from rsnet.checkpoint import load_checkpoint
    from rsnet.engine.merge_commit import committed_position, resume_point

    point = resume_point(Path(config["run_dir"]))
    if point is None:
        return None
    saved = load_checkpoint(point, mmap=True)
    position = committed_position(saved)
    holds = (f"epoch {saved['epoch'] + 1} of {config['epochs']} up to its last merge ({position} samples)" if position
             else f"epoch {saved['epoch']} of {config['epochs']}")
    return f"{point} holds {holds}; continue with\n  {resume_command(sys.argv, config['run_dir'])}"


def log_to_files(message: str) -> None:
    """``message`` as an error in this process's log files only (the run's train.log, where Hydra set one up):
    the console has it already."""
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def interrupted(config: dict) -> NoReturn:
    """Ctrl-C: say what is kept and how to continue (rank 0 only; exit status 130, no traceback)."""
    if os.environ.get("RANK", "0") == "0":
        hint = how_to_continue(config)
        print(f"interrupted: {hint}" if hint else
              "interrupted before the first epoch ended: no checkpoint was written, nothing to resume", file=sys.stderr)
    sys.exit(130)


def resume_command(argv: list[str], run_dir: str) -> str:
    """The command line that continues this run: the same overrides, in the same run dir, with resume."""
    replaced = ("resume=", "overwrite=", "hydra.run.dir=")
    kept = [arg for arg in argv[1:] if not arg.lstrip("+~").startswith(replaced)]
    command = [interpreter(), argv[0]] if argv[0].endswith(".py") else [argv[0]]  # a script, or rsnet-train
    return shlex.join([*command, *kept, f"hydra.run.dir={run_dir}", "resume=true"])


def interpreter() -> str:
    """The Python running this command, written so that it works when pasted: relative to the current folder where
    it lies below it (``.venv/bin/python`` after ``make demo``, whose venv need not be activated), else in full."""
    executable = Path(sys.executable)
    return str(executable.relative_to(Path.cwd())) if executable.is_relative_to(Path.cwd()) else str(executable)


def record_config(cfg: DictConfig, run_dir: Path) -> None:
    """Write what Hydra would write to ``<run_dir>/.hydra/`` once the run is accepted (conf/config.yaml sets
    ``hydra.output_subdir: null``), so that a refused re-run leaves the earlier run's record untouched."""
    hydra_cfg = HydraConfig.get()
    folder = run_dir / RECORD_SUBDIR
    folder.mkdir(exist_ok=True)
    for name, node in (("config.yaml", cfg), ("hydra.yaml", OmegaConf.create({"hydra": hydra_cfg})),
                       ("overrides.yaml", hydra_cfg.overrides.task)):
        with atomic_write(folder / name, "w") as handle:
            handle.write(OmegaConf.to_yaml(node))


def known_top_level_keys() -> set[str]:
    """The top-level keys of conf/config.yaml and its config groups, as in a composed config."""
    keys = {str(key) for key in OmegaConf.create(CONF.joinpath("config.yaml").read_text())} - {"defaults", "hydra"}
    return keys | set(config_groups("config"))


def argv_for_this_rank(argv: list[str]) -> list[str]:
    """``argv`` plus, on a torchrun rank other than 0, console-only logging: every rank runs Hydra, and all would
    append to the shared run dir's ``train.log`` at once."""
    if os.environ.get("RANK", "0") == "0":
        return argv
    return [*argv, "hydra/job_logging=stdout"]


def run() -> None:
    """The ``rsnet-train`` command (and scripts/train.py): :func:`main` with this rank's command line."""
    with user_errors():
        check_overrides(TRAIN_CONFIG, sys.argv[1:], sys.argv[0])
    sys.argv = argv_for_this_rank(sys.argv)
    main()


if __name__ == "__main__":
    run()
