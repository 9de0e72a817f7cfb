"""The one way from a ``checkpoint=``/``model=`` path to a model and its preprocessing (:func:`load_model`): a file is
that file; a folder is a run (its best.pt, else last.pt), a checkpoints folder, or an export folder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rsnet.checkpoint import (CHECKPOINT_NAMES, FILE_DIGEST_KEY, load_checkpoint, model_from_checkpoint,
                              run_checkpoint_path)
from rsnet.data.decode import DEFAULT_HIGH_BIT_DEPTH
from rsnet.data.specs import DATASETS
from rsnet.exported_model import METADATA_FILE, ExportError, load_exported, names_export_file


@dataclass(frozen=True)
class ModelSource:
    """What a ``checkpoint=``/``model=`` path resolved to: a checkpoint file, or an export (file or model.json)."""

    path: Path
    kind: str  # "checkpoint" or "export"
    note: str = ""  # how a folder was resolved, for the log

    def __str__(self) -> str:
        return f"{self.kind} {self.path}" + (f" ({self.note})" if self.note else "")


def _run_checkpoint(folder: Path) -> ModelSource | None:
    """best.pt (else last.pt) of a run folder's checkpoints/ or of a checkpoints folder itself."""
    candidates = [run_checkpoint_path(folder, name) for name in CHECKPOINT_NAMES]
    for path in [*candidates, *(folder / name for name in CHECKPOINT_NAMES)]:
        if path.is_file():
            which = "best" if path.name == "best.pt" else "last"
            return ModelSource(path, "checkpoint", f"the {which} checkpoint of {folder}")
    return None


def noted_for_its_run(source: ModelSource, config: Mapping[str, Any] | None) -> ModelSource:
    """``source`` with a run folder's missing best.pt named where the run validates (``config``'s dataset.val_ratio
    above 0); without a validation part (the default) last.pt is the run's model and nothing more is said."""
    val_ratio = ((config or {}).get("dataset") or {}).get("val_ratio") or 0
    if not source.note.startswith("the last checkpoint") or not val_ratio:
        return source
    return replace(source, note=f"{source.note}: it has no best.pt, though the run validates (dataset.val_ratio="
                                f"{val_ratio}): no validation has chosen an epoch yet")


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


def model_digest(path: str | Path, setting: str = "checkpoint") -> str:
    """A SHA-256 over the model ``path`` resolves to: its file, or every file of an export's folder (a map made with
    another model is not resumed)."""
    from rsnet.integrity import content_digest, file_digest

    source = resolve_model_path(path, setting)
    exported_folder = source.path.name == METADATA_FILE
    files = sorted(p for p in source.path.parent.iterdir() if p.is_file()) if exported_folder else [source.path]
    return content_digest([[file.name, file_digest(file)] for file in files])


def model_from_training_checkpoint(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load a checkpoint and rebuild its model (eval mode), with clear errors for files that don't fit."""
    checkpoint = load_checkpoint(path)
    try:
        return model_from_checkpoint(checkpoint, source=path), checkpoint
    except ValueError as error:
        raise ExportError(str(error)) from error


@dataclass
class LoadedModel:
    """A model ready to run: ``model(images)`` gives a MultiBranchOutput (checkpoint) or logits (export)."""

    model: nn.Module
    source: ModelSource
    metadata: dict[str, Any]  # class_names, image_size, mean, std, bands (an export: all of its model.json)
    train_config: dict[str, Any] | None = None  # a checkpoint's training config
    epoch: int | None = None
    sha256: str | None = None  # a checkpoint's: the SHA-256 of the bytes its model was loaded from


def load_model(path: str | Path, device: str | torch.device = "cpu", setting: str = "checkpoint") -> LoadedModel:
    """The one way from a ``checkpoint=``/``model=`` path to a model on ``device`` (see :func:`resolve_model_path`)."""
    source = resolve_model_path(path, setting)
    if source.kind == "export":
        exported = load_exported(source.path, map_location=device)
        return LoadedModel(exported.to(device), source, dict(exported.metadata))
    model, checkpoint = model_from_training_checkpoint(source.path)
    metadata = {key: checkpoint[key] for key in ("class_names", "image_size", "mean", "std")}
    metadata["bands"] = checkpoint.get("bands")  # a multispectral model's bands (None: RGB pictures)
    dataset = (checkpoint.get("config") or {}).get("dataset") or {}
    metadata["footprint"] = _footprint(checkpoint.get("footprint") or {}, dataset.get("name"))
    metadata["high_bit_depth"] = dataset.get("high_bit_depth", DEFAULT_HIGH_BIT_DEPTH)  # how its images were decoded
    return LoadedModel(model.to(device), noted_for_its_run(source, checkpoint.get("config")), metadata,
                       checkpoint.get("config"), checkpoint.get("epoch"), checkpoint[FILE_DIGEST_KEY])


def _footprint(recorded: dict[str, Any], dataset: str | None) -> dict[str, Any]:
    """A training image's size for maps of scenes, as the checkpoint records it; a run that predates a bundled
    dataset's ground resolution (``ucmerced_mini``'s) gets it from the dataset's spec."""
    spec = DATASETS.get(dataset or "")
    if recorded.get("metres") or not recorded.get("pixels") or spec is None or not spec.ground_resolution_m:
        return dict(recorded)
    return {**recorded, "metres": recorded["pixels"] * spec.ground_resolution_m,
            "source": f"{dataset}'s {spec.ground_resolution_m:g} m pixels"}
