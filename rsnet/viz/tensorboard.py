"""TensorBoard logging (tags: docs/tensorboard.md); a logger built with ``enabled=False`` does nothing, creates no
files."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor, nn

from rsnet.data.normalize import to_float_chw
from rsnet.data.raster import Bands, max_pixel_value, pictures
from rsnet.files import atomic_write, disk_was_full
from rsnet.viz.attention import captioned_attention
from rsnet.viz.figures import AttentionTile, attention_pages, render_confusion_matrix


def pick_attention_images(labels: Sequence[int] | np.ndarray, max_images: int | None = None) -> list[int]:
    """Indices of the first image of each class (classes in increasing order), at most ``max_images``."""
    first: dict[int, int] = {}
    for index, label in enumerate(np.asarray(labels).tolist()):
        first.setdefault(int(label), index)
    return [first[label] for label in sorted(first)][:max_images]


def attention_tiles(model: nn.Module, images_uint8: np.ndarray | Tensor, mean: Sequence[float],
                    std: Sequence[float], class_names: Sequence[str] | None = None,
                    labels: Sequence[int] | None = None, bands: Bands | None = None
                    ) -> dict[str, list[AttentionTile]]:
    """Per CAM head, the captioned overlays of the images (the model's part: its forward passes, on its device); the
    images are uint8 RGB, or a multispectral model's ``bands``, drawn as their RGB composite."""
    images = np.asarray(images_uint8)
    if bands is None and (images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8):
        raise ValueError(f"attention maps need uint8 images (N, H, W, 3), got {images.dtype} {images.shape}")
    device = next(model.parameters()).device
    inputs = to_float_chw(images, mean, std, max_pixel_value(bands)).to(device)
    return captioned_attention(model, pictures(images, bands), inputs, class_names, labels)


def attention_figures(tiles: Mapping[str, Sequence[AttentionTile]], title_suffix: str = "") -> dict[str, np.ndarray]:
    """``{"attention/cam_<head>[/page<n>]": page}`` for every CAM head of :func:`attention_tiles` (a Grad-CAM page
    would equal the CAM): the drawing, without the model."""
    figures = {}
    for head, head_tiles in tiles.items():
        pages = attention_pages(head_tiles, f"CAM of head {head} at its predicted class{title_suffix}")
        for number, page in enumerate(pages, 1):
            figures[f"attention/cam_{head}" + (f"/page{number}" if number > 1 else "")] = page
    return figures


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """Nested config -> ``{"optimizer.lr": 0.02, ...}``; bools, numbers and strings kept, the rest as ``str``."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return flat


def hparam_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """Final metrics for the HParams tab from a run summary or ``compute_metrics`` (those present, ``oa_<head>``)."""
    metrics = {key: float(summary[key]) for key in ("accuracy", "average_accuracy", "kappa", "val_accuracy")
               if isinstance(summary.get(key), (int, float))}
    metrics.update({f"oa_{head}": float(value) for head, value in summary.get("oa", {}).items()})
    return metrics


def _keep_projector_entries(config_path: Path, earlier: str) -> None:
    """Re-add to ``projector_config.pbtxt`` the entries of ``earlier`` the current writer did not rewrite."""
    from google.protobuf import text_format
    from tensorboard.plugins.projector.projector_config_pb2 import ProjectorConfig

    current = text_format.Parse(config_path.read_text(), ProjectorConfig())
    names = {embedding.tensor_name for embedding in current.embeddings}
    merged = ProjectorConfig()
    merged.embeddings.extend(e for e in text_format.Parse(earlier, ProjectorConfig()).embeddings
                             if e.tensor_name not in names)
    merged.embeddings.extend(current.embeddings)
    with atomic_write(config_path, "w") as handle:  # a crash here must not lose the earlier run's entries
        handle.write(text_format.MessageToString(merged))


def _quiet_full_disk_in_writer_thread() -> None:
    """TensorBoard's writer thread dies on a full disk, printing a traceback, and its error is raised again in the
    thread that logs next (where rsnet reports it in one line): that thread's traceback is not printed."""
    previous = threading.excepthook
    if getattr(previous, "rsnet_quiet_full_disk", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or not disk_was_full(args.exc_value):
            previous(args)

    hook.rsnet_quiet_full_disk = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def metadata_label(name: str) -> str:
    """A class name as one line of the projector's metadata.tsv: control characters (which would split rows or
    columns) and non-UTF-8 bytes as escapes, e.g. ``tab\\there``, ``caf\\udce9``."""
    text = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


class TensorBoardLogger:
    """Thin wrapper over ``SummaryWriter`` with rsnet's figures. ``enabled=False`` makes every call a no-op."""

    def __init__(self, log_dir: str | Path, enabled: bool = True) -> None:
        self.log_dir = Path(log_dir)
        self.enabled = enabled
        self._writer = None
        self._earlier_projector: str | None = None  # projector_config.pbtxt before this logger's first embedding
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            _quiet_full_disk_in_writer_thread()
            self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """One scalar per tag; non-numeric values (dicts, lists, None) are skipped."""
        if self._writer is None:
            return
        for tag, value in values.items():
            if isinstance(value, Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                self._writer.add_scalar(tag, float(value), step)

    def confusion_matrix(self, cm: np.ndarray | Sequence[Sequence[int]], class_names: Sequence[str] | None,
                         step: int, tag: str = "test/confusion_matrix") -> None:
        """Log the row-normalised confusion matrix (rows = true class) as an image."""
        if self._writer is None:
            return
        self._writer.add_image(tag, render_confusion_matrix(cm, class_names), step, dataformats="HWC")

    def attention_maps(self, model: nn.Module, images_uint8: np.ndarray | Tensor, mean: Sequence[float],
                       std: Sequence[float], step: int, class_names: Sequence[str] | None = None,
                       labels: Sequence[int] | None = None, bands: Bands | None = None) -> None:
        """Log ``attention/cam_<head>`` for every CAM head (:func:`attention_tiles`, :meth:`attention_pages`)."""
        if self._writer is None:
            return
        self.attention_pages(attention_tiles(model, images_uint8, mean, std, class_names, labels, bands), step)

    def attention_pages(self, tiles: Mapping[str, Sequence[AttentionTile]], step: int) -> None:
        """Log the pages of :func:`attention_tiles`' overlays as ``attention/cam_<head>`` (no model needed)."""
        if self._writer is None:
            return
        for tag, page in attention_figures(tiles, f", epoch {step}").items():
            self._writer.add_image(tag, page, step, dataformats="HWC")

    def hparams(self, config: Mapping[str, Any], metrics: Mapping[str, float], step: int = 0) -> None:
        """HParams tab: the flattened ``config`` and ``metrics`` as ``hparam/<name>``, in this run's own event file."""
        if self._writer is None:
            return
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        values = {f"hparam/{name}": float(value) for name, value in metrics.items()}
        for summary in hparams_summaries(flatten_config(config), values):
            self._writer.file_writer.add_summary(summary, step)
        self.scalars(values, step)

    def embeddings(self, features: Tensor, labels: Sequence[str], images: Tensor | None, step: int,
                   tag: str = "main") -> None:
        """Projector entry ``<tag>:<step>``: a point per row of ``features``, labelled by class, with thumbnails."""
        if self._writer is None:
            return
        config_path = self.log_dir / "projector_config.pbtxt"
        if self._earlier_projector is None:
            self._earlier_projector = config_path.read_text() if config_path.is_file() else ""
        self._writer.add_embedding(features, metadata=[metadata_label(label) for label in labels], label_img=images,
                                   global_step=step, tag=tag)
        _keep_projector_entries(config_path, self._earlier_projector)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
