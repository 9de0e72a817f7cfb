"""Attention maps: CAM of every linear head, Grad-CAM of the main branch, colour overlays (docs/tensorboard.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rsnet.models.output import MultiBranchOutput
from rsnet.viz.figures import COLOUR_MAP, AttentionTile


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode; restore every submodule's own train/eval flag afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


def _forward(model: nn.Module, images: Tensor) -> MultiBranchOutput:
    output = model(images)
    if not isinstance(output, MultiBranchOutput):
        raise TypeError("attention maps need a full rsnet model returning MultiBranchOutput "
                        f"(got {type(output).__name__}); an exported plain classifier has no feature maps")
    return output


def _target_classes(logits: Tensor, class_idx: int | Tensor | None) -> Tensor:
    """Class per image: the head's own prediction, or the given class (int or (B,) tensor)."""
    if class_idx is None:
        return logits.argmax(dim=1)
    classes = torch.as_tensor(class_idx, device=logits.device, dtype=torch.long)
    return classes.expand(logits.shape[0]) if classes.dim() == 0 else classes


def normalize_maps(maps: Tensor, size: tuple[int, int] | None = None) -> Tensor:
    """ReLU, upsample (B, h, w) maps bilinearly to ``size``, scale each map to [0, 1] by its maximum."""
    maps = maps.float().clamp_min(0)
    if size is not None and tuple(maps.shape[-2:]) != tuple(size):
        maps = F.interpolate(maps[:, None], size=size, mode="bilinear", align_corners=False)[:, 0].clamp_min(0)
    peak = maps.flatten(1).amax(dim=1).clamp_min(1e-12)
    return maps / peak[:, None, None]


def _needs_last_spatial_map(output: MultiBranchOutput, head: str) -> bool:
    """True for a main head whose map is coarser than S4 (VGG's pool5 -> ConvMlp): drawn on S4 instead. (A main
    branch averaging heads of several levels gives the finest of their maps: drawn on it.)"""
    features = output.features
    if head != output.main or "stage4" not in features or features[head] is features["stage4"]:
        return False
    return features[head].shape[-2:].numel() < features["stage4"].shape[-2:].numel()


def attention_source(output: MultiBranchOutput, head: str) -> Tensor:
    """The (B, C, h, w) map ``head``'s CAM / Grad-CAM is drawn on: S4 for VGG's main head, else the one it pools."""
    if head not in output.features:
        raise KeyError(f"model output has no feature map for head {head!r} (has {sorted(output.features)})")
    return output.features["stage4" if _needs_last_spatial_map(output, head) else head]


def class_activation_maps(model: nn.Module, images: Tensor, class_idx: int | Tensor | None = None,
                          size: tuple[int, int] | None = None) -> dict[str, Tensor]:
    """CAM of every head in ``model.cam_classifiers()`` at ``class_idx`` (None: its prediction), (B, H, W) in [0, 1].

    The CAM of class k at a pixel is ``weight[k] . model.cam_inputs(head, features[head])`` there: maps whose means
    over the map are the classifier's inputs, so the CAM's mean is the logit less the bias, as for GAP -> Linear
    (where they are the feature map itself). A main branch pooled otherwise (``model.options.main_pool``) spreads
    each input over the pixels it pooled: gem in proportion to ``x ** p``; avgmax the average over the map and each
    channel's maximum at its arg-max pixel; grid2 each cell's average over that cell (the classifier's weights of
    each of the four cells applied to that cell's pixels; cells overlap by a row or column where a side is odd)."""
    return _maps_and_logits(model, images, class_idx, size)[0]


def _cam_inputs(model: nn.Module, head: str, features: Tensor) -> Tensor:
    """``model.cam_inputs(head, features)``; the map itself for a model without it (GAP -> Linear heads only)."""
    cam_inputs = getattr(model, "cam_inputs", None)
    return features if cam_inputs is None else cam_inputs(head, features)


