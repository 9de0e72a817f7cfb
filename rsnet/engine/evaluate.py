"""Evaluation: run a model over a dataset, then overall / average accuracy, kappa, per-class, confusion.

Works the same for a full multi-branch model (``forward -> MultiBranchOutput``) and for an exported
plain classifier (``forward -> Tensor`` logits, scored as the head ``"main"``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from rsnet.models.output import MultiBranchOutput

ENSEMBLE_PREFIX = "ensemble"


@dataclass
class EvalResult:
    """Predictions of every head over one dataset.

    Attributes:
        predictions: head name -> predicted labels, int64 array (N,).
        probabilities: head name -> softmax probabilities, float32 array (N, C).
        targets: true labels, int64 array (N,).
        reported_head: the head the model is scored by (its ensemble head if it has one, else ``main``).
    """

    predictions: dict[str, np.ndarray]
    probabilities: dict[str, np.ndarray]
    targets: np.ndarray
    reported_head: str = "main"
    heads: list[str] = field(default_factory=list)

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


def _loader(data: Dataset | DataLoader | Iterable, batch_size: int) -> Iterable:
    if isinstance(data, DataLoader):
        return data
    if isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")
                                     and not isinstance(data, (list, tuple))):
        return DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=0)  # type: ignore[arg-type]
    return data  # any iterable of (images, labels) batches


@torch.no_grad()
def evaluate(model: nn.Module | Callable[[Tensor], Any], data: Dataset | DataLoader | Iterable,
             device: str | torch.device = "cpu", batch_size: int = 64) -> EvalResult:
    """Predict every sample of ``data`` with every head of ``model``.

    Args:
        model: an rsnet model (returns ``MultiBranchOutput``) or any callable returning logits.
        data: a dataset (``ds[i] -> (image, label)``), a ``DataLoader`` or an iterable of batches.
        device: where the forward passes run.
        batch_size: batch size when ``data`` is a dataset.

    The model runs in eval mode under ``no_grad``; its previous train/eval mode is restored.
    """
    device = torch.device(device)
    modes = [(m, m.training) for m in model.modules()] if isinstance(model, nn.Module) else []
    if isinstance(model, nn.Module):
        model.eval()
    probs: dict[str, list[np.ndarray]] = {}
    targets: list[np.ndarray] = []
    heads: list[str] = []
    reported = "main"
    try:
        for images, labels in _loader(data, batch_size):
            output = _as_output(model(images.to(device)))
            if not heads:
                heads = list(output.logits)
                reported = output.ensemble or output.main
            for head, logits in output.logits.items():
                probs.setdefault(head, []).append(torch.softmax(logits.float(), dim=1).cpu().numpy())
            targets.append(torch.as_tensor(labels).cpu().numpy().astype(np.int64))
    finally:
        for module, training in modes:  # restore every module's own mode (e.g. frozen BatchNorm)
            module.training = training
    if not targets:
        raise ValueError("evaluate() got an empty dataset")
    probabilities = {head: np.concatenate(parts).astype(np.float32) for head, parts in probs.items()}
    ensemble_heads = [h for h in heads if h.startswith(ENSEMBLE_PREFIX)]
    if len(ensemble_heads) >= 2:  # e.g. logit ensemble and feature ensemble: also score their mean
        probabilities["ensemble_mean"] = np.mean([probabilities[h] for h in ensemble_heads], axis=0)
    predictions = {head: p.argmax(axis=1).astype(np.int64) for head, p in probabilities.items()}
    return EvalResult(predictions=predictions, probabilities=probabilities, targets=np.concatenate(targets),
                      reported_head=reported, heads=list(probabilities))


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


def compute_metrics(result: EvalResult, class_names: Sequence[str]) -> dict[str, Any]:
    """JSON-safe metrics of an :class:`EvalResult` (accuracies in %).

    Keys: ``oa`` (head -> overall accuracy), ``oa/<head>`` (the same, flat, for loggers),
    ``accuracy`` and ``reported_head`` (the ensemble head if the model has one, else ``main``),
    ``kappa``, ``average_accuracy`` (macro mean over classes with test samples),
    ``per_class_accuracy`` (class -> %, ``None`` for a class without test samples),
    ``confusion_matrix`` (list of lists, rows = true class) and ``num_samples`` -- the last four of the
    reported head. ``kappa/<head>`` gives kappa of every head.
    """
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
        confusion_matrix=cm.astype(int).tolist(),
    )
    return metrics
