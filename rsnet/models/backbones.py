"""timm backbones split into trunk (up to S3), S4 and the classifier head: the backbone is the full timm classifier
(``self.net``), so the main branch loads into a plain timm classifier (docs/models.md)."""

from __future__ import annotations

import copy
import difflib
import pickle
import re
from pathlib import Path
from typing import Any, Iterator

import timm
import torch
from timm.data import resolve_model_data_config
from torch import Tensor, nn

from rsnet.integrity import unreadable_reason, without_pickle_protocol_warning

# children of timm models that belong to forward_head, not forward_features
HEAD_MODULE_NAMES = ("global_pool", "head_drop", "fc", "classifier", "head", "pre_logits", "fc_norm", "flatten")
# a run of more than five quoted keys in a state-dict error ("a", "b", ...): cut to the first five
_KEY_RUN = re.compile(r'((?:"[^"]*", ){5})(?:"[^"]*", )+')


class BackboneError(ValueError):
    """A backbone name, weights file or input size rsnet cannot use."""


def _ordered_children(module: nn.Module, targets: list[str], prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """Children in execution order, expanded wherever a feature level lies strictly inside one."""
    for name, child in module.named_children():
        path = prefix + name
        if any(target.startswith(path + ".") for target in targets):
            yield from _ordered_children(child, targets, path + ".")
        else:
            yield path, child


def _has_params(modules: list[nn.Module]) -> bool:
    return any(True for module in modules for _ in module.parameters())


def _level_layout(net: nn.Module) -> dict[str, Any]:
    """Module paths of trunk / S4 / tail / head and the S1..S4 level names, channels, reductions."""
    info = getattr(net, "feature_info", None)
    if not info:
        raise BackboneError(f"timm model {type(net).__name__} has no feature_info; rsnet needs a CNN with feature levels")
    info = [dict(level) for level in info]
    targets = [level["module"] for level in info]
    ordered = list(_ordered_children(net, targets))
    paths = [path for path, _ in ordered]
    head_start = next((i for i, path in enumerate(paths) if path.split(".")[0] in HEAD_MODULE_NAMES), len(paths))
    missing = [t for t in targets if t not in paths[:head_start]]
    if missing:
        raise BackboneError(f"cannot locate feature levels {missing} of {type(net).__name__} among its children")
    index = {path: i for i, path in enumerate(paths)}
    kept, previous = [], -1
    for level in info:
        position = index[level["module"]]
        if kept and not _has_params([m for _, m in ordered[previous + 1: position + 1]]):
            previous = position  # parameter-free stage (a lone pooling): merged into what follows
            continue
        kept.append({**level, "index": position})
        previous = position
    if len(kept) < 4:
        raise BackboneError(f"{type(net).__name__} has {len(kept)} feature levels with parameters; rsnet needs 4")
    levels = kept[-4:]
    s3, s4 = levels[2]["index"], levels[3]["index"]
    return {
        "ordered": ordered,
        "trunk": list(range(0, s3 + 1)),
        "stage4": list(range(s3 + 1, s4 + 1)),
        "tail": list(range(s4 + 1, head_start)),
        "levels": [level["module"] for level in levels],
        "channels": [int(level["num_chs"]) for level in levels],
        "reductions": [int(level["reduction"]) for level in levels],
        "max_reduction": max(int(level["reduction"]) for level in info),
    }


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
                + (f"; did you mean one of {close}?" if close else f"; see timm.list_pretrained('{arch}.*')")) from error


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


def _parse_pretrained(pretrained: bool | str | Path | None) -> bool | Path:
    """``backbone.pretrained`` as False, True or the path of a weights file ("true" / "false" strings too)."""
    if isinstance(pretrained, str) and pretrained.strip().lower() in ("true", "false", ""):
        return pretrained.strip().lower() == "true"
    if isinstance(pretrained, bool) or not pretrained:
        return bool(pretrained)
    return Path(pretrained).expanduser()


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
    pretrained = _parse_pretrained(pretrained)
    if isinstance(pretrained, Path):
        return _create_from_file(name, num_classes, pretrained, **kwargs)
    failure = (f"backbone.pretrained=true: could not load the weights of backbone.name={name!r}" if pretrained
               else f"could not build backbone.name={name!r}")
    return _create(name, failure, _model_hint(name), pretrained=pretrained, num_classes=num_classes, **kwargs)


