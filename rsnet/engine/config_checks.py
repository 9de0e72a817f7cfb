"""Checks of a training config that run before any worker starts, with errors that say what to fix."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting that cannot work; the message names the setting and what to do."""


def check_training_config(config: dict[str, Any], num_workers: int = 1) -> None:
    """Raise :class:`ConfigError` for settings that would fail later, before any training starts; each range
    is checked by the code that uses the setting, and the model and loss are built as training will."""
    from rsnet.models import validate_image_size

    check_finite(config)
    for key in ("epochs", "batch_size", "eval_every"):
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key}={value!r}: must be a positive integer"
                              + (" (epochs between evaluations; the last epoch is always evaluated)"
                                 if key == "eval_every" else ""))
    if config["seed"] < 0:
        raise ConfigError(f"seed={config['seed']}: must be >= 0 (numpy's generators take no negative seed)")
    _check_by_owners(config, num_workers)
    dataset = config["dataset"]
    try:
        validate_image_size(config["backbone"]["name"], dataset["image_size"])  # 32.5 is refused, not cut to 32
    except ValueError as error:
        raise ConfigError(f"dataset.image_size={dataset['image_size']} / backbone.name="
                          f"{config['backbone']['name']!r}: {error}") from error
    _check_launch_settings(config["trainer"], num_workers)
    _check_run_settings(config)
    check_model_and_loss(config)


def _check_by_owners(config: dict[str, Any], num_workers: int) -> None:
    """Each setting checked by the code that uses it, with its message."""
    from rsnet.data import check_on_device, check_train_ratio, check_val_ratio
    from rsnet.data.transforms import augmentation_options
    from rsnet.engine.lr_schedule import check_schedule_settings
    from rsnet.engine.optim import check_optimizer_settings
    from rsnet.engine.background_writer import check_background_writes
    from rsnet.evaluation import check_eval_batch_size
    from rsnet.models import check_arch
    from rsnet.parallel.batching import check_batch_per_worker
    from rsnet.parallel.strategies import STRATEGIES
    from rsnet.precision import check_amp
    from rsnet.viz.figures import check_figure_format

    owners = (("dataset.train_ratio", check_train_ratio), ("dataset.val_ratio", check_val_ratio),
              ("model.arch", check_arch), ("amp", check_amp), ("eval_amp", partial(check_amp, setting="eval_amp")),
              ("augment.on_device", check_on_device),
              ("eval_batch_size", check_eval_batch_size),
              ("log.figure_format", check_figure_format), ("log.background_writes", check_background_writes))
    trainer = config["trainer"]
    try:
        for key, check in owners:
            if _has(config, key):
                check(_lookup(config, key))
        check_batch_per_worker(config["batch_size"], num_workers)
        check_optimizer_settings(config["optimizer"])
        check_schedule_settings(config["lr_schedule"])
        augmentation_options(config.get("augment"))
        STRATEGIES[STRATEGIES.check(trainer["name"])].check_config(trainer, config["batch_size"], num_workers)
    except ValueError as error:
        raise ConfigError(str(error)) from error


def check_finite(config: dict[str, Any]) -> None:
    """Refuse nan and inf anywhere in the config, naming the setting (they pass the schema and ranges)."""
    for key, value in _numbers(config, ""):
        if not math.isfinite(value):
            raise ConfigError(f"{key}={value!r}: must be a finite number")


def check_model_and_loss(config: dict[str, Any]) -> None:
    """Build the model (on the meta device) and its loss as training will, checking their settings early."""
    import torch

    from rsnet.losses import MultiBranchLoss, check_loss_heads
    from rsnet.models import BackboneError, build_model, options_for_size

    model_settings, size = config["model"], int(config["dataset"]["image_size"])
    try:
        loss = MultiBranchLoss(**model_settings["loss"])
    except (TypeError, ValueError) as error:
        raise ConfigError(f"model.loss.{error}" if "=" in str(error).split(":")[0] else f"model.loss: {error}") \
            from error
    arch, backbone = model_settings["arch"], config["backbone"]["name"]
    try:
        with torch.device("meta"):
            model = build_model(arch, backbone, 2, pretrained=False,
                                **options_for_size(model_settings["options"], size)).eval()
            output = model(torch.zeros(2, 3, size, size))
    except BackboneError as error:
        raise ConfigError(str(error)) from error
    except (TypeError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())
        raise ConfigError(f"model.options ({arch} on {backbone}): {reason}") from error
    heads = ["main"] if isinstance(output, torch.Tensor) else list(output.logits)
    try:
        check_loss_heads(loss, heads)
    except ValueError as error:
        raise ConfigError(f"model.loss.{error} of model.arch={arch}") from error


def _check_run_settings(config: dict[str, Any]) -> None:
    """Gradient clipping and the logging cadence in range (a 0 would divide by zero in the last epoch)."""
    clip = config["max_grad_norm"]
    if clip is not None and not 0 < clip < math.inf:
        raise ConfigError(f"max_grad_norm={clip!r}: must be a finite number > 0, or null (no clipping)")
    log_settings = config["log"]
    if log_settings["attention_every"] < 1:
        raise ConfigError(f"log.attention_every={log_settings['attention_every']}: must be >= 1 (epochs between "
                          "attention maps; the last epoch always has them)")
    for key in ("attention_images", "embedding_images"):
        value = log_settings[key]
        if value is not None and value < 0:
            raise ConfigError(f"log.{key}={value}: must be >= 0" + (" or null" if key == "attention_images" else ""))


