"""A trained model on disk: training checkpoints (written, read, rebuilt) and exports (read), and the one
:func:`load_model` that turns a ``checkpoint=``/``model=`` path into a model and its preprocessing.

A file is that file (a checkpoint, or an export's model file / model.json); a folder is a run (its
``checkpoints/best.pt``, else ``last.pt``), a checkpoints folder, or an export folder. Writing exports is
:mod:`rsnet.export`'s job; training writes checkpoints through :func:`save_checkpoint`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor, nn

from rsnet.data.decode import DEFAULT_HIGH_BIT_DEPTH
from rsnet.files import atomic_write
from rsnet.integrity import content_digest, file_digest, unreadable_reason
from rsnet.models import build_model

log = logging.getLogger(__name__)

FORMATS = {"torchscript": "model.ts", "onnx": "model.onnx", "state_dict": "model.pt",
           "timm": "model.safetensors"}  # timm: with its config.json
TIMM_CONFIG = "config.json"  # beside model.safetensors in a timm export
METADATA_FILE = "model.json"
CHECKPOINT_NAMES = ("best.pt", "last.pt")  # a run's checkpoints, in order of preference
CHECKPOINT_FORMAT = 2  # 2: with the SHA-256 of its contents (DIGEST_KEY); 1: without (loaded, with a warning)
DIGEST_KEY = "sha256"
REQUIRED_KEYS = ("format_version", "model_config", "model_state", "class_names", "image_size", "mean", "std")


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (temp file in the same folder, then rename); a full disk raises
    :class:`rsnet.files.DiskFullError` and leaves the previous file as it was."""
    contents = {key: value for key, value in payload.items() if key != DIGEST_KEY}  # a loaded checkpoint's is stale
    contents["format_version"] = CHECKPOINT_FORMAT
    contents[DIGEST_KEY] = content_digest(contents)
    with atomic_write(path) as handle:
        torch.save(contents, handle)
    return Path(path)


def run_checkpoint_path(run_dir: str | Path, name: str = "last.pt") -> Path:
    """Where a run keeps a checkpoint: ``<run_dir>/checkpoints/<name>`` (``last.pt``, or ``best.pt``)."""
    return Path(run_dir) / "checkpoints" / name


