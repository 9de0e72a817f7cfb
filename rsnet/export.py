"""Export a trained model (its main branch, or the full ensemble) with its metadata (model.json), loaded back and its
logits checked against the full model's (docs/models.md, Export)."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import timm
import torch
from timm.models import load_model_config_from_hf, parse_model_name
from timm.models._hub import load_model_config_from_path
from timm.models._input import get_model_args
from torch import Tensor, nn

from rsnet.data.decode import DEFAULT_HIGH_BIT_DEPTH
from rsnet.files import atomic_write, check_writable_dir, write_json
from rsnet.models import build_model
from rsnet.run_folders import pretrained_tag
from rsnet.models.pooling import TIMM_MAIN_POOLS
from rsnet.models.main_branch import baseline_from_main_branch, extract_main_branch, main_heads_of, main_pool_of
from rsnet.integrity import file_digest
from rsnet.checkpoint import DIGEST_KEY
from rsnet.exported_model import (FORMATS, METADATA_FILE, TIMM_CONFIG, EnsembleLogits, ExportError, ExportedModel,
                                  buildable_config, export_files, first_line, load_exported, metadata_digest,
                                  names_export_file)
from rsnet.model_loading import ModelSource, model_from_training_checkpoint, noted_for_its_run, resolve_model_path

ONNX_OPSET = 18
HEADS = ("main", "ensemble")
EXPORT_VERSION = 3  # 3: model.json records the SHA-256 of its own contents; 2: of each file, and the output size
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")


@dataclass
class ExportResult:
    """The written model file and model.json, and how far the export's logits are from the full model's."""

    path: Path
    metadata_path: Path
    max_abs_diff: float | None
    metadata: dict[str, Any]
    source: ModelSource | None = None  # the checkpoint exported, when export_checkpoint resolved it


def _reference_batch(image_size: int, batch_size: int, seed: int, channels: int = 3) -> Tensor:
    return torch.randn(batch_size, channels, image_size, image_size, generator=torch.Generator().manual_seed(seed))


def _checkpoints_in(folder: Path) -> list[Path]:
    """Checkpoint-like files in ``folder`` and its checkpoints/ (a previous export's own model.pt excepted)."""
    found = [p for where in (folder, folder / "checkpoints") if where.is_dir() for p in sorted(where.iterdir())
             if p.suffix in CHECKPOINT_SUFFIXES and p.is_file()]
    return [p for p in found if not (p.parent == folder and names_export_file(p))]


def check_export_dir(out_dir: Path) -> None:
    """Refuse an ``out=`` that would overwrite or shadow a training checkpoint, or that cannot be written."""
    base = out_dir.parent if out_dir.is_file() else out_dir
    suggestion = (base.parent if base.name == "checkpoints" else base) / "export"
    if out_dir.is_file():
        kind = "a training checkpoint" if out_dir.suffix in CHECKPOINT_SUFFIXES else "a file"
        raise ExportError(f"out={out_dir} is {kind}; out= names the folder the export is written to (never a "
                          f"checkpoint): pass another path, e.g. out={suggestion}")
    if found := _checkpoints_in(out_dir):
        raise ExportError(f"out={out_dir} holds training checkpoints ({', '.join(p.name for p in found[:4])}); an "
                          f"export there would overwrite or shadow them: pass another path, e.g. out={suggestion}")
    check_writable_dir(out_dir, "out")


def _save_torchscript(handle: IO[bytes], module: nn.Module, x: Tensor) -> None:
    """Trace ``module`` at ``x``'s size and save it; torch's own deprecation notices about jit stay visible."""
    with warnings.catch_warnings():
        # Shape comparisons in the heads (e.g. "pool when the branch's map differs from S4's") are traced as
        # constants: right at the traced image size, which model.json records and predict/evaluate resize to.
        warnings.filterwarnings("ignore", message="Converting a tensor to a Python boolean",
                                category=torch.jit.TracerWarning)
        traced = torch.jit.trace(module, x, check_trace=False)
    torch.jit.save(traced, handle)


def _onnx_bytes(module: nn.Module, x: Tensor) -> bytes:
    """``module`` as an ONNX model (dynamo exporter, dynamic batch), or an ExportError saying what to use instead."""
    batch = torch.export.Dim("batch", min=1)
    try:  # the exporter prints its passes ("[torch.onnx] Obtain model graph ... ✅", a page of them): kept quiet
        with contextlib.redirect_stdout(io.StringIO()):
            program = torch.onnx.export(module, (x,), dynamo=True, input_names=["images"], output_names=["logits"],
                                        dynamic_shapes=({0: batch},), opset_version=ONNX_OPSET, verbose=False)
    except Exception as error:  # noqa: BLE001 - exporter failures come in many types
        raise ExportError(f"ONNX (torch.export) cannot express this model at {x.shape[-1]} px ({type(error).__name__}: "
                          f"{first_line(error)}); use format=torchscript or format=state_dict") from error
    return program.model_proto.SerializeToString()


# what timm's pretrained config says of its published weights: true of an export only where training started from them
PUBLISHED_WEIGHTS_KEYS = ("tag", "license", "origin_url", "paper_ids", "paper_name", "notes")


def started_from_published_weights(model: nn.Module, metadata: dict[str, Any]) -> bool:
    """Whether training started from timm's published weights (``backbone.pretrained=true``), as the checkpoint's
    model config records it (a rebuilt model's own says false), else the model's."""
    config = metadata.get("model_config") or model.model_config
    return pretrained_tag(config.get("pretrained")) == "pretrained"


def _without_published_weights(config_path: Path) -> None:
    """Drop from a timm config.json what its pretrained config says of timm's published weights (tag, license, ...)."""
    config = json.loads(config_path.read_text())
    for key in PUBLISHED_WEIGHTS_KEYS:
        config["pretrained_cfg"].pop(key, None)
    config_path.write_text(json.dumps(config, indent=2))


def _save_timm(module: nn.Module, out_dir: Path, metadata: dict[str, Any], published_weights: bool) -> None:
    """Write the main branch the timm way (``save_for_hf``: model.safetensors + config.json), each file atomically;
    the weights' tag and license only where training started from those ``published_weights``."""
    from timm.models import save_for_hf

    size = int(metadata["image_size"])
    channels = len(metadata["mean"])  # a band per normalisation entry
    data_config = {"input_size": (channels, size, size), "mean": tuple(metadata["mean"]), "std": tuple(metadata["std"]),
                   "crop_pct": 1.0, "crop_mode": "squash", "interpolation": "bilinear"}  # rsnet resizes the whole image
    with tempfile.TemporaryDirectory(prefix=".timm-", dir=out_dir) as staging:
        save_for_hf(module, staging, model_config={"label_names": list(metadata["class_names"])},
                    safe_serialization=True, data_config=data_config)
        if not published_weights:
            _without_published_weights(Path(staging) / TIMM_CONFIG)
        for name in (FORMATS["timm"], TIMM_CONFIG):  # weights first: a config never names missing weights
            with atomic_write(out_dir / name) as handle:
                handle.write((Path(staging) / name).read_bytes())


def registry_backbone(name: str) -> str:
    """The timm architecture that a ``local-dir:`` or ``hf-hub:`` backbone builds (a registry name as it is), for
    model.json: an export is rebuilt from nothing outside its folder; model_args of its own are refused."""
    source, model_id = parse_model_name(name)
    if source is None:
        return name
    loader = load_model_config_from_path if source == "local-dir" else load_model_config_from_hf
    try:
        _, architecture, model_args = loader(model_id)
    except Exception as error:  # noqa: BLE001 - file and hub errors come in many types
        raise ExportError(f"cannot read the config.json of backbone.name={name!r} ({type(error).__name__}: "
                          f"{first_line(error)}); the export records the architecture it names") from error
    with torch.device("meta"):
        plain_args = get_model_args(timm.create_model(architecture))
    differ = {key: value for key, value in model_args.items() if key != "num_classes" and plain_args.get(key) != value}
    if differ:
        raise ExportError(f"backbone.name={name!r} builds {architecture} with model_args {differ}, which model.json "
                          "cannot record: an export needs a backbone that timm builds from its name alone")
    return architecture


def _write_model(out_dir: Path, module: nn.Module, model: nn.Module, x: Tensor, format: str, head: str,
                 metadata: dict[str, Any]) -> Path:
    """Write the exported ``module`` (a state dict of the ensemble: the full ``model``) in ``format``."""
    path = out_dir / FORMATS[format]
    if format == "timm":
        _save_timm(module, out_dir, metadata, started_from_published_weights(model, metadata))
        return path
    with atomic_write(path) as handle:
        if format == "torchscript":
            _save_torchscript(handle, module, x)
        elif format == "onnx":
            handle.write(_onnx_bytes(module, x))
        else:
            torch.save(module.state_dict() if head == "main" else model.state_dict(), handle)
    return path


def _write_metadata(path: Path, meta: dict[str, Any]) -> Path:
    """Write model.json with the SHA-256 of its own contents (``sha256["model.json"]``)."""
    meta[DIGEST_KEY][METADATA_FILE] = metadata_digest(meta)
    write_json(path, meta, indent=2)
    return path


def check_export_settings(format: str, head: str, main_pool: str = "avg", main_heads: Sequence[str] = ()) -> str:
    """The format to write (``auto`` resolved: timm for the main branch where timm builds it, else state_dict);
    a format or head rsnet cannot write or lacks packages for is refused, and so is format=timm for a main branch
    whose ``main_pool`` (the model's) timm cannot build from a config.json or that averages ``main_heads``."""
    timm_builds = main_pool in TIMM_MAIN_POOLS and not main_heads
    if format == "auto":
        format = "timm" if head == "main" and timm_builds else "state_dict"
    if format not in FORMATS:
        raise ExportError(f"format must be auto or one of {sorted(FORMATS)}, got {format!r}")
    if head not in HEADS:
        raise ExportError(f"head must be one of {HEADS}, got {head!r}")
    if format == "timm" and head != "main":
        raise ExportError("format=timm writes the main branch (a plain timm classifier); the ensemble is no timm "
                          "model: use head=main, or format=torchscript|onnx|state_dict for head=ensemble")
    if format == "timm" and main_pool not in TIMM_MAIN_POOLS:
        raise ExportError(f"format=timm writes a plain timm classifier, and timm has no pool for the model's "
                          f"model.options.main_pool={main_pool} (it builds {', '.join(TIMM_MAIN_POOLS)} only): use "
                          "format=state_dict (rsnet loads it), torchscript or onnx")
    if format == "timm" and head == "main" and main_heads:
        raise ExportError(f"format=timm writes a plain timm classifier, and this main branch also averages the heads "
                          f"model.options.main_heads={list(main_heads)}: use format=state_dict (rsnet loads it), "
                          "torchscript or onnx")
    if format == "onnx":
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as error:
            raise ExportError(f"ONNX export needs the onnx packages ({error}); install them with "
                              "pip install -e .[onnx]") from error
    return format


def _no_report(stage: str) -> None:
    """The default ``on_stage``: report nothing."""


EXPORT_STAGES = 4  # load the checkpoint, write, reload, compare logits: the calls of ``on_stage`` in one export


def export_model(model: nn.Module, out_dir: str | Path, metadata: dict[str, Any], format: str = "auto",
                 head: str = "main", batch_size: int = 2, seed: int = 0,
                 on_stage: Callable[[str], None] = _no_report) -> ExportResult:
    """Export ``model`` (an rsnet model) and check the exported logits against the full model's; ``on_stage`` is
    called with the name of each stage as it begins (a progress bar)."""
    config = model.model_config
    main_pool = main_pool_of(config)
    format = check_export_settings(format, head, main_pool, main_heads_of(config))
    out_dir = Path(out_dir)
    check_export_dir(out_dir)
    model = model.eval()
    backbone = registry_backbone(config["backbone"])
    image_size = int(metadata["image_size"])
    x = _reference_batch(image_size, batch_size, seed, int(config.get("in_chans", 3)))
    module = extract_main_branch(model) if head == "main" else EnsembleLogits(model).eval()
    on_stage(f"writing {format}")
    with torch.no_grad():
        output = model(x)
        reference = output.main_logits if head == "main" else output.prediction_logits
        path = _write_model(out_dir, module, model, x, format, head, metadata)
    meta = {"rsnet_export": EXPORT_VERSION, "format": format, "head": head, "file": path.name,
            "class_names": list(metadata["class_names"]), "image_size": image_size,
            "mean": [float(v) for v in metadata["mean"]], "std": [float(v) for v in metadata["std"]],
            "high_bit_depth": metadata.get("high_bit_depth", DEFAULT_HIGH_BIT_DEPTH),
            "backbone": backbone, "num_classes": int(config["num_classes"]), "arch": config["arch"],
            "main_pool": main_pool, "model_config": {**config, "backbone": backbone, "pretrained": False},
            "output_size": int(reference.shape[-1]),
            **({"bands": metadata["bands"]} if metadata.get("bands") else {}),
            **({"footprint": metadata["footprint"]} if metadata.get("footprint") else {}),
            DIGEST_KEY: {name: file_digest(out_dir / name)
                         for name in export_files({"format": format, "file": path.name})}}
    metadata_path = _write_metadata(out_dir / METADATA_FILE, meta)
    on_stage("reloading the export")
    try:
        exported = load_exported(out_dir)
    except ExportError:
        exported = None  # ONNX without onnxruntime: written and checked structurally only
        import onnx

        onnx.checker.check_model(onnx.load(str(path)))
    on_stage("comparing logits")
    with torch.no_grad():
        diff = None if exported is None else float((exported(x) - reference).abs().max())
    meta["max_abs_diff"] = diff
    _write_metadata(metadata_path, meta)
    return ExportResult(path=path, metadata_path=metadata_path, max_abs_diff=diff, metadata=meta)


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, format: str = "auto", head: str = "main",
                      batch_size: int = 2, seed: int = 0, on_stage: Callable[[str], None] = _no_report) -> ExportResult:
    """Export a training checkpoint (a file, or a run folder: its best.pt, else last.pt) to ``out_dir``;
    ``on_stage`` as in :func:`export_model`."""
    source = resolve_model_path(checkpoint)
    if source.kind == "export":
        raise ExportError(f"checkpoint={checkpoint} is an exported model, not a training checkpoint; export reads "
                          "a run's checkpoints/best.pt (or the run folder)")
    check_export_settings(format, head)
    on_stage("loading the checkpoint")
    model, payload = model_from_training_checkpoint(source.path)
    result = export_model(model, out_dir, payload, format=format, head=head, batch_size=batch_size, seed=seed,
                          on_stage=on_stage)
    result.source = noted_for_its_run(source, payload.get("config"))
    return result