def _check_launch_settings(trainer: dict[str, Any], num_workers: int) -> None:
    """One simulated-slowdown factor (>= 1) per worker, a positive timeout, restarts >= 0, a simulated loss in range."""
    from rsnet.parallel.launcher import check_slowdown

    try:
        check_slowdown(trainer["slowdown"], num_workers)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    timeout = trainer["timeout_s"]
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigError(f"trainer.timeout_s={timeout!r}: must be a positive number of seconds (e.g. 600)")
    if trainer["max_restarts"] < 0:
        raise ConfigError(f"trainer.max_restarts={trainer['max_restarts']}: must be >= 0 (the lost workers a run goes "
                          "on without; 0: a lost worker stops the run)")
    lose = trainer.get("lose_worker")
    if lose is not None and (not isinstance(lose, list) or len(lose) != 3 or not 0 <= lose[0] < num_workers
                             or min(lose[1:]) < 1):
        raise ConfigError(f"trainer.lose_worker={lose!r}: give [rank, epoch, interval] (rank < {num_workers} workers, "
                          "1-based epoch and interval), e.g. [1, 2, 3], or null")


def check_devices(devices: list[str]) -> None:
    """Refuse device names torch does not know and CUDA devices this machine does not have."""
    from rsnet.devices import resolve_device

    for name in devices:
        if name == "auto":
            raise ConfigError("trainer.devices: 'auto' stands alone (trainer.devices=auto), not in a list")
        try:
            resolve_device(name, "trainer.devices")
        except ValueError as error:
            raise ConfigError(str(error)) from error


def check_top_level_keys(config: dict[str, Any], known: set[str]) -> None:
    """Refuse top-level keys rsnet does not read (``+epoch=1`` would otherwise train the default epochs)."""
    import difflib

    unknown = sorted(set(config) - known)
    if unknown:
        hints = [f"{key!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(key, known, 1))
                                else "") for key in unknown]
        raise ConfigError(f"unknown setting(s) {', '.join(hints)}: rsnet reads only {', '.join(sorted(known))}")


# The settings that define a run: a resumed run must keep them (anything else, e.g. epochs, trainer.devices,
# eval_batch_size, log.*, may change on resume).
RUN_IDENTITY = ("dataset.name", "dataset.train_ratio", "dataset.image_size", "dataset.bands", "model.arch",
                "model.options", "model.loss", "backbone.name", "seed")
# model.options added to conf/model after runs were started, with the value a run whose config lacks one ran with
LATER_MODEL_OPTIONS = {"main_pool": "avg", "main_heads": []}


def _identity_value(config: dict[str, Any], key: str) -> Any:
    """``key``'s value in ``config``; model.options with :data:`LATER_MODEL_OPTIONS` filled in where it lacks them."""
    value = _lookup(config, key)
    if key == "model.options" and isinstance(value, dict):
        value = {**LATER_MODEL_OPTIONS, **value}
    return value


def check_resume_identity(config: dict[str, Any], saved: dict[str, Any], checkpoint: Path) -> None:
    """Refuse to resume a run under settings that define another run (:data:`RUN_IDENTITY`); an option added since
    the run started counts as the value it ran with (:data:`LATER_MODEL_OPTIONS`)."""
    for key in RUN_IDENTITY:
        now, before = _identity_value(config, key), _identity_value(saved, key)
        if now != before:
            raise ConfigError(f"resume=true: {key}={now!r} but the run in {checkpoint} has {key}={before!r}; "
                              f"resuming keeps {', '.join(RUN_IDENTITY)} — pass the run's value, or start a new run "
                              "elsewhere (hydra.run.dir=...)")


def _numbers(value: Any, key: str) -> list[tuple[str, float]]:
    """Every float under ``value`` (nested dicts and lists), with its dotted key (under ``key``; "": the top)."""
    if isinstance(value, dict):
        return [pair for name, item in value.items() for pair in _numbers(item, f"{key}.{name}" if key else name)]
    if isinstance(value, list):
        return [pair for index, item in enumerate(value) for pair in _numbers(item, f"{key}[{index}]")]
    return [(key, value)] if isinstance(value, float) else []


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _has(config: dict[str, Any], dotted: str) -> bool:
    parent, _, leaf = dotted.rpartition(".")
    holder = _lookup(config, parent) if parent else config
    return isinstance(holder, dict) and leaf in holder


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> Path | None:
    """Return the checkpoint to resume from (or None): the last merge's commit where it is newer than last.pt;
    refuse to silently overwrite an earlier run."""
    from rsnet.checkpoint import run_checkpoint_path
    from rsnet.engine.merge_commit import resume_point

    last = run_checkpoint_path(run_dir)
    if resume and overwrite:
        raise ConfigError("resume=true and overwrite=true contradict each other: pass resume to "
                          "continue the run in this run dir, overwrite to start afresh there")
    if resume:
        point = resume_point(run_dir)
        if point is None:
            raise ConfigError(f"resume=true but {last} does not exist; start without resume, or point "
                              "hydra.run.dir at the run to continue")
        return point
    if last.is_file() and not overwrite:
        raise ConfigError(f"{run_dir} already holds a run ({last}); pass resume=true to continue it, "
                          "overwrite=true to start afresh there, or choose another hydra.run.dir")
    return None
