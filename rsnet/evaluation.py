"""Evaluation: run a model over a dataset, score it (docs/tensorboard.md, Metrics), test-time augmentation. A plain
classifier (``forward -> Tensor`` logits, e.g. an export) is scored as the single head ``"main"``."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from rsnet.files import atomic_write
from rsnet.models.output import MultiBranchOutput
from rsnet.viz.attention import eval_mode
from rsnet.viz.figures import render_confusion_matrix


@dataclass
class EvalResult:
    """Predictions (N,) and probabilities (N, C) of every head, the true labels, and ``reported_head``, which scores the
    model."""

    predictions: dict[str, np.ndarray]
    probabilities: dict[str, np.ndarray]
    targets: np.ndarray
    reported_head: str = "main"

    @property
    def num_samples(self) -> int:
        return int(self.targets.shape[0])


def _as_output(raw: Any) -> MultiBranchOutput:
    """Normalise a model's forward result: a plain logits Tensor becomes the single head ``main``."""
    if isinstance(raw, MultiBranchOutput):
        return raw
    if isinstance(raw, Tensor):
        return MultiBranchOutput(logits={"main": raw})
    raise TypeError(f"model returned {type(raw).__name__}; expected MultiBranchOutput or a logits Tensor")


def d4_views(x: Tensor) -> list[Tensor]:
    """The 8 dihedral views of an image batch (..., H, W): the 4 rotations, each also flipped; view 0 is ``x``."""
    rotations = [torch.rot90(x, k, dims=(-2, -1)) for k in range(4)]
    return rotations + [torch.flip(view, dims=(-1,)) for view in rotations]


class TTAModel(nn.Module):
    """Test-time augmentation: the **logits** of ``model`` averaged over the 8 :func:`d4_views`, no feature maps."""

    def __init__(self, model: nn.Module | Callable[[Tensor], Any]) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor | MultiBranchOutput:
        raw = [self.model(view) for view in d4_views(x)]
        outputs = [_as_output(output) for output in raw]
        logits = {head: torch.stack([output.logits[head] for output in outputs]).mean(dim=0)
                  for head in outputs[0].logits}
        if isinstance(raw[0], Tensor):
            return logits["main"]
        return MultiBranchOutput(logits=logits, main=outputs[0].main, ensemble=outputs[0].ensemble)


def _loader(data: Dataset | DataLoader | Iterable, batch_size: int) -> Iterable:
    if isinstance(data, DataLoader):
        return data
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")
                                     and not isinstance(data, (list, tuple))):
        return DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=0)  # type: ignore[arg-type]
    return data  # any iterable of (images, labels) batches


@torch.no_grad()
def evaluate(model: nn.Module | Callable[[Tensor], Any], data: Dataset | DataLoader | Iterable,
             device: str | torch.device = "cpu", batch_size: int = 64, progress: str | None = None) -> EvalResult:
    """Predict every sample of ``data`` (dataset, ``DataLoader`` or batches) with every head, in eval mode (then
    restored)."""
    device = torch.device(device)
    probs: dict[str, list[np.ndarray]] = {}
    targets: list[np.ndarray] = []
    reported = "main"
    loader = _loader(data, batch_size)
    total = len(loader.dataset) if isinstance(loader, DataLoader) and hasattr(loader.dataset, "__len__") else None
    bar = tqdm(total=total, unit="img", desc=progress, disable=progress is None, leave=False, dynamic_ncols=True)
    with eval_mode(model) if isinstance(model, nn.Module) else nullcontext(), bar:
        for images, labels in loader:
            output = _as_output(model(images.to(device)))
            bar.update(len(labels))
            if not probs:
                reported = output.ensemble or output.main
            for head, logits in output.logits.items():
                probs.setdefault(head, []).append(torch.softmax(logits.float(), dim=1).cpu().numpy())
            targets.append(torch.as_tensor(labels).cpu().numpy().astype(np.int64))
    if not targets:
        raise ValueError("evaluate() got an empty dataset")
    probabilities = {head: np.concatenate(parts).astype(np.float32) for head, parts in probs.items()}
    predictions = {head: p.argmax(axis=1).astype(np.int64) for head, p in probabilities.items()}
    return EvalResult(predictions=predictions, probabilities=probabilities, targets=np.concatenate(targets),
                      reported_head=reported)