def last_checkpoint(run_dir: str | Path) -> tuple[Path, int] | None:
    """A run's ``checkpoints/last.pt`` and the epoch it holds (its tensors mapped, not read), or None if the run
    has written none."""
    last = run_checkpoint_path(run_dir)
    if not last.is_file():
        return None
    return last, load_checkpoint(last, mmap=True)["epoch"]


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False,
                    verify: bool | None = None) -> dict[str, Any]:
    """Load an rsnet checkpoint, with a clear error when the file is missing, damaged (its contents no longer match
    the SHA-256 written with them) or not one of ours. ``mmap``: map the tensors from the file instead of reading
    them (cheap when only the metadata, e.g. the config or epoch, is needed). ``verify``: check the SHA-256
    (default: unless ``mmap``, which would read every tensor for it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist; pass the path of a run's checkpoints/last.pt or best.pt")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ValueError(f"{path} cannot be read as an rsnet checkpoint: {unreadable_reason(path)}{_REPLACE}") \
            from error
    if not isinstance(payload, dict) or any(key not in payload for key in REQUIRED_KEYS):
        missing = [key for key in REQUIRED_KEYS if not isinstance(payload, dict) or key not in payload]
        raise ValueError(f"{path} is not an rsnet training checkpoint (missing {missing}); "
                         "export and evaluation need a file written by scripts/train.py")
    if (not mmap) if verify is None else verify:
        _verify_digest(path, payload)
    return payload


_REPLACE = ("; if it is a run's last.pt, resume from another copy or start the run again (overwrite=true); a best.pt "
            "can be rebuilt only by training")


def _verify_digest(path: Path, payload: dict[str, Any]) -> None:
    """Refuse a checkpoint whose contents differ from the digest written with them (a flipped bit, a damaged
    copy); warn once for one written before checkpoints carried a digest."""
    stored = payload.get(DIGEST_KEY)
    if stored is None:
        if payload["format_version"] >= 2:
            raise ValueError(f"{path} has lost its content hash ({DIGEST_KEY}): the file was altered{_REPLACE}")
        log.warning("%s was written by an rsnet without content hashes: its weights cannot be verified", path)
        return
    contents = {key: value for key, value in payload.items() if key != DIGEST_KEY}
    if content_digest(contents) != stored:
        raise ValueError(f"{path} is damaged: its contents do not match the SHA-256 written with them (a changed "
                         f"bit on disk or in a copy){_REPLACE}")


def model_from_checkpoint(checkpoint: dict[str, Any], source: str | Path = "the checkpoint") -> nn.Module:
    """Rebuild the trained model from a loaded checkpoint (eval mode, no pretrained download).

    Raises ``ValueError`` naming ``source`` when the model config is incomplete, the class names do not match
    ``num_classes``, or the weights do not fit the model the config names.
    """
    config = checkpoint["model_config"]
    if not isinstance(config, dict) or not {"arch", "backbone", "num_classes"} <= set(config):
        raise ValueError(f"{source}: model_config {config!r} lacks arch/backbone/num_classes; not an rsnet checkpoint")
    classes = list(checkpoint["class_names"])
    if len(classes) != config["num_classes"]:
        raise ValueError(f"{source}: class-count mismatch: {len(classes)} class names but the model has "
                         f"num_classes={config['num_classes']}")
    model = build_model(**{**config, "pretrained": False})
    state = checkpoint["model_state"]
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = sorted(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                        for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or mismatched:
        raise ValueError(
            f"{source}: the weights do not fit the model it names (arch={config['arch']}, "
            f"backbone={config['backbone']}, num_classes={config['num_classes']}); missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, shape mismatches {mismatched[:5]} — is it a checkpoint of another model?")
    model.load_state_dict(state)
    return model.eval()


class ExportError(ValueError):
    """A checkpoint or exported file rsnet cannot use, explained."""


class EnsembleLogits(nn.Module):
    """The full model returning one logits tensor: its ensemble head (main when it has none)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x).prediction_logits


@dataclass(frozen=True)
class ModelSource:
    """What a ``checkpoint=``/``model=`` path resolved to: a checkpoint file, or an export (file or model.json)."""

    path: Path
    kind: str  # "checkpoint" or "export"
    note: str = ""  # how a folder was resolved, for the log

    def __str__(self) -> str:
        return f"{self.kind} {self.path}" + (f" ({self.note})" if self.note else "")