def attention_model(exported: ExportedModel) -> nn.Module:
    """The export as an rsnet model for CAM / Grad-CAM, rebuilt from its own weights and checked to give its logits."""
    meta = exported.metadata
    if exported.module is None:
        raise ExportError(f"attention maps cannot be drawn from the ONNX export {meta['file']}: it keeps neither "
                          "gradients nor the layers' own weights (its batch norms are folded into the convolutions); "
                          "use the training checkpoint, or a format=torchscript|state_dict|timm export")
    state = exported.module.state_dict()
    device = next(iter(state.values())).device
    channels = int((meta.get("model_config") or {}).get("in_chans", 3))  # a multispectral model's bands
    try:
        if meta["head"] == "main":
            model = baseline_from_main_branch(state, meta["backbone"], int(meta["num_classes"]), channels,
                                              main_pool_of(meta.get("model_config")),
                                              main_heads_of(meta.get("model_config")))
        else:
            model = build_model(**buildable_config(meta)).eval()
            model.load_state_dict({key.removeprefix("model."): value for key, value in state.items()}, strict=True)
    except RuntimeError as error:  # weights that do not fit the architecture model.json names
        raise ExportError(f"the weights of {meta['file']} do not fit the model its model.json describes "
                          f"({meta['backbone']}: {first_line(error)}); use the checkpoint") from error
    model.to(device)
    x = _reference_batch(int(meta["image_size"]), 2, seed=0, channels=channels).to(device)
    with torch.no_grad():
        output, expected = model(x), exported(x)
    rebuilt = output.main_logits if meta["head"] == "main" else output.prediction_logits
    if not torch.allclose(rebuilt, expected, rtol=1e-2, atol=1e-3):
        raise ExportError(f"the model rebuilt from {meta['file']} for attention maps does not give the export's "
                          f"logits (max difference {float((rebuilt - expected).abs().max()):.3g}); use the checkpoint")
    return model


