"""The types of rsnet-train's settings: Hydra structured configs, one dataclass per config group; values and comments
stay in conf/, ranges in ``rsnet.engine.config_checks``; ``Any`` marks a setting of several kinds."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Dict, List, Optional, Union, get_args, get_origin, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf.errors import ValidationError

PRIMARY_SCHEMA = "train_schema"  # the name conf/config.yaml's defaults list gives TrainSchema
TRAIN_CONFIG = "config"  # the config whose settings are typed here (rsnet-train's); the other commands' are not
SCHEMA_SUFFIX = "_schema"  # a defaults entry (a ConfigStore node) that gives types, not settings

# The annotations stay typing-module forms (Optional, List, Dict): OmegaConf reads them at runtime.


@dataclass
class DatasetSchema:
    """``dataset.*`` (conf/_base/dataset.yaml and conf/dataset/)."""
    root: Optional[str]
    train_ratio: float
    val_ratio: float
    image_size: int
    cache: str
    cache_dir: Optional[str]
    skip_corrupt: bool
    high_bit_depth: str
    bands: Any  # null, all, or a list of 1-based band indices or band names
    max_pixels: Optional[int]  # the most pixels of one band file (null: the default)
    download: bool
    name: str


@dataclass
class ModelSchema:
    """``model.*`` (conf/model/): options and loss differ per architecture; the model and the loss check them."""
    arch: str
    options: Dict[str, Any]
    loss: Dict[str, Any]


@dataclass
class BackboneSchema:
    """``backbone.*`` (conf/backbone/); ``pretrained``: false, true or a weights file."""
    name: str
    pretrained: Any


@dataclass
class LauncherSchema:
    """Where and how the workers start (conf/_base/launcher.yaml): every strategy's settings begin with these."""
    devices: Any
    slowdown: Any
    backend: str
    cpu_threads: Optional[int]
    timeout_s: float
    max_restarts: int


@dataclass
class AdaptiveSchema(LauncherSchema):
    """``trainer=adaptive`` (conf/trainer/adaptive.yaml)."""
    name: str
    merge_rounds: int
    merge_rounds_max: Optional[int]
    merge_cost_max: Optional[float]
    share_min: Optional[int]
    batch_min: int
    batch_max: int
    batch_multiple: Any
    ref_batch: Optional[int]
    damping: float
    deadband: float
    speed_ema: float
    warmup_intervals: int
    merge_weight: str
    elastic: float
    leave_out: bool
    probe_timeout_s: float
    lose_worker: Optional[List[int]]  # SIMULATED loss: [rank, epoch, interval]
    log_intervals: bool


@dataclass
class SyncSchema(LauncherSchema):
    """``trainer=sync`` (conf/trainer/sync.yaml)."""
    name: str
    batch_min: int
    interval_steps: int


@dataclass
class StaticSchema(LauncherSchema):
    """``trainer=static`` (conf/trainer/static.yaml)."""
    name: str
    batch_min: int
    batch_max: int
    batch_multiple: Any
    interval_steps: int


@dataclass
class LocalSgdSchema(LauncherSchema):
    """``trainer=local_sgd`` (conf/trainer/local_sgd.yaml)."""
    name: str
    average_every: int
    ref_batch: Optional[int]
    torch_averager: bool
    batch_min: int


@dataclass
class AugmentSchema:
    """``augment.*``: ``crop_scale`` is null or [min, max]; ``on_device`` auto, true or false."""
    crop_scale: Any
    color_jitter: float
    on_device: Any


@dataclass
class OptimizerSchema:
    """``optimizer.*``."""
    name: str
    lr: float
    momentum: float
    weight_decay: float


@dataclass
class LrScheduleSchema:
    """``lr_schedule.*``."""
    name: str
    warmup_epochs: float
    milestones: List[float]
    gamma: float
    min_lr_ratio: float


@dataclass
class LogSchema:
    """``log.*``."""
    attention_every: int
    attention_images: Optional[int]
    embedding_images: int
    figure_format: str
    progress_bar: bool
    background_writes: Any  # auto, true or false


@dataclass
class TrainSchema:
    """rsnet-train's config (conf/config.yaml); the trainer's keys depend on the strategy (its own schema)."""
    dataset: DatasetSchema
    model: ModelSchema
    backbone: BackboneSchema
    trainer: Any
    seed: int
    epochs: int
    batch_size: int
    eval_batch_size: Any  # auto (sized for each worker's device) or a whole number
    eval_every: int
    augment: AugmentSchema
    optimizer: OptimizerSchema
    lr_schedule: LrScheduleSchema
    amp: str
    eval_amp: str
    channels_last: bool
    compile: bool
    deterministic: bool
    prefetch: bool
    log: LogSchema
    max_grad_norm: Optional[float]
    run_dir: str
    resume: bool
    overwrite: bool


TRAINER_SCHEMAS = {"adaptive": AdaptiveSchema, "sync": SyncSchema, "static": StaticSchema,
                   "local_sgd": LocalSgdSchema}


def register_schemas() -> None:
    """Store the schemas in Hydra's ConfigStore (idempotent). Only rsnet-train registers them: Hydra copies the
    whole store whenever it lists config groups, which slows every other command's ``--help``."""
    store = ConfigStore.instance()
    store.store(name=PRIMARY_SCHEMA, node=TrainSchema)
    for name, schema in TRAINER_SCHEMAS.items():
        store.store(group="trainer", name=f"{name}{SCHEMA_SUFFIX}", node=schema)


def type_error(error: ValidationError) -> str:
    """One line for a value the schema refuses: ``optimizer.lr='abc': must be a number``."""
    annotation = _annotation(error)
    if is_dataclass(annotation) or get_origin(annotation) in (dict, Dict):
        return (f"{error.full_key}={error.value!r}: {error.full_key} holds settings; set one of them "
                f"({error.full_key}.<key>=value)")
    return f"{error.full_key}={error.value!r}: must be {_wanted(annotation)}"


def _annotation(error: ValidationError) -> Any:
    """The type the schema gives the refused value: a field of the node's dataclass, else found from the top
    (a list's item: ``lr_schedule.milestones[0]``)."""
    schema, key = error.object_type, str(error.key)
    if is_dataclass(schema) and key in {item.name for item in fields(schema)}:
        return get_type_hints(schema)[key]
    annotation: Any = TrainSchema
    for part in re.findall(r"[^.\[\]]+", str(error.full_key)):
        if is_dataclass(annotation):
            annotation = get_type_hints(annotation).get(part, Any)
        elif get_origin(annotation) in (list, List) and part.isdigit():
            annotation = get_args(annotation)[0]
        else:
            return Any
    return annotation


def _wanted(annotation: Any) -> str:
    """What a value of ``annotation`` is, in words: "a whole number", "a number or null", "a list of numbers"."""
    if get_origin(annotation) is Union:
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        return f"{_wanted(inner[0])} or null"
    if get_origin(annotation) in (list, List):
        return f"a list of {_wanted(get_args(annotation)[0]).removeprefix('a ').removeprefix('an ')}s"
    words = {int: "a whole number", float: "a number", bool: "true or false", str: "a text"}
    return words.get(annotation, f"of type {getattr(annotation, '__name__', annotation)}")
