"""Reading what ``rsnet-export`` wrote: an export folder's model.json, its model file in one of four formats
(TorchScript, ONNX, a state_dict, a timm folder), checked against the SHA-256 model.json records. Writing exports
is :mod:`rsnet.export`'s job."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor, nn

from rsnet.checkpoint import DIGEST_KEY
from rsnet.integrity import file_digest
from rsnet.models import build_model

log = logging.getLogger(__name__)

FORMATS = {"torchscript": "model.ts", "onnx": "model.onnx", "state_dict": "model.pt",
           "timm": "model.safetensors"}  # timm: with its config.json
TIMM_CONFIG = "config.json"  # beside model.safetensors in a timm export
METADATA_FILE = "model.json"


class ExportError(ValueError):
    """A checkpoint or exported file rsnet cannot use, explained."""


class EnsembleLogits(nn.Module):
    """The full model returning one logits tensor: its ensemble head (main when it has none)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x).prediction_logits


def names_export_file(path: Path) -> bool:
    """True when the model.json beside ``path`` describes an export whose model file is ``path``."""
    try:
        meta = json.loads((path.parent / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("file") == path.name


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
