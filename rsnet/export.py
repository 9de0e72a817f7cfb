"""Export a trained model (its main branch, or the full ensemble) with its metadata, and load it back.

    from rsnet.export import export_checkpoint, load_exported
    result = export_checkpoint("run/checkpoints/best.pt", "exported/", format="torchscript", head="main")
    model = load_exported("exported/")          # callable: images (B, 3, H, W) -> logits (B, N)
    model.class_names, model.image_size, model.mean, model.std

``head="main"`` writes the pruned main branch, a plain ``timm.create_model(backbone, num_classes=N)``
classifier; ``head="ensemble"`` writes the full multi-branch model returning its ensemble logits.
Files: ``model.ts`` (TorchScript), ``model.onnx`` (ONNX, opset 17, dynamic batch) or ``model.pt``
(a state dict), always with ``model.json`` (class names, image size, mean/std, backbone, ...).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor, nn

from rsnet.engine.checkpoint import load_checkpoint, model_from_checkpoint
from rsnet.models import build_model
from rsnet.models.prune import extract_main_branch

FORMATS = {"torchscript": "model.ts", "onnx": "model.onnx", "state_dict": "model.pt"}
HEADS = ("main", "ensemble")
METADATA_FILE = "model.json"
EXPORT_VERSION = 1


class ExportError(ValueError):
    """A checkpoint or exported file rsnet cannot use, explained."""


class EnsembleLogits(nn.Module):
    """The full model returning one logits tensor: its ensemble head (main when it has none)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x).prediction_logits


def is_exported_model(path: str | Path) -> bool:
    """True for what export wrote (its folder, model.ts/.onnx/.json, or a model.pt beside model.json);
    False for a training checkpoint."""
    path = Path(path)
    return path.is_dir() or path.suffix in (".ts", ".onnx", ".json") or (path.parent / METADATA_FILE).is_file()


def model_from_training_checkpoint(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load a checkpoint and rebuild its model (eval mode), with clear errors for files that don't fit."""
    checkpoint = load_checkpoint(path)
    try:
        return model_from_checkpoint(checkpoint, source=path), checkpoint
    except ValueError as error:
        raise ExportError(str(error)) from error


@dataclass
class ExportResult:
    path: Path
    metadata_path: Path
    max_abs_diff: float | None
    metadata: dict[str, Any]


def _reference_batch(image_size: int, batch_size: int, seed: int) -> Tensor:
    return torch.randn(batch_size, 3, image_size, image_size, generator=torch.Generator().manual_seed(seed))


def export_model(model: nn.Module, out_dir: str | Path, metadata: dict[str, Any], format: str = "torchscript",
                 head: str = "main", batch_size: int = 2, seed: int = 0) -> ExportResult:
    """Export ``model`` (an rsnet model) and check the exported logits against the full model's."""
    if format not in FORMATS:
        raise ExportError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    if head not in HEADS:
        raise ExportError(f"head must be one of {HEADS}, got {head!r}")
    if format == "onnx":
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as error:
            raise ExportError(f"ONNX export needs the onnx packages ({error}); install them with "
                              "pip install -e .[onnx]") from error
    model = model.eval()
    config = model.model_config
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FORMATS[format]
    image_size = int(metadata["image_size"])
    x = _reference_batch(image_size, batch_size, seed)
    module = extract_main_branch(model) if head == "main" else EnsembleLogits(model).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jit deprecation notices and tracer warnings about constant shapes
        output = model(x)
        reference = output.main_logits if head == "main" else output.prediction_logits
        if format == "torchscript":
            scripted = torch.jit.trace(module, x, check_trace=False)
            scripted.save(str(path))
        elif format == "onnx":
            try:
                torch.onnx.export(module, (x,), str(path), input_names=["images"], output_names=["logits"],
                                  dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                                  dynamo=False)
            except Exception as error:  # noqa: BLE001 - exporter failures come in many types
                raise ExportError(
                    f"ONNX cannot express this model at {image_size} px ({type(error).__name__}; typically an "
                    "adaptive pooling whose grid does not divide the feature map, as in MGML-FENet's 4x4 grids); "
                    "use format=torchscript or format=state_dict") from error
        else:
            torch.save(module.state_dict() if head == "main" else model.state_dict(), path)
    meta = {
        "rsnet_export": EXPORT_VERSION, "format": format, "head": head, "file": path.name,
        "class_names": list(metadata["class_names"]), "image_size": image_size,
        "mean": [float(v) for v in metadata["mean"]], "std": [float(v) for v in metadata["std"]],
        "backbone": config["backbone"], "num_classes": int(config["num_classes"]), "arch": config["arch"],
        "model_config": {**config, "pretrained": False},
    }
    metadata_path = out_dir / METADATA_FILE
    metadata_path.write_text(json.dumps(meta, indent=2))
    diff = None
    try:
        exported = load_exported(out_dir)
    except ExportError:
        exported = None  # ONNX without onnxruntime: written and checked structurally only
        import onnx

        onnx.checker.check_model(onnx.load(str(path)))
    if exported is not None:
        with torch.no_grad():
            diff = float((exported(x) - reference).abs().max())
    meta["max_abs_diff"] = diff
    metadata_path.write_text(json.dumps(meta, indent=2))
    return ExportResult(path=path, metadata_path=metadata_path, max_abs_diff=diff, metadata=meta)


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, format: str = "torchscript", head: str = "main",
                      batch_size: int = 2, seed: int = 0) -> ExportResult:
    """Read a training checkpoint and export its main branch (or full ensemble) to ``out_dir``."""
    model, payload = model_from_training_checkpoint(checkpoint)
    return export_model(model, out_dir, payload, format=format, head=head, batch_size=batch_size, seed=seed)


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
    candidates = [path / METADATA_FILE] if path.is_dir() else [path, path.parent / METADATA_FILE]
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
    if not file.is_file():
        raise FileNotFoundError(f"{file} (named by {metadata_path}) does not exist")
    fmt = meta["format"]
    if fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return ExportedModel(torch.jit.load(str(file), map_location=map_location).eval(), meta)
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
    module.load_state_dict(state)
    return ExportedModel(module.eval(), meta)