def names_export_file(path: Path) -> bool:
    """True when the model.json beside ``path`` describes an export whose model file is ``path``."""
    try:
        meta = json.loads((path.parent / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("file") == path.name


def _run_checkpoint(folder: Path) -> ModelSource | None:
    """best.pt (else last.pt) of a run folder's checkpoints/ or of a checkpoints folder itself."""
    candidates = [run_checkpoint_path(folder, name) for name in CHECKPOINT_NAMES]
    for path in [*candidates, *(folder / name for name in CHECKPOINT_NAMES)]:
        if path.is_file():
            note = f"the best checkpoint of {folder}" if path.name == "best.pt" else \
                f"the last checkpoint of {folder}: it has no best.pt"
            return ModelSource(path, "checkpoint", note)
    return None


def resolve_model_path(path: str | Path, setting: str = "checkpoint") -> ModelSource:
    """Decide what ``path`` (the value of ``setting``) means; a file is never swapped for one beside it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{setting}={path} does not exist; pass a checkpoint file (.pt), a run folder or an "
                                "exported model folder")
    if path.is_file():
        exported = path.suffix in (".json", ".ts", ".onnx") or names_export_file(path)
        return ModelSource(path, "export" if exported else "checkpoint")
    export = path / METADATA_FILE if (path / METADATA_FILE).is_file() else None
    checkpoint = _run_checkpoint(path)
    if export is not None and checkpoint is not None:
        raise ValueError(f"{setting}={path} holds both training checkpoints and an export ({METADATA_FILE}); pass "
                         f"the file you mean: {setting}={checkpoint.path} or {setting}={export}")
    if export is not None:
        return ModelSource(export, "export")
    if checkpoint is not None:
        return checkpoint
    raise FileNotFoundError(f"{setting}={path} holds no model: pass a run folder (with checkpoints/best.pt or "
                            f"last.pt), a checkpoint file or an exported model folder (with {METADATA_FILE})")


def model_from_training_checkpoint(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load a checkpoint and rebuild its model (eval mode), with clear errors for files that don't fit."""
    checkpoint = load_checkpoint(path)
    try:
        return model_from_checkpoint(checkpoint, source=path), checkpoint
    except ValueError as error:
        raise ExportError(str(error)) from error


class ExportedModel(nn.Module):
    """An exported model: ``model(images) -> logits`` with ``.metadata`` (class names, size, mean/std)."""

    def __init__(self, module: nn.Module | None, metadata: dict[str, Any], session: Any = None) -> None:
        super().__init__()
        self.module = module
        self.session = session
        self.metadata = metadata

    class_names = property(lambda self: list(self.metadata["class_names"]))
    image_size = property(lambda self: int(self.metadata["image_size"]))
    mean = property(lambda self: list(self.metadata["mean"]))
    std = property(lambda self: list(self.metadata["std"]))

    def forward(self, x: Tensor) -> Tensor:
        if self.session is not None:
            (logits,) = self.session.run(["logits"], {"images": x.detach().cpu().float().numpy()})
            return torch.from_numpy(logits).to(x.device)
        return self.module(x)


def _find_metadata(path: Path) -> Path:
    if path.is_dir():
        candidates = [path / METADATA_FILE]
    elif path.name == TIMM_CONFIG:  # a timm export's config.json: its model.json is beside it
        candidates = [path.parent / METADATA_FILE]
    else:
        candidates = [path, path.parent / METADATA_FILE]
    for candidate in candidates:
        if candidate.suffix == ".json" and candidate.is_file():
            return candidate
    raise ExportError(f"{path}: no {METADATA_FILE} found; pass a folder written by scripts/export_main_branch.py")


def load_exported(path: str | Path, map_location: str | torch.device = "cpu") -> ExportedModel:
    """Load what ``export_model`` wrote (its folder, model file or model.json)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"exported model {path} does not exist")
    metadata_path = _find_metadata(path)
    try:
        meta = json.loads(metadata_path.read_text())
    except json.JSONDecodeError as error:
        raise ExportError(f"{metadata_path} is not valid JSON ({error})") from error
    if not isinstance(meta, dict) or "rsnet_export" not in meta or meta.get("format") not in FORMATS:
        raise ExportError(f"{metadata_path} is not the metadata of an rsnet export")
    file = metadata_path.parent / meta["file"]
    own_files = export_files(meta)
    if path.is_file() and path != metadata_path and path.name not in own_files:
        raise ExportError(f"{path} is not an exported model ({metadata_path} describes {file})")
    if not file.is_file():
        raise FileNotFoundError(f"{file} (named by {metadata_path}) does not exist")
    _verify_export_files(metadata_path, meta, own_files)
    exported = _load_export_module(file, meta, map_location)
    _check_output_size(exported, metadata_path)
    return exported


def export_files(meta: dict[str, Any]) -> tuple[str, ...]:
    """The files an export's model.json describes (timm: the weights and timm's config.json)."""
    return (meta["file"], TIMM_CONFIG) if meta["format"] == "timm" else (meta["file"],)


def _verify_export_files(metadata_path: Path, meta: dict[str, Any], files: tuple[str, ...]) -> None:
    """Refuse an export whose files differ from the SHA-256 recorded in its model.json (damaged, or another
    export's file put beside it); warn for an export written before model.json recorded them."""
    recorded = meta.get(DIGEST_KEY)
    if not isinstance(recorded, dict):
        log.warning("%s records no SHA-256 of its files (an export of an older rsnet): they cannot be verified; "
                    "export again to add them", metadata_path)
        return
    for name in files:
        if recorded.get(name) != file_digest(metadata_path.parent / name):
            raise ExportError(f"{metadata_path.parent / name} does not match the SHA-256 that {metadata_path} records "
                              "for it: the file was damaged or replaced after the export (e.g. by another export's "
                              "file); export the checkpoint again")


def _check_output_size(exported: ExportedModel, metadata_path: Path) -> None:
    """The model must score as many classes as model.json names (else every label it prints would be wrong)."""
    meta = exported.metadata
    size = int(meta["image_size"])
    device = next(iter(exported.parameters()), torch.zeros(0)).device  # an ONNX session takes CPU tensors
    with torch.no_grad():
        outputs = int(exported(torch.zeros(1, 3, size, size, device=device)).shape[-1])
    named = len(meta["class_names"])
    recorded = (int(meta.get("num_classes", named)), int(meta.get("output_size", outputs)))
    if outputs != named or recorded != (named, outputs):
        raise ExportError(f"{metadata_path} names {named} classes (num_classes={meta.get('num_classes')}) but "
                          f"{meta['file']} scores {outputs}: the model file and its model.json do not belong "
                          "together; export the checkpoint again")


def _load_export_module(file: Path, meta: dict[str, Any], map_location: str | torch.device) -> ExportedModel:
    """The model in an export's ``file`` as an :class:`ExportedModel` (torchscript, timm, onnx or state_dict)."""
    fmt = meta["format"]
    if fmt == "torchscript":
        return ExportedModel(torch.jit.load(str(file), map_location=map_location).eval(), meta)
    if fmt == "timm":
        timm_log = logging.getLogger("timm")
        level = timm_log.level
        timm_log.setLevel(logging.WARNING)  # not three INFO lines ("Loading pretrained weights ...") every load
        try:
            model = timm.create_model(f"local-dir:{file.parent.resolve()}", pretrained=True)
        finally:
            timm_log.setLevel(level)
        return ExportedModel(model.eval(), meta)
    if fmt == "onnx":
        try:
            import onnxruntime
        except ImportError as error:
            raise ExportError(f"running {file} needs onnxruntime (pip install onnxruntime)") from error
        return ExportedModel(None, meta, session=onnxruntime.InferenceSession(str(file)))
    state = torch.load(file, map_location=map_location, weights_only=True)
    if meta["head"] == "main":
        module: nn.Module = timm.create_model(meta["backbone"], pretrained=False, num_classes=meta["num_classes"])
    else:
        module = EnsembleLogits(build_model(**meta["model_config"]))
        state = {f"model.{k}": v for k, v in state.items()}
    try:
        module.load_state_dict(state)
    except RuntimeError as error:  # weights of another model beside this model.json
        reason = (str(error).strip().splitlines() or [""])[0][:200]
        raise ExportError(f"the weights in {file} do not fit the model its model.json describes ({reason}); "
                          "export the checkpoint again") from error
    return ExportedModel(module.eval(), meta)


@dataclass
class LoadedModel:
    """A model ready to run: ``model(images)`` gives a MultiBranchOutput (checkpoint) or logits (export)."""

    model: nn.Module
    source: ModelSource
    metadata: dict[str, Any]  # class_names, image_size, mean, std (an export: all of its model.json)
    train_config: dict[str, Any] | None = None  # a checkpoint's training config
    epoch: int | None = None


def load_model(path: str | Path, device: str | torch.device = "cpu", setting: str = "checkpoint") -> LoadedModel:
    """The one way from a ``checkpoint=``/``model=`` path to a model on ``device`` (see :func:`resolve_model_path`)."""
    source = resolve_model_path(path, setting)
    if source.kind == "export":
        exported = load_exported(source.path, map_location=device)
        return LoadedModel(exported.to(device), source, dict(exported.metadata))
    model, checkpoint = model_from_training_checkpoint(source.path)
    metadata = {key: checkpoint[key] for key in ("class_names", "image_size", "mean", "std")}
    dataset = (checkpoint.get("config") or {}).get("dataset") or {}
    metadata["high_bit_depth"] = dataset.get("high_bit_depth", DEFAULT_HIGH_BIT_DEPTH)  # how its images were decoded
    return LoadedModel(model.to(device), source, metadata, checkpoint.get("config"), checkpoint.get("epoch"))