def _maps_and_logits(model: nn.Module, images: Tensor, class_idx: int | Tensor | None,
                     size: tuple[int, int] | None) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """:func:`class_activation_maps` and the logits of the same forward pass (head -> (B, classes))."""
    size = tuple(images.shape[-2:]) if size is None else size
    heads = model.cam_classifiers()
    with eval_mode(model), torch.no_grad():
        output = _forward(model, images)
        maps: dict[str, Tensor] = {}
        for head, linear in heads.items():
            if linear is None or _needs_last_spatial_map(output, head):  # no single classifier: Grad-CAM
                continue
            features = _cam_inputs(model, head, output.features[head])  # (B, D, h, w), D = linear.in_features
            classes = _target_classes(output.logits[head], class_idx)
            weights = linear.weight[classes].to(features.dtype)  # (B, D)
            cam = torch.einsum("bc,bchw->bhw", weights, features)
            maps[head] = normalize_maps(cam, size)
    cams = {head: maps[head] if head in maps else grad_cam(model, images, head, class_idx, size) for head in heads}
    return cams, output.logits


def captioned_attention(model: nn.Module, images: np.ndarray, inputs: Tensor, class_names: Sequence[str] | None,
                        labels: Sequence[int] | None = None) -> dict[str, list[AttentionTile]]:
    """Per CAM head, one :class:`AttentionTile` per image: its overlay at the predicted class (the map
    :func:`min_max` normalised), captioned."""
    def name(index: int) -> str:
        return str(class_names[index]) if class_names is not None else f"class {index}"

    cams, logits = _maps_and_logits(model, inputs, None, None)
    tiles = {}
    for head, maps in cams.items():
        probabilities, predicted = torch.softmax(logits[head].float(), dim=1).max(dim=1)
        tiles[head] = [AttentionTile(image, overlay(image, min_max(cam)), None if labels is None else name(labels[i]),
                                     name(int(predicted[i])), float(probabilities[i]))
                       for i, (image, cam) in enumerate(zip(images, maps.cpu().numpy()))]
    return tiles


def grad_cam(model: nn.Module, images: Tensor, head: str = "main", class_idx: int | Tensor | None = None,
             size: tuple[int, int] | None = None) -> Tensor:
    """Grad-CAM of ``head`` at its predicted class (or ``class_idx``) on ``attention_source(output, head)``: detached
    (B, H, W) in [0, 1]. For a GAP -> Linear head this equals its CAM; parameters' ``.grad`` stay untouched."""
    size = tuple(images.shape[-2:]) if size is None else size
    # The input requires grad, so the features are in the graph even when every parameter is frozen.
    inputs = images.detach().clone().requires_grad_(True)
    with eval_mode(model), torch.enable_grad():
        output = _forward(model, inputs)
        features = attention_source(output, head)
        logits = output.logits[head]
        classes = _target_classes(logits, class_idx)
        score = logits.gather(1, classes[:, None]).sum()  # samples are independent in eval mode
        (gradients,) = torch.autograd.grad(score, features)
    alpha = gradients.mean(dim=(2, 3), keepdim=True)
    cam = (alpha * features.detach()).sum(dim=1)
    return normalize_maps(cam, size)


def min_max(cam: np.ndarray) -> np.ndarray:
    """``cam`` scaled from its own minimum (0) to its maximum (1), so that its range fills the colour map (a flat map:
    zeros)."""
    low, high = float(cam.min()), float(cam.max())
    return (cam - low) / (high - low) if high - low > 1e-6 else np.zeros_like(cam)


def overlay(image: np.ndarray, cam: np.ndarray | Tensor, alpha: float = 0.5) -> np.ndarray:
    """Blend a [0, 1] (h, w) map, resized, in :data:`~rsnet.viz.figures.COLOUR_MAP` over a uint8 (H, W, 3) RGB image
    (``alpha``: the map's opacity)."""
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"overlay expects an (H, W, 3) image, got shape {image.shape}")
    if isinstance(cam, Tensor):
        cam = cam.detach().float().cpu().numpy()
    cam = np.asarray(cam, dtype=np.float32)
    if cam.ndim != 2:
        raise ValueError(f"overlay expects an (H, W) map, got shape {cam.shape}")
    height, width = image.shape[:2]
    if cam.shape != (height, width):
        cam = cv2.resize(cam, (width, height), interpolation=cv2.INTER_LINEAR)
    heat = cv2.applyColorMap(np.uint8(np.clip(cam, 0.0, 1.0) * 255.0 + 0.5),
                             getattr(cv2, f"COLORMAP_{COLOUR_MAP.upper()}"))
    heat = cv2.cvtColor(heat, cv2.COLOR_BGR2RGB).astype(np.float32)
    blended = (1.0 - alpha) * image.astype(np.float32) + alpha * heat
    return np.clip(blended + 0.5, 0, 255).astype(np.uint8)
