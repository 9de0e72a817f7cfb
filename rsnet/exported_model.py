"""Reading what ``rsnet-export`` wrote: model.json and its model file (TorchScript, ONNX, a state_dict, a timm folder),
checked against the SHA-256s model.json records; nothing outside the export's folder is read."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor, nn

from rsnet.checkpoint import DIGEST_KEY, check_normalisation
from rsnet.integrity import file_digest, load_weights, unreadable_reason
from rsnet.models import build_model
from rsnet.models.main_branch import main_branch_classifier, main_heads_of, main_pool_of

log = logging.getLogger(__name__)

FORMATS = {"torchscript": "model.ts", "onnx": "model.onnx", "state_dict": "model.pt",
           "timm": "model.safetensors"}  # timm: with its config.json
TIMM_CONFIG = "config.json"  # beside model.safetensors in a timm export
METADATA_FILE = "model.json"  # also the key of ``sha256`` under which model.json records its own contents' digest
OUTSIDE_NAME_CHARS = (":", "/", "\\")  # a backbone name holding one is read from a folder or a hub (timm's sources)


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
    beside = [path.parent / METADATA_FILE]  # a timm export's config.json: its model.json is beside it
    candidates = [path / METADATA_FILE] if path.is_dir() else beside if path.name == TIMM_CONFIG else [path, *beside]
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
    except ValueError as error:  # also bytes that are not UTF-8
        raise ExportError(f"{metadata_path} is not valid JSON ({error})") from error
    if not isinstance(meta, dict) or not isinstance(meta.get("rsnet_export"), int) or meta.get("format") not in FORMATS:
        raise ExportError(f"{metadata_path} is not the metadata of an rsnet export")
    _verify_metadata(metadata_path, meta)
    _check_self_contained(metadata_path, meta)
    file = metadata_path.parent / meta["file"]
    own_files = export_files(meta)
    if path.is_file() and path != metadata_path and path.name not in own_files:
        raise ExportError(f"{path} is not an exported model ({metadata_path} describes {file})")
    if not file.is_file():
        raise FileNotFoundError(f"{file} (named by {metadata_path}) does not exist")
    _verify_export_files(metadata_path, meta, own_files)
    if meta["format"] == "timm":
        _check_timm_config(metadata_path, meta)
    check_normalisation(meta.get("mean"), meta.get("std"), int((meta.get("model_config") or {}).get("in_chans", 3)),
                        metadata_path)
    exported = _load_export_module(file, meta, map_location)
    _check_output_size(exported, metadata_path)
    return exported


def export_files(meta: dict[str, Any]) -> tuple[str, ...]:
    """The files an export's model.json describes (timm: the weights and timm's config.json)."""
    return (meta["file"], TIMM_CONFIG) if meta["format"] == "timm" else (meta["file"],)


def metadata_digest(meta: dict[str, Any]) -> str:
    """SHA-256 of everything a model.json holds but this digest itself (``sha256["model.json"]``), as canonical JSON."""
    recorded = meta.get(DIGEST_KEY)
    files = {name: digest for name, digest in recorded.items() if name != METADATA_FILE} \
        if isinstance(recorded, dict) else recorded
    contents = {**meta, DIGEST_KEY: files}
    return hashlib.sha256(json.dumps(contents, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _verify_metadata(metadata_path: Path, meta: dict[str, Any]) -> None:
    """Refuse a model.json changed after the export; one of rsnet_export 2, which has no digest of itself, warns."""
    recorded = meta.get(DIGEST_KEY)
    if not isinstance(recorded, dict):
        return  # an export of an older rsnet, which recorded no SHA-256: _verify_export_files warns
    if METADATA_FILE not in recorded:
        if meta["rsnet_export"] >= 3:
            raise ExportError(f"{metadata_path} has lost the SHA-256 of its own contents (sha256 has no "
                              f"{METADATA_FILE!r}): the file was edited; restore it from the export or export the "
                              "checkpoint again")
        log.warning("%s records no SHA-256 of its own contents (an export of an older rsnet): its class names, "
                    "mean/std and image size cannot be verified; export again to add it", metadata_path)
        return
    if recorded[METADATA_FILE] != metadata_digest(meta):
        raise ExportError(f"{metadata_path} was changed after the export: its contents do not match the SHA-256 it "
                          f"records for them (sha256[{METADATA_FILE!r}]), and its class names, mean/std and image size "
                          "decide every answer; restore it from the export or export the checkpoint again")


def _check_self_contained(metadata_path: Path, meta: dict[str, Any]) -> None:
    """Refuse a model.json that would make rsnet open a file outside the export (a model file, weights, a backbone)."""
    expected = FORMATS[meta["format"]]
    if meta.get("file") != expected:
        raise ExportError(f"{metadata_path} names the file {meta.get('file')!r}; an export's model file is {expected} "
                          "in its own folder: the file was edited; export the checkpoint again")
    config = meta.get("model_config")
    config = config if isinstance(config, dict) else {}
    if config.get("pretrained") not in (None, False):
        raise ExportError(f"{metadata_path} names backbone weights {config['pretrained']!r} (model_config.pretrained) "
                          f"outside the export, whose weights are its own {expected}: the file was edited; export "
                          "the checkpoint again")
    for backbone in (meta.get("backbone"), config.get("backbone")):
        if backbone is not None and (not isinstance(backbone, str) or any(c in backbone for c in OUTSIDE_NAME_CHARS)):
            raise ExportError(f"{metadata_path} names the backbone {backbone!r}, a model outside the export (an "
                              "export is rebuilt from a timm architecture name and its own files only): export the "
                              "checkpoint again")


def _check_timm_config(metadata_path: Path, meta: dict[str, Any]) -> None:
    """Refuse a timm export's model.json whose class names, mean/std or image size differ from its config.json's."""
    config_path = metadata_path.parent / TIMM_CONFIG
    try:
        config = json.loads(config_path.read_text())
        data = config["pretrained_cfg"]
        theirs = (list(config["label_names"]), [float(v) for v in data["mean"]], [float(v) for v in data["std"]],
                  int(data["input_size"][-1]))
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise ExportError(f"{config_path} is not the config.json of an rsnet timm export ({type(error).__name__}: "
                          f"{error}); export the checkpoint again") from error
    ours = (list(meta["class_names"]), [float(v) for v in meta["mean"]], [float(v) for v in meta["std"]],
            int(meta["image_size"]))
    differ = [name for name, mine, its in zip(("class names", "mean", "std", "image size"), ours, theirs)
              if mine != its]
    if differ:
        raise ExportError(f"{metadata_path} does not agree with {config_path}, the hashed timm config of the same "
                          f"export ({', '.join(differ)} differ): model.json was edited; restore it from the export or "
                          "export the checkpoint again")


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, at most 200 characters."""
    return (str(error).strip().splitlines() or [""])[0][:200]


