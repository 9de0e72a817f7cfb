"""Visualisation: CAM / Grad-CAM attention maps and TensorBoard logging."""

from rsnet.viz.attention import class_activation_maps, grad_cam, overlay
from rsnet.viz.logging import TensorBoardLogger, pick_attention_images, render_confusion_matrix

__all__ = [
    "TensorBoardLogger",
    "class_activation_maps",
    "grad_cam",
    "overlay",
    "pick_attention_images",
    "render_confusion_matrix",
]
