"""timm backbones split into trunk (up to S3), S4 and the classifier head: the backbone is the full timm classifier
(``self.net``), so the main branch loads into a plain timm classifier (docs/models.md)."""

from __future__ import annotations

import copy
from typing import Any, Iterator

import torch
from timm.data import resolve_model_data_config
from torch import Tensor, nn

from rsnet.models.pooling import check_main_pool, pool_holder, pool_spatial_terms, set_main_pool
from rsnet.models.timm_classifier import BackboneError, create_timm_classifier, meta_model

# children of timm models that belong to forward_head, not forward_features
HEAD_MODULE_NAMES = ("global_pool", "head_drop", "fc", "classifier", "head", "pre_logits", "fc_norm", "flatten")


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
        raise BackboneError(f"timm model {type(net).__name__} has no feature_info; "
                            "rsnet needs a CNN with feature levels")
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



class TimmBackbone(nn.Module):
    """A timm classifier run in pieces: ``trunk`` (S1..S3), ``stage4``, ``head_map``, ``head``; ``main_pool`` other
    than avg replaces its global pool and widens its classifier (:func:`set_main_pool`)."""

    def __init__(self, name: str, num_classes: int, pretrained: bool | str = False, drop_rate: float = 0.0,
                 verify: bool = True, in_chans: int = 3, main_pool: str = "avg") -> None:
        super().__init__()
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        self.name = name
        self.in_chans = int(in_chans)
        self.main_pool = check_main_pool(main_pool)
        # in_chans: timm adapts pretrained RGB filters of the first convolution to that many bands
        self.net = create_timm_classifier(name, num_classes, pretrained, drop_rate=drop_rate,
                                          **({"in_chans": in_chans} if in_chans != 3 else {}))
        set_main_pool(self.net, main_pool, name)
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
        """The map the classifier pools (S4 itself, or VGG's ConvMlp output)."""
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

    @property
    def pool(self) -> nn.Module | None:
        """The module that pools ``head_map`` into the classifier where ``main_pool`` set it; None for timm's own
        global average (not registered here a second time: the state dict keeps the keys timm's model gives it)."""
        return None if self.main_pool == "avg" else pool_holder(self.net).global_pool

    def cam_inputs(self, head_map: Tensor) -> Tensor:
        """(B, D, h, w) maps whose means over the map are the classifier's D inputs (:func:`pool_spatial_terms`):
        ``head_map`` itself under the global average."""
        pool = self.pool
        return head_map if pool is None else pool_spatial_terms(pool, head_map)

    def stage4_copy(self) -> nn.Sequential:
        """An independent copy of S4 (same architecture, initialised from the current weights)."""
        return nn.Sequential(*(copy.deepcopy(module) for module in self._stage4))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)




def backbone_layout(name: str) -> dict[str, Any]:
    """Levels, channels and reductions of a backbone without allocating its weights."""
    layout = _level_layout(meta_model(name))
    return {key: layout[key] for key in ("levels", "channels", "reductions", "max_reduction")}


def backbone_data_config(name: str) -> dict[str, Any]:
    """Preprocessing (mean, std, input_size, interpolation, crop_pct, crop_mode) that the weights ``name``
    selects expect, from their pretrained config, no weights loaded (docs/models.md, Names and weights)."""
    config = resolve_model_data_config(meta_model(name))
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
