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
import torch.nn.functional as F
from timm.data import resolve_model_data_config
from timm.layers import ClassifierHead, SelectAdaptivePool2d
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


# ---------------------------------------------------------------------------------------------- the main pool

# How the main branch pools its map into its classifier (``model.options.main_pool``; docs/models.md, "The main
# branch's pooling"): avg is timm's own global average (every checkpoint and export without the setting); gem a
# generalised mean with a learnable exponent; avgmax the global average and the global max side by side (timm's
# ``catavgmax``: twice the classifier's inputs); grid2 the averages of a 2 x 2 grid (four times its inputs).
MAIN_POOLS = ("avg", "gem", "avgmax", "grid2")
TIMM_MAIN_POOLS = {"avg": "avg", "avgmax": "catavgmax"}  # the main pools a plain timm model builds from its config


def check_main_pool(main_pool: Any) -> str:
    """``main_pool``; a ValueError naming the setting and its values unless it is one of :data:`MAIN_POOLS`."""
    if not isinstance(main_pool, str) or main_pool not in MAIN_POOLS:
        raise ValueError(f"main_pool must be one of {MAIN_POOLS}, got {main_pool!r}")
    return main_pool


class GeneralizedMeanPool2d(nn.Module):
    """GeM (Radenović et al.): per channel ``mean(clamp(x, eps) ** p) ** (1 / p)`` over the map, ``p`` learnable
    (init 3; used as at least 1: p = 1 is the average, p -> inf the maximum); computed in float32 on the map divided
    by each channel's maximum, so that no power overflows (x ** p did for large maps and p: NaN losses)."""

    pool_type = "gem"

    def __init__(self, p: float = 3.0, eps: float = 1e-6, flatten: bool = True) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.ones(1) * p)
        self.eps = eps
        self.flatten = flatten

    def _powered(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(x / peak) ** p`` in [0, 1], the channels' peaks and p (at least 1), in float32."""
        p = self.p.float().clamp(min=1.0)
        x = x.float().clamp(min=self.eps)
        peak = x.amax(dim=(-2, -1), keepdim=True)
        return (x / peak).pow(p), peak, p

    def forward(self, x: Tensor) -> Tensor:
        powered, peak, p = self._powered(x)
        pooled = (powered.mean(dim=(-2, -1), keepdim=True).pow(1.0 / p) * peak).to(x.dtype)
        return pooled.flatten(1) if self.flatten else pooled

    def feat_mult(self) -> int:
        return 1

    def is_identity(self) -> bool:
        return False

    def spatial_terms(self, x: Tensor) -> Tensor:
        """(B, C, h, w) maps whose mean over the map is this pool's output: each channel's GeM spread over the map in
        proportion to ``clamp(x, eps) ** p`` (p = 1: the map itself, the CAM of an average)."""
        powered = self._powered(x)[0]
        share = powered / powered.mean(dim=(-2, -1), keepdim=True)
        return (share * self.forward(x).float().reshape(*x.shape[:2], 1, 1)).to(x.dtype)


class GridAvgPool2d(nn.Module):
    """The averages of a ``grid`` x ``grid`` grid of cells (``F.adaptive_avg_pool2d``, the MGML-FENet heads'
    pooling), flattened channel by channel: ``grid ** 2`` inputs per channel; a map narrower than the grid repeats
    its pixels in several cells."""

    def __init__(self, grid: int = 2, flatten: bool = True) -> None:
        super().__init__()
        self.grid = int(grid)
        self.flatten = flatten
        self.pool_type = f"grid{self.grid}"

    def forward(self, x: Tensor) -> Tensor:
        pooled = F.adaptive_avg_pool2d(x, self.grid)
        return pooled.flatten(1) if self.flatten else pooled

    def feat_mult(self) -> int:
        return self.grid * self.grid

    def is_identity(self) -> bool:
        return False

    def spatial_terms(self, x: Tensor) -> Tensor:
        """(B, C * grid**2, h, w) maps whose means over the map are this pool's outputs, in its order: input
        ``c * grid**2 + cell`` is channel c inside the cell, times h * w / (the cell's pixels), zero outside."""
        height, width = x.shape[-2:]
        rows, cols = _cells(height, self.grid, x.device), _cells(width, self.grid, x.device)  # (grid, side) 0/1
        weight = (rows[:, None, :, None] / rows.sum(1)[:, None, None, None]) \
            * (cols[None, :, None, :] / cols.sum(1)[None, :, None, None]) * (height * width)
        terms = x[:, :, None] * weight.reshape(1, 1, self.grid * self.grid, height, width).to(x.dtype)
        return terms.flatten(1, 2)


def _cells(side: int, grid: int, device: torch.device) -> Tensor:
    """(grid, side) 0/1: the pixels each of ``F.adaptive_avg_pool2d``'s cells covers (start floor(i * side / grid),
    end ceil((i + 1) * side / grid): cells overlap where grid does not divide side)."""
    index = torch.arange(side, device=device)
    starts = [(i * side) // grid for i in range(grid)]
    ends = [-((-(i + 1) * side) // grid) for i in range(grid)]
    return torch.stack([((index >= start) & (index < end)).float() for start, end in zip(starts, ends)])


def _catavgmax_terms(x: Tensor) -> Tensor:
    """(B, 2C, h, w) maps whose means over the map are timm's ``catavgmax`` outputs: the map itself (the average's
    terms), then each channel's maximum times h * w at its first arg-max pixel, zero elsewhere."""
    flat = x.flatten(2)
    peak = torch.zeros_like(flat).scatter_(2, flat.argmax(dim=2, keepdim=True),
                                           flat.amax(dim=2, keepdim=True) * flat.shape[-1])
    return torch.cat([x, peak.reshape(x.shape)], dim=1)


def pool_spatial_terms(pool: nn.Module, x: Tensor) -> Tensor:
    """(B, D, h, w) maps whose means over the map are ``pool(x)`` (D of them, the classifier's inputs in its order),
    so that ``classifier.weight[k] . terms[:, :, i, j]`` is the CAM of class k with the property of an average's
    CAM: its mean over the map is the logit less the bias. An average pool's terms are the map itself."""
    if hasattr(pool, "spatial_terms"):
        return pool.spatial_terms(x)
    if getattr(pool, "pool_type", "") == "catavgmax":
        return _catavgmax_terms(x)
    return x


def _make_main_pool(main_pool: str) -> nn.Module:
    if main_pool == "gem":
        return GeneralizedMeanPool2d(flatten=True)
    if main_pool == "grid2":
        return GridAvgPool2d(2, flatten=True)
    return SelectAdaptivePool2d(pool_type=TIMM_MAIN_POOLS[main_pool], flatten=True)


def _pool_holder(net: nn.Module) -> nn.Module | None:
    """The module whose ``global_pool`` (timm's, flattening, or one of :func:`set_main_pool`'s) feeds the classifier
    straight (dropout between at most): the timm model itself (ResNet, DenseNet, EfficientNet: global_pool ->
    fc/classifier) or its ClassifierHead (VGG, ByobNet, RegNet); None for other heads (a norm, a convolution or an
    MLP after the pool: ConvNeXt's, MobileNetV3's, a ViT's)."""
    classifier = net.get_classifier() if hasattr(net, "get_classifier") else None
    for holder in (net, getattr(net, "head", None)):
        if holder is not net and not isinstance(holder, ClassifierHead):
            continue
        pool = getattr(holder, "global_pool", None)
        flattens = isinstance(pool, SelectAdaptivePool2d) and isinstance(pool.flatten, nn.Flatten) \
            or isinstance(pool, (GeneralizedMeanPool2d, GridAvgPool2d)) and pool.flatten
        if flattens and isinstance(classifier, nn.Linear) and any(child is classifier for child in holder.children()):
            return holder
    return None


def set_main_pool(net: nn.Module, main_pool: str, name: str) -> nn.Module | None:
    """Give the timm classifier ``net`` the pool ``main_pool`` in place of its global average, with a classifier
    widened to the pool's outputs and started from timm's own (its weights repeated and divided by the cells for
    grid2, zero on avgmax's maxima: the logits start at, or for grid cells that overlap near, the average's, and
    the backbone's own initialisation is kept). Returns the pool (None for avg: ``net`` stays as timm built it)."""
    if check_main_pool(main_pool) == "avg":
        return None
    holder = _pool_holder(net)
    if holder is None:
        head = getattr(net, "head", None)
        kind = type(head if isinstance(head, nn.Module) else net).__name__
        raise BackboneError(f"model.options.main_pool={main_pool} needs a timm classifier that pools its last map "
                            f"straight into a linear layer (global_pool -> fc: resnet*, densenet*, vgg*, "
                            f"efficientnet*); backbone.name={name!r} has a {kind} head: use main_pool=avg with it")
    old = net.get_classifier()
    pool = _make_main_pool(main_pool)
    widened = nn.Linear(old.in_features * pool.feat_mult(), old.out_features, bias=old.bias is not None,
                        device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        if main_pool == "grid2":
            widened.weight.copy_(old.weight.repeat_interleave(pool.feat_mult(), dim=1) / pool.feat_mult())
        elif main_pool == "avgmax":
            widened.weight.copy_(torch.cat([old.weight, torch.zeros_like(old.weight)], dim=1))
        else:
            widened.weight.copy_(old.weight)
        if old.bias is not None:
            widened.bias.copy_(old.bias)
    attribute = next(key for key, child in holder.named_children() if child is old)
    holder.global_pool = pool
    setattr(holder, attribute, widened)
    if isinstance(holder, ClassifierHead):
        holder.num_features = holder.in_features * pool.feat_mult()
    return pool


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
        return None if self.main_pool == "avg" else _pool_holder(self.net).global_pool

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
