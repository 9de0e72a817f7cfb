"""Inputs of TensorBoard's embedding projector: pooled main-branch features, class names, thumbnails."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor, nn

from rsnet.data.normalize import to_float_chw
from rsnet.viz.attention import eval_mode

SPRITE_LIMIT = 8192  # px: the largest sprite side the projector loads
THUMBNAIL_SIDE = 32  # px: thumbnail side when the sprite has room


def main_branch_features(model: nn.Module, batches: Iterable[Tensor]) -> Tensor:
    """(N, D) float32 CPU features of normalised image batches: the main classifier's input, in eval mode."""
    net = model.backbone.net
    device = next(net.parameters()).device
    rows = []
    with eval_mode(net), torch.no_grad():
        for images in batches:
            pooled = net.forward_head(net.forward_features(images.to(device)), pre_logits=True)
            rows.append(pooled.float().cpu())
    return torch.cat(rows)


def thumbnail_side(count: int, largest: int = THUMBNAIL_SIDE) -> int:
    """Thumbnail side so that ``count`` thumbnails fit in a square sprite of at most ``SPRITE_LIMIT`` px."""
    return max(1, min(largest, SPRITE_LIMIT // math.ceil(math.sqrt(max(count, 1)))))


def thumbnails(images_uint8: Sequence[np.ndarray] | np.ndarray, side: int) -> Tensor:
    """uint8 (H, W, 3) images -> (N, 3, side, side) float in [0, 1], area-resized (the projector's sprite)."""
    small = np.stack([cv2.resize(np.asarray(image), (side, side), interpolation=cv2.INTER_AREA)
                      for image in images_uint8])
    return to_float_chw(small)


def pick_embedding_images(labels: Sequence[int] | np.ndarray, max_images: int | None) -> list[int]:
    """The first ``max_images // classes`` images of every class (at least one), in index order; None: all."""
    labels = np.asarray(labels)
    if max_images is None:
        return list(range(len(labels)))
    classes = np.unique(labels)
    per_class = max(1, max_images // max(len(classes), 1))
    keep = np.concatenate([np.flatnonzero(labels == label)[:per_class] for label in classes])
    return sorted(keep.tolist())


def dataset_embedding(model: nn.Module, dataset: Any, indices: Sequence[int], batch_size: int = 64
                      ) -> tuple[Tensor, list[str], Tensor]:
    """Features, class names and thumbnails of ``SceneDataset`` items ``indices`` for the projector."""
    indices = list(indices)
    return (dataset_features(model, dataset, indices, batch_size), *embedding_labels(dataset, indices))


def dataset_features(model: nn.Module, dataset: Any, indices: Sequence[int], batch_size: int = 64) -> Tensor:
    """The projector's features of ``SceneDataset`` items ``indices`` (the model's part, on its device)."""
    indices = list(indices)
    chunks = [indices[start:start + batch_size] for start in range(0, len(indices), batch_size)]
    return main_branch_features(model, (dataset.get_batch(chunk)[0] for chunk in chunks))


def embedding_labels(dataset: Any, indices: Sequence[int]) -> tuple[list[str], Tensor]:
    """The projector's class names and thumbnails of ``SceneDataset`` items ``indices`` (no model needed)."""
    names = [dataset.class_names[int(dataset.labels[index])] for index in indices]
    return names, thumbnails([dataset.picture(index) for index in indices], thumbnail_side(len(indices)))