def confusion_matrix(targets: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) int64 counts; rows = true class, columns = predicted class."""
    targets = np.asarray(targets, dtype=np.int64)
    predictions = np.asarray(predictions, dtype=np.int64)
    if targets.size and (targets.min() < 0 or targets.max() >= num_classes
                         or predictions.min() < 0 or predictions.max() >= num_classes):
        raise ValueError(f"labels outside [0, {num_classes}) for {num_classes} classes")
    flat = targets * num_classes + predictions
    return np.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def cohen_kappa(cm: np.ndarray) -> float:
    """Cohen's kappa from a confusion matrix: (p_o - p_e) / (1 - p_e)."""
    cm = np.asarray(cm, dtype=np.float64)
    total = cm.sum()
    if total == 0:
        return 0.0
    p_o = np.trace(cm) / total
    p_e = float((cm.sum(axis=1) * cm.sum(axis=0)).sum()) / (total * total)
    if p_e >= 1.0:  # a single class everywhere: perfect agreement by chance only
        return 1.0 if p_o >= 1.0 else 0.0
    return float((p_o - p_e) / (1.0 - p_e))


def precision_recall_f1(cm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class precision, recall and F1 (fractions) of a confusion matrix (rows: true class); 0 where undefined."""
    cm = np.asarray(cm, dtype=np.float64)
    hits, predicted, actual = np.diag(cm), cm.sum(axis=0), cm.sum(axis=1)
    precision = np.divide(hits, predicted, out=np.zeros_like(hits), where=predicted > 0)
    recall = np.divide(hits, actual, out=np.zeros_like(hits), where=actual > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros_like(hits), where=both > 0)
    return precision, recall, f1


def _precision_recall_f1_metrics(cm: np.ndarray, class_names: Sequence[str]) -> dict[str, Any]:
    """``per_class_<precision|recall|f1>`` (class -> %) and their ``macro_*`` means, as scikit-learn's."""
    scores = dict(zip(("precision", "recall", "f1"), precision_recall_f1(cm)))
    seen = (cm.sum(axis=0) + cm.sum(axis=1)) > 0
    metrics: dict[str, Any] = {}
    for name, values in scores.items():
        metrics[f"per_class_{name}"] = {str(c): float(v * 100.0) for c, v in zip(class_names, values)}
        metrics[f"macro_{name}"] = float(values[seen].mean() * 100.0) if seen.any() else 0.0
    return metrics


def write_confusion_csv(path: str | Path, cm: np.ndarray | Sequence[Sequence[int]],
                        class_names: Sequence[str]) -> None:
    """Write the confusion matrix as CSV, atomically: predicted class names, then a row per true class."""
    with atomic_write(path, "w") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["true/predicted", *class_names])
        writer.writerows([name, *map(int, row)] for name, row in zip(class_names, np.asarray(cm)))


def write_confusion_png(path: str | Path, cm: np.ndarray | Sequence[Sequence[int]],
                        class_names: Sequence[str]) -> None:
    """Write the row-normalised confusion matrix as a PNG heat map (the TensorBoard image), atomically."""
    with atomic_write(path, "wb") as handle:
        Image.fromarray(render_confusion_matrix(cm, class_names)).save(handle, format="PNG")


def compute_metrics(result: EvalResult, class_names: Sequence[str]) -> dict[str, Any]:
    """JSON-safe metrics of an :class:`EvalResult`, accuracies in % (keys: docs/tensorboard.md, Metrics)."""
    num_classes = len(class_names)
    targets = result.targets
    n = result.num_samples
    metrics: dict[str, Any] = {"num_samples": n, "reported_head": result.reported_head}
    oa: dict[str, float] = {}
    for head, preds in result.predictions.items():
        oa[head] = float((preds == targets).mean() * 100.0) if n else 0.0
        metrics[f"oa/{head}"] = oa[head]
        metrics[f"kappa/{head}"] = cohen_kappa(confusion_matrix(targets, preds, num_classes))
    metrics["oa"] = oa
    reported = result.reported_head if result.reported_head in result.predictions else "main"
    cm = confusion_matrix(targets, result.predictions[reported], num_classes)
    support = cm.sum(axis=1)
    per_class: dict[str, float | None] = {}
    for index, name in enumerate(class_names):
        per_class[str(name)] = float(cm[index, index] / support[index] * 100.0) if support[index] else None
    present = [v for v in per_class.values() if v is not None]
    metrics.update(
        accuracy=oa[reported],
        kappa=cohen_kappa(cm),
        average_accuracy=float(np.mean(present)) if present else 0.0,
        per_class_accuracy=per_class,
        **_precision_recall_f1_metrics(cm, class_names),
        confusion_matrix=cm.astype(int).tolist(),
    )
    return metrics
