"""Evaluation: run a model over a dataset, score it (docs/tensorboard.md, Metrics), test-time augmentation. A plain
classifier (``forward -> Tensor`` logits, e.g. an export) is scored as the single head ``"main"``."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Subset

from rsnet.data.device_augment import DeviceAugment
from rsnet.data.loader import eval_prefetcher, index_chunks
from rsnet.data.scene_dataset import SceneDataset
from rsnet.files import atomic_write
from rsnet.models.output import MultiBranchOutput
from rsnet.precision import StepPrecision
from rsnet.progress import progress_bar
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


CPU_EVAL_BATCH = 64  # ``eval_batch_size=auto`` off CUDA: a CPU's cores are busy at 64 already
CUDA_EVAL_BATCH_MIN = 256  # ``eval_batch_size=auto`` on CUDA: at least this many images a batch


def check_eval_batch_size(setting: object) -> None:
    """``eval_batch_size`` must be auto or a whole number >= 1; ValueError naming the setting otherwise."""
    if setting == "auto" or (isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1):
        return
    raise ValueError(f"eval_batch_size={setting!r}: use auto (sized for each worker's device) or a whole number >= 1")


def eval_batch_size(setting: int | str, device: torch.device | str, train_batch_size: int | None = None) -> int:
    """The evaluation batch on ``device`` for the ``eval_batch_size`` setting: a number as it is; ``auto`` on CUDA
    twice ``train_batch_size`` (the training ``batch_size``), at least :data:`CUDA_EVAL_BATCH_MIN`, elsewhere
    :data:`CPU_EVAL_BATCH`.

    Why: a forward pass without backward keeps no activations, so an image costs a small part of what it costs in a
    training step, and twice the training batch fits wherever training fits. On a GPU a larger batch spreads the
    host's fixed work per batch (one Python iteration, one copy, a kernel launch per layer) over more images; the
    floor keeps the device busy when the training batch is small (the default 32). A CPU's cores are busy at 64
    already, where a larger batch only costs memory. For very large images, where 256 would not fit the device, set
    a number."""
    check_eval_batch_size(setting)
    if setting != "auto":
        return int(setting)
    if torch.device(device).type != "cuda":
        return CPU_EVAL_BATCH
    return max(CUDA_EVAL_BATCH_MIN, 2 * int(train_batch_size or 0))


@dataclass(frozen=True)
class EvalFeed:
    """How :func:`evaluate` feeds and runs the device, as training does: a ``SceneDataset``'s uint8 batches made the
    model's input by ``on_device`` on the device (None: the host's batched eval transform), batches in
    ``memory_format``, ``amp`` the autocast dtype on CUDA (bf16 | fp16 | none, as
    :class:`rsnet.precision.StepPrecision`), ``prefetch`` the next batch on a background thread."""

    on_device: DeviceAugment | None = None
    memory_format: torch.memory_format = torch.contiguous_format
    amp: str = "none"
    prefetch: bool = True


class _DeviceProbabilities:
    """Every head's softmax probabilities (float32) and the labels, kept where they were computed until
    :meth:`result`: no host synchronisation per batch."""

    def __init__(self) -> None:
        self.heads: dict[str, list[Tensor]] = {}
        self.labels: list[Tensor] = []
        self.reported = "main"

    def add(self, output: MultiBranchOutput, labels: Any) -> None:
        if not self.labels:
            self.reported = output.ensemble or output.main
        for head, logits in output.logits.items():
            self.heads.setdefault(head, []).append(torch.softmax(logits.float(), dim=1))
        self.labels.append(torch.as_tensor(labels).reshape(-1))

    def result(self) -> EvalResult:
        """The probabilities in one transfer to the host (the labels in another), and the predictions."""
        if not self.labels:
            raise ValueError("evaluate() got an empty dataset")
        parts = {head: torch.cat(batches) for head, batches in self.heads.items()}
        flat = torch.cat([part.reshape(-1) for part in parts.values()]).cpu().numpy()
        sizes = np.cumsum([part.numel() for part in parts.values()])[:-1]
        probabilities = {head: values.reshape(part.shape)
                         for (head, part), values in zip(parts.items(), np.split(flat, sizes))}
        targets = torch.cat([labels.to(self.labels[0].device) for labels in self.labels]).cpu().numpy()
        return EvalResult(predictions={head: p.argmax(axis=1).astype(np.int64) for head, p in probabilities.items()},
                          probabilities=probabilities, targets=targets.astype(np.int64), reported_head=self.reported)


def _cached_batches(dataset: SceneDataset, indices: np.ndarray, device: torch.device, batch_size: int,
                    feed: EvalFeed) -> Iterator[tuple[Tensor, Tensor]]:
    """The items ``indices`` of ``dataset`` on ``device`` as the model's input, from its cache in whole batches
    (:func:`rsnet.data.loader.eval_prefetcher`)."""
    prefetcher = eval_prefetcher(dataset, device, feed.on_device, feed.memory_format, feed.prefetch)
    try:
        with closing(prefetcher.batches(index_chunks(indices, batch_size))) as batches:
            for batch in batches:
                yield batch.images, batch.labels
    finally:
        prefetcher.close()


def _given_batches(batches: Iterable, device: torch.device) -> Iterator[tuple[Tensor, Any]]:
    """Batches (images, labels) as they come, the images moved to ``device``."""
    for images, labels in batches:
        yield images.to(device), labels


def _batches(data: Dataset | DataLoader | Iterable, device: torch.device, batch_size: int,
             indices: Sequence[int] | np.ndarray | None, feed: EvalFeed) -> tuple[Iterator, int | None]:
    """The batches of ``data`` (its items ``indices``) on ``device``, and their number of samples when known."""
    if isinstance(data, SceneDataset):
        chosen = np.arange(len(data)) if indices is None else np.asarray(indices, dtype=np.int64)
        return _cached_batches(data, chosen, device, batch_size, feed), len(chosen)
    is_dataset = isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")
                                               and not isinstance(data, (list, tuple)))
    if indices is not None and (isinstance(data, DataLoader) or not is_dataset):
        raise ValueError(f"evaluate(indices=...) selects items of a dataset, not of a {type(data).__name__}")
    if isinstance(data, DataLoader):
        loader = data
    elif is_dataset:
        items = data if indices is None else Subset(data, list(indices))  # type: ignore[arg-type]
        loader = DataLoader(items, batch_size=batch_size, shuffle=False, num_workers=0)
    else:
        return _given_batches(data, device), None  # any iterable of (images, labels) batches
    total = len(loader.dataset) if hasattr(loader.dataset, "__len__") else None
    return _given_batches(loader, device), total


def evaluate(model: nn.Module | Callable[[Tensor], Any], data: Dataset | DataLoader | Iterable,
             device: str | torch.device = "cpu", batch_size: int = 64, progress: str | None = None, *,
             indices: Sequence[int] | np.ndarray | None = None, feed: EvalFeed = EvalFeed()) -> EvalResult:
    """Predict every sample of ``data`` (or of a dataset its items ``indices``) with every head, in eval mode (then
    restored), under ``torch.inference_mode``. A ``SceneDataset`` is fed from its cache in whole batches as
    :class:`EvalFeed` says, a plain dataset through a ``DataLoader``, batches as they come; the probabilities stay
    on the device until the end."""
    device = torch.device(device)
    batches, total = _batches(data, device, batch_size, indices, feed)
    precision = StepPrecision.for_device(feed.amp, device)
    found = _DeviceProbabilities()
    shown = progress_bar(total=total, unit="img", desc=progress, disable=progress is None, leave=False,
                         dynamic_ncols=True)
    with eval_mode(model) if isinstance(model, nn.Module) else nullcontext(), shown as bar, closing(batches):
        with torch.inference_mode(), precision.autocast():
            for images, labels in batches:
                found.add(_as_output(model(images)), labels)
                bar.update(len(labels))
    return found.result()


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
                        class_names: Sequence[str], title: str | None = None) -> None:
    """Write the row-normalised confusion matrix as a PNG heat map (the TensorBoard image), atomically; a ``title``
    is drawn above it and kept as the PNG's ``Title`` text."""
    info = PngInfo()
    if title:
        info.add_text("Title", title)
    with atomic_write(path, "wb") as handle:
        Image.fromarray(render_confusion_matrix(cm, class_names, title)).save(handle, format="PNG", pnginfo=info)


METRIC_DECIMALS = 6  # of the numbers metrics.json and eval_*.json hold: 0.6, not 0.6000000000000001


def rounded_numbers(document: Any, decimals: int = METRIC_DECIMALS) -> Any:
    """``document`` with every float rounded to ``decimals`` places (dicts and lists walked), as the JSON files hold
    it; the figures in memory, which select the epoch and feed TensorBoard, keep full precision."""
    if isinstance(document, float | np.floating):
        return round(float(document), decimals)
    if isinstance(document, dict):
        return {key: rounded_numbers(value, decimals) for key, value in document.items()}
    if isinstance(document, list | tuple):
        return [rounded_numbers(value, decimals) for value in document]
    return document


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
