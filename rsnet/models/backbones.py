"""timm backbones split into trunk (up to S3), S4 and the classifier head.

The backbone *is* the full timm classifier ``timm.create_model(name, num_classes=N)`` stored as
``self.net``; rsnet only records which of its children form the trunk, S4, the tail of
``forward_features`` and the head. Because the weights live under one prefix (``net.``), the main
branch of every rsnet model loads into a plain timm classifier without any key remapping.

Levels: timm's ``feature_info`` lists the model's feature levels. A level whose stage has no
parameters (VGG's last max-pool, ``features.30``) is merged into the tail, so S1..S4 are the last
four levels that end in learned layers:

* resnet*: S1..S4 = layer1..layer4 (strides 4..32);
* densenet121: S1 = denseblock1 ... S3 = denseblock3, S4 = transition3 + denseblock4 + norm5;
* vgg16: S1..S4 = relu of conv2_2, conv3_3, conv4_3, conv5_3 (strides 2..16); the last
  max-pool, timm's ConvMlp (fc6 as a 7x7 conv, fc7) and fc form the main head, exactly as in timm.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Iterator

import timm
import torch
from torch import Tensor, nn

# children of timm models that belong to forward_head, not forward_features
HEAD_MODULE_NAMES = ("global_pool", "head_drop", "fc", "classifier", "head", "pre_logits", "fc_norm", "flatten")


class BackboneError(ValueError):
    """A backbone name, weights file or input size rsnet cannot use."""


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not timm.is_model(name):
        names = timm.list_models()
        close = difflib.get_close_matches(str(name), names, n=8, cutoff=0.5)
        raise BackboneError(
            f"unknown backbone {name!r}; the papers' backbones are vgg16, resnet50, densenet121 "
            f"(resnet18 and test_resnet for quick runs); any timm model name works"
            + (f"; did you mean one of {close}?" if close else "; see timm.list_models()"))


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


def _unwrap_state_dict(payload: Any) -> dict[str, Tensor]:
    if isinstance(payload, dict):
        for key in ("state_dict", "model", "model_state", "state_dict_ema"):
            if key in payload and isinstance(payload[key], dict):
                payload = payload[key]
                break
    if not isinstance(payload, dict) or not all(isinstance(v, Tensor) for v in payload.values()):
        raise BackboneError("not a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in payload.items()}


def load_local_weights(net: nn.Module, path: str | Path, backbone: str) -> None:
    """Load a local timm state dict into ``net``; the classifier is skipped when its class count differs."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise BackboneError(f"pretrained weights file {path} does not exist (pretrained=false|true|<path to a "
                            f"state dict of timm.create_model({backbone!r})>)")
    try:
        state = _unwrap_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except BackboneError as error:
        raise BackboneError(f"weights file {path} is {error}; expected torch.save(timm.create_model("
                            f"{backbone!r}).state_dict())") from error
    except Exception as error:  # noqa: BLE001 - unreadable file of any kind
        raise BackboneError(f"weights file {path} could not be read ({error})") from error
    own = net.state_dict()
    classifier = net.get_classifier()
    classifier_keys = {f"{_module_path(net, classifier)}.{suffix}" for suffix in ("weight", "bias")}
    state = {k: v for k, v in state.items()
             if not (k in classifier_keys and k in own and own[k].shape != v.shape)}
    missing = sorted(k for k in own if k not in state and k not in classifier_keys)
    unexpected = sorted(k for k in state if k not in own)
    mismatched = sorted(f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                        for k in state if k in own and state[k].shape != own[k].shape)
    if missing or unexpected or mismatched:
        def short(items: list[str]) -> str:
            return ", ".join(items[:6]) + (f" (+{len(items) - 6} more)" if len(items) > 6 else "")
        details = "; ".join(part for part in (
            f"missing keys: {short(missing)}" if missing else "",
            f"unexpected keys: {short(unexpected)}" if unexpected else "",
            f"shape mismatches: {short(mismatched)}" if mismatched else "") if part)
        raise BackboneError(f"weights file {path} does not fit timm backbone {backbone!r}: {details}")
    net.load_state_dict(state, strict=False)


def _module_path(root: nn.Module, target: nn.Module) -> str:
    for name, module in root.named_modules():
        if module is target:
            return name
    raise BackboneError("classifier not found in the timm model")


def create_timm_classifier(name: str, num_classes: int, pretrained: bool | str = False, **kwargs: Any) -> nn.Module:
    """``timm.create_model(name, num_classes=...)`` with rsnet's pretrained semantics (bool or local path)."""
    _check_name(name)
    if isinstance(pretrained, str) and pretrained.lower() in ("true", "false", ""):
        pretrained = pretrained.lower() == "true"
    if pretrained is True:
        try:
            return timm.create_model(name, pretrained=True, num_classes=num_classes, **kwargs)
        except Exception as error:  # noqa: BLE001 - hub/network errors come in many types
            raise BackboneError(
                f"could not load timm's ImageNet weights for {name!r} ({type(error).__name__}: {error}); "
                f"without internet access, download them on another machine "
                f"(torch.save(timm.create_model({name!r}, pretrained=True).state_dict(), '{name}.pth')) and pass "
                f"pretrained=/path/to/{name}.pth") from error
    net = timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs)
    if pretrained:
        load_local_weights(net, pretrained, name)
    return net


class TimmBackbone(nn.Module):
    """A timm classifier run in pieces: ``trunk`` (S1..S3), ``stage4``, ``head_map``, ``head``."""

    def __init__(self, name: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 verify: bool = True) -> None:
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        self.name = name
        self.net = create_timm_classifier(name, num_classes, pretrained, drop_rate=drop_rate)
        layout = _level_layout(self.net)
        ordered = layout["ordered"]
        self.level_names: list[str] = layout["levels"]
        self.channels: list[int] = layout["channels"]
        self.reductions: list[int] = layout["reductions"]
        self._trunk = [(path, ordered[i][1]) for i, path in
                       ((i, ordered[i][0]) for i in layout["trunk"])]
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
        x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
        was_training = self.training
        self.eval()
        with torch.no_grad():
            reference = self.net(x)
            levels = self.trunk(x)
            ours = self.head(self.head_map(self.stage4(levels[-1])))
        self.train(was_training)
        if not torch.allclose(reference, ours, atol=1e-5, rtol=1e-4):
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


def backbone_layout(name: str) -> dict[str, Any]:
    """Levels, channels and reductions of a backbone without allocating its weights."""
    _check_name(name)
    with torch.device("meta"):
        net = timm.create_model(name, pretrained=False)
    layout = _level_layout(net)
    return {key: layout[key] for key in ("levels", "channels", "reductions", "max_reduction")}


def validate_image_size(backbone: str, image_size: int) -> None:
    """Raise ValueError when ``backbone`` cannot take square inputs of ``image_size`` pixels."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    minimum = backbone_layout(backbone)["max_reduction"]
    if image_size < minimum:
        raise ValueError(f"image_size {image_size} is too small for backbone {backbone!r}: it downsamples "
                         f"{minimum}x, so inputs need at least {minimum} px (224 is the papers' size)")