def _read(file: Path, kind: str, read: Callable[[], Any]) -> Any:
    """``read()``, or one line for a model file its library cannot read (damaged, or another kind of file)."""
    try:
        return read()
    except Exception as error:  # noqa: BLE001 - each library reports a bad file as several error types
        reason = (first_line(error) or type(error).__name__).split(". ")[0]
        raise ExportError(f"{file} cannot be read as {kind} ({reason}): the file is damaged or not the one the export "
                          "wrote; export the checkpoint again") from error


def _verify_export_files(metadata_path: Path, meta: dict[str, Any], files: tuple[str, ...]) -> None:
    """Refuse an export whose files differ from the SHA-256 its model.json records; warn where it records none."""
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
        channels = int(meta.get("model_config", {}).get("in_chans", 3))
        outputs = int(exported(torch.zeros(1, channels, size, size, device=device)).shape[-1])
    named = len(meta["class_names"])
    recorded = (int(meta.get("num_classes", named)), int(meta.get("output_size", outputs)))
    if outputs != named or recorded != (named, outputs):
        raise ExportError(f"{metadata_path} names {named} classes (num_classes={meta.get('num_classes')}) but "
                          f"{meta['file']} scores {outputs}: the model file and its model.json do not belong "
                          "together; export the checkpoint again")


def _load_export_module(file: Path, meta: dict[str, Any], map_location: str | torch.device) -> ExportedModel:
    """The model in an export's ``file`` as an :class:`ExportedModel`; only the export's own files are read."""
    fmt = meta["format"]
    if fmt == "torchscript":
        return ExportedModel(_read(file, "a TorchScript model",
                                   lambda: torch.jit.load(str(file), map_location=map_location).eval()), meta)
    if fmt == "onnx":
        try:
            import onnxruntime
        except ImportError as error:
            raise ExportError(f"running {file} needs onnxruntime (pip install onnxruntime)") from error
        return ExportedModel(None, meta, session=_read(file, "an ONNX model",
                                                       lambda: onnxruntime.InferenceSession(str(file))))
    if fmt == "timm":
        import safetensors.torch

        state = _read(file, "safetensors", lambda: safetensors.torch.load_file(file))
        module = timm.create_model(f"local-dir:{file.parent.resolve()}", pretrained=False)  # reads its config.json
    else:
        try:
            state = load_weights(file, map_location=map_location)
        except Exception as error:  # noqa: BLE001 - any unpickling failure means "not the export's weights"
            raise ExportError(f"{file} cannot be read as the export's state dict: {unreadable_reason(file)}; export "
                              "the checkpoint again") from error
        if not isinstance(state, dict) or not all(isinstance(value, Tensor) for value in state.values()):
            raise ExportError(f"{file} holds no state dict (names of tensors); export the checkpoint again")
        if meta["head"] == "main":  # timm.create_model(backbone, num_classes=N), pooled as the model was trained
            config = meta.get("model_config") or {}
            module = main_branch_classifier(meta["backbone"], meta["num_classes"], main_pool_of(config),
                                            int(config.get("in_chans") or 3), main_heads_of(config))
        else:
            module = EnsembleLogits(build_model(**buildable_config(meta)))
            state = {f"model.{k}": v for k, v in state.items()}
    try:
        module.load_state_dict(state)
    except RuntimeError as error:  # weights of another model beside this model.json
        raise ExportError(f"the weights in {file} do not fit the model its model.json describes ({first_line(error)}); "
                          "export the checkpoint again") from error
    return ExportedModel(module.eval(), meta)


def buildable_config(meta: dict[str, Any]) -> dict[str, Any]:
    """The ``build_model`` arguments of an export's full model: its model_config, never with backbone weights."""
    return {**meta["model_config"], "pretrained": False}
