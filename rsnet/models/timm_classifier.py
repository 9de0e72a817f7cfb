"""The timm classifier behind every backbone, from ``backbone.name`` and ``backbone.pretrained``: the name checked
without downloading anything, the weights from timm, a hub or a file, and every failure one :class:`BackboneError`
line that says what failed, why and what to do (docs/models.md, Names and weights)."""

from __future__ import annotations

import difflib
import pickle
import re
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from rsnet.integrity import unreadable_reason, without_pickle_protocol_warning
from rsnet.run_folders import parse_pretrained

# a run of more than five quoted keys in a state-dict error ("a", "b", ...): cut to the first five
_KEY_RUN = re.compile(r'((?:"[^"]*", ){5})(?:"[^"]*", )+')


class BackboneError(ValueError):
    """A backbone name, weights file or input size rsnet cannot use."""


def _one_line(error: BaseException, limit: int = 600) -> str:
    """``error`` as one short line; a long list of quoted state-dict keys keeps its first five."""
    text = " ".join(_KEY_RUN.sub(r"\1... ", str(error)).split())
    return f"{type(error).__name__}: {text if len(text) <= limit else text[:limit] + ' ...'}"


def _check_name(name: str) -> None:
    """Refuse a ``backbone.name`` that ``timm.create_model`` cannot resolve (nothing is downloaded here)."""
    if not isinstance(name, str):
        raise BackboneError(f"backbone.name must be a string, got {name!r}")
    try:
        source, model_id = timm.models.parse_model_name(name)
    except ValueError as error:  # a path or repo id without its source prefix, an unknown prefix
        raise BackboneError(f"backbone.name={name!r}: {error}") from error
    if source == "local-dir" and not (Path(model_id) / "config.json").is_file():
        raise BackboneError(f"backbone.name={name!r}: {Path(model_id) / 'config.json'} does not exist; local-dir: "
                            f"takes a folder written by timm.models.save_for_hf (config.json + model.safetensors)")
    if source is None:
        _check_registry_name(name)


def _check_registry_name(name: str) -> None:
    """A timm architecture, optionally with a weights tag (``resnet50.a1_in1k``); typos get close matches."""
    arch, tag = timm.models.split_model_name_tag(name)
    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models(), n=8, cutoff=0.5)
        raise BackboneError(
            f"unknown backbone.name={name!r}; the papers' backbones are vgg16, resnet50, densenet121 (resnet18 and "
            f"test_resnet for quick runs); any timm model name works, also with a weights tag (resnet50.a1_in1k), "
            f"hf-hub:org/name or local-dir:/path/to/folder"
            + (f"; did you mean one of {close}?" if close else "; see timm.list_models()"))
    if tag:
        try:
            timm.models.get_pretrained_cfg(name, allow_unregistered=False)
        except RuntimeError as error:
            close = difflib.get_close_matches(name, timm.list_pretrained(f"{arch}.*"), n=8, cutoff=0.5)
            raise BackboneError(
                f"backbone.name={name!r}: {arch} has no weights tag {tag!r}"
                + (f"; did you mean one of {close}?" if close else f"; see timm.list_pretrained('{arch}.*')")
            ) from error


def _model_hint(name: str) -> str:
    """What to do when timm cannot fetch the config or weights of ``name``."""
    source, model_id = timm.models.parse_model_name(name)
    if source == "local-dir":
        return f"{model_id} needs config.json and model.safetensors as timm.models.save_for_hf writes them"
    folder = timm.models.safe_model_name(name)
    return (f"without internet, save the model on a machine with access (timm.models.save_for_hf(timm.create_model("
            f"{name!r}, pretrained=True), {folder!r}, safe_serialization=True)), copy the folder here and set "
            f"backbone.name=local-dir:/path/to/{folder}")


def _create(name: str, failure: str, hint: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model(name, **kwargs)``; a failure is one BackboneError line: what failed, why, what to do."""
    try:
        with without_pickle_protocol_warning():
            return timm.create_model(name, **kwargs)
    except Exception as error:  # noqa: BLE001 - hub, file and state-dict errors come in many types
        raise BackboneError(f"{failure} ({_weights_reason(name, error)}); {hint}") from error


def _weights_reason(name: str, error: Exception) -> str:
    """Why timm could not build ``name``, in one line; where torch refused the weights and advises loading them
    unsafely (``weights_only=False``, which would run code from the file), what is wrong with the file instead."""
    if "weights_only" not in str(error):
        return _one_line(error)
    weights = Path(name.removeprefix("local-dir:")) / "pytorch_model.bin"
    if name.startswith("local-dir:") and weights.is_file():
        return f"{weights}: {unreadable_reason(weights)}"
    return "its weights file holds Python objects other than tensors and plain values (rsnet loads weights only)"


def _create_from_file(name: str, num_classes: int, path: Path, **kwargs: Any) -> nn.Module:
    """Load a weights file through timm so the model's own checkpoint filter applies (``source="file"``: a
    local-dir: or hf-hub: name reads the file, not its folder or repo); strict, then the classifier is replaced."""
    if not path.is_file():
        raise BackboneError(f"backbone.pretrained={path} does not exist; set false, true or the path of a weights "
                            f"file for backbone.name={name!r}")
    hint = (f"expected a state dict (.pth or .safetensors) of timm.create_model({name!r}) or of torchvision's model "
            f"of that name, with the class count of its pretrained config (1000 for ImageNet; for another, save the "
            f"model with timm.models.save_for_hf and use backbone.name=local-dir:<folder>)")
    try:
        with without_pickle_protocol_warning():
            net = timm.create_model(name, pretrained=True,
                                    pretrained_cfg_overlay={"file": str(path), "source": "file"}, **kwargs)
    except Exception as error:  # noqa: BLE001 - file, unpickling and state-dict errors come in many types
        # torch's unpickling errors advise weights_only=False (running code from the file): say what is wrong instead
        unreadable = isinstance(error, (pickle.UnpicklingError, EOFError)) or "weights_only" in str(error)
        reason = unreadable_reason(path) if unreadable and path.suffix != ".safetensors" else _one_line(error)
        raise BackboneError(f"backbone.pretrained={path} does not load into backbone.name={name!r} ({reason}); "
                            f"{hint}") from error
    if net.num_classes != num_classes:
        net.reset_classifier(num_classes)
    return net


def create_timm_classifier(name: str, num_classes: int, pretrained: bool | str | Path = False,
                           **kwargs: Any) -> nn.Module:
    """``timm.create_model(name, num_classes=...)`` with ``backbone.pretrained`` = false | true | a weights file."""
    _check_name(name)
    pretrained = parse_pretrained(pretrained)
    if isinstance(pretrained, Path):
        return _create_from_file(name, num_classes, pretrained, **kwargs)
    failure = (f"backbone.pretrained=true: could not load the weights of backbone.name={name!r}" if pretrained
               else f"could not build backbone.name={name!r}")
    return _create(name, failure, _model_hint(name), pretrained=pretrained, num_classes=num_classes, **kwargs)


def meta_model(name: str) -> nn.Module:
    """The timm model of ``name`` on the meta device: its layout and pretrained config, no weights."""
    _check_name(name)
    with torch.device("meta"):
        return _create(name, f"could not build backbone.name={name!r}", _model_hint(name), pretrained=False)
