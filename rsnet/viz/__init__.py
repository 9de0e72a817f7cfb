"""Visualisation: CAM / Grad-CAM attention maps, projector embeddings and TensorBoard logging."""

from rsnet.viz.attention import attention_source, class_activation_maps, grad_cam, overlay
from rsnet.viz.embedding import dataset_embedding, main_branch_features, pick_embedding_images
from rsnet.viz.figures import render_confusion_matrix
from rsnet.viz.tensorboard import TensorBoardLogger, flatten_config, hparam_metrics, pick_attention_images

__all__ = [
    "TensorBoardLogger",
    "attention_source",
    "class_activation_maps",
    "dataset_embedding",
    "flatten_config",
    "grad_cam",
    "hparam_metrics",
    "main_branch_features",
    "overlay",
    "pick_attention_images",
    "pick_embedding_images",
    "render_confusion_matrix",
]