class TimmBackbone(nn.Module):
    """A timm classifier run in pieces: ``trunk`` (S1..S3), ``stage4``, ``head_map``, ``head``."""

    def __init__(self, name: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 verify: bool = True, in_chans: int = 3) -> None:
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        self.name = name
        self.in_chans = int(in_chans)
        # in_chans: timm adapts pretrained RGB filters of the first convolution to that many bands
        self.net = create_timm_classifier(name, num_classes, pretrained, drop_rate=drop_rate,
                                          **({"in_chans": in_chans} if in_chans != 3 else {}))
        layout = _level_layout(self.net)
        ordered = layout["ordered"]
        self.level_names: list[str] = layout["levels"]
        self.channels: list[int] = layout["channels"]
        self.reductions: list[int] = layout["reductions"]
        self._trunk = [ordered[i] for i in layout["trunk"]]
        self._stage4 = [ordered[i][1] for i in layout["stage4"]]
        self._tail = [ordered[i][1] for i in layout["tail"]]
        self._trunk_levels = set(self.level_names[:3])
        pre_logits = getattr(self.net, "pre_logits", None)
        self._pre_logits = pre_logits if isinstance(pre_logits, nn.Module) and _has_params([pre_logits]) else None
        if verify:
            self._verify()

    def _verify(self) -> None:
        """One small eval forward: the piecewise path must equal timm's own forward exactly."""
        size = 64
        x = torch.randn(1, self.in_chans, size, size, generator=torch.Generator().manual_seed(0))
        was_training = self.training
        self.eval()
        with torch.no_grad():
            reference = self.net(x)
            levels = self.trunk(x)
            ours = self.head(self.head_map(self.stage4(levels[-1])))
        self.train(was_training)
        # on the meta device (the up-front config check builds models there) only the shapes can be compared
        same = reference.shape == ours.shape if reference.is_meta else torch.allclose(reference, ours, atol=1e-5,
                                                                                        rtol=1e-4)
        if not same:
            raise BackboneError(f"backbone {self.name!r}: timm's forward is not the plain sequence of its children "
                                "that rsnet splits into trunk/S4/head; use a CNN such as resnet*, densenet*, vgg*")

    def trunk(self, x: Tensor) -> list[Tensor]:
        """Run up to S3; returns [S1, S2, S3]."""
        outputs = []
        for path, module in self._trunk:
            x = module(x)
            if path in self._trunk_levels:
                outputs.append(x)
        return outputs

    def stage4(self, s3: Tensor) -> Tensor:
        for module in self._stage4:
            s3 = module(s3)
        return s3

    def head_map(self, s4: Tensor) -> Tensor:
        """The map the classifier globally pools (S4 itself, or VGG's ConvMlp output)."""
        for module in self._tail:
            s4 = module(s4)
        return self._pre_logits(s4) if self._pre_logits is not None else s4

    def head(self, head_map: Tensor) -> Tensor:
        if self._pre_logits is not None:
            return self.net.head(head_map)
        return self.net.forward_head(head_map)

    @property
    def classifier(self) -> nn.Linear:
        return self.net.get_classifier()

    def stage4_copy(self) -> nn.Sequential:
        """An independent copy of S4 (same architecture, initialised from the current weights)."""
        return nn.Sequential(*(copy.deepcopy(module) for module in self._stage4))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def _meta_model(name: str) -> nn.Module:
    """The timm model of ``name`` on the meta device: its layout and pretrained config, no weights."""
    _check_name(name)
    with torch.device("meta"):
        return _create(name, f"could not build backbone.name={name!r}", _model_hint(name), pretrained=False)


def backbone_layout(name: str) -> dict[str, Any]:
    """Levels, channels and reductions of a backbone without allocating its weights."""
    layout = _level_layout(_meta_model(name))
    return {key: layout[key] for key in ("levels", "channels", "reductions", "max_reduction")}


def backbone_data_config(name: str) -> dict[str, Any]:
    """Preprocessing (mean, std, input_size, interpolation, crop_pct, crop_mode) that the weights ``name``
    selects expect, from their pretrained config, no weights loaded (docs/models.md, Names and weights)."""
    config = resolve_model_data_config(_meta_model(name))
    return {"mean": tuple(float(v) for v in config["mean"]), "std": tuple(float(v) for v in config["std"]),
            "input_size": tuple(int(v) for v in config["input_size"]), "interpolation": str(config["interpolation"]),
            "crop_pct": float(config["crop_pct"]), "crop_mode": str(config["crop_mode"])}


def validate_image_size(backbone: str, image_size: int) -> None:
    """Raise ValueError when ``backbone`` cannot take square inputs of ``image_size`` pixels."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    minimum = backbone_layout(backbone)["max_reduction"]
    if image_size < minimum:
        raise ValueError(f"image_size {image_size} is too small for backbone {backbone!r}: it downsamples "
                         f"{minimum}x, so inputs need at least {minimum} px (224 is the papers' size)")
