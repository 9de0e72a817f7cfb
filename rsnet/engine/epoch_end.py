"""After every epoch: every worker evaluates its shard of the test (and validation) split; the primary selects, logs,
and has the checkpoints and metrics.json written, then the extras, whose failure is a warning: by a background
writer while the next epoch trains (``log.background_writes``), from a snapshot of the state taken here."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.elastic.multiprocessing import SignalException

from rsnet.data import DataBundle, augments_on_device
from rsnet.engine.acceleration import memory_format
from rsnet.engine.background_writer import BackgroundWriter
from rsnet.engine.run_history import write_history
from rsnet.engine.sharded_eval import sharded_evaluate
from rsnet.engine.snapshot import host_snapshot
from rsnet.evaluation import EvalFeed, compute_metrics, eval_batch_size, rounded_numbers
from rsnet.files import write_json
from rsnet.parallel import WorkerContext
from rsnet.parallel.strategies import Strategy
from rsnet.run_folders import dataset_folder, pretrained_tag
from rsnet.checkpoint import run_checkpoint_path, save_checkpoint
from rsnet.viz.embedding import dataset_features, embedding_labels, pick_embedding_images
from rsnet.viz.tensorboard import TensorBoardLogger, attention_tiles, hparam_metrics

log = logging.getLogger(__name__)

TORCHRUN_JOB_KEY = "torchrun_job"  # a checkpoint's TORCHELASTIC_RUN_ID (torchrun's --rdzv-id), None outside torchrun


@dataclass
class RunState:
    """The run's progress, as checkpoints carry it (top-level keys of the payload)."""

    epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    wall_time_s: float = 0.0
    last_metrics: dict[str, Any] | None = None
    selected: dict[str, Any] | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)  # membership changes (lost workers, restarts)

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any]) -> RunState:
        """The state a checkpoint saved (a key it lacks keeps its fresh value)."""
        return cls(**{item.name: checkpoint[item.name] for item in fields(cls) if item.name in checkpoint})

    def as_payload(self) -> dict[str, Any]:
        """The checkpoint keys of this state."""
        return {item.name: getattr(self, item.name) for item in fields(self)}


def evaluates_after(epoch: int, config: dict[str, Any]) -> bool:
    """Whether the 1-based ``epoch`` is evaluated: every ``eval_every`` epochs, and always the last."""
    return epoch % int(config["eval_every"]) == 0 or epoch == int(config["epochs"])


@dataclass
class EpochEvaluation:
    """The metrics (:func:`rsnet.evaluation.compute_metrics`) of one evaluated epoch."""

    test: dict[str, Any]
    val: dict[str, Any] | None


def evaluate_epoch(ctx: WorkerContext, config: dict[str, Any], data: DataBundle, model: torch.nn.Module,
                   epoch: int, shares: Sequence[float] | None = None) -> EpochEvaluation | None:
    """Every worker, after the 1-based ``epoch``: when it is evaluated, the test (and validation) metrics from
    shards evaluated by all workers in proportion to ``shares`` (None: equal); the primary gets them, others None."""
    if not evaluates_after(epoch, config):
        return None
    on_device = data.eval_augment if augments_on_device(config["augment"]["on_device"], ctx.device) else None
    feed = EvalFeed(on_device, memory_format(config, ctx.device), config["eval_amp"], bool(config["prefetch"]))
    batch = eval_batch_size(config["eval_batch_size"], ctx.device, config["batch_size"])
    test = sharded_evaluate(ctx, model, data.test, batch, feed, shares)
    val = sharded_evaluate(ctx, model, data.val, batch, feed, shares) if data.val is not None else None
    if test is None:
        return None
    return EpochEvaluation(compute_metrics(test, data.class_names),
                           compute_metrics(val, data.class_names) if val is not None else None)


def finish_epoch(config: dict[str, Any], data: DataBundle, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 strategy: Strategy, train_scalars: dict[str, float], state: RunState, tb: TensorBoardLogger,
                 attention_ids: list[int], evaluation: EpochEvaluation | None,
                 writer: BackgroundWriter) -> dict[str, Any] | None:
    """Primary only, after ``state.epoch`` was advanced and :func:`evaluate_epoch`: wait for the previous epoch's
    writes (raising their error), select, log, then have ``writer`` save the checkpoints and metrics.json, then the
    extras (in the background: from a host snapshot taken here); the metrics.json document when this epoch was
    evaluated (else None)."""
    writer.wait()  # at most one epoch's writes in flight: a crash loses no more, a write error stops the run here
    epoch = state.epoch
    improved = evaluation is not None and _select(evaluation, state, train_scalars, config["epochs"])
    if evaluation is None:
        state.history.append({"epoch": epoch, "wall_time_s": round(state.wall_time_s, 3), **_rounded(train_scalars)})
    summary = run_summary(config, data, state, strategy.report()) if evaluation is not None else None
    # what the writer reads: copied off the live tensors and the run's state when it writes in the background
    kept = _kept_for(writer, {"checkpoint": checkpoint_payload(config, data, model, optimizer, strategy, state),
                              "summary": summary, "scheduler_rows": strategy.stats(), "train_scalars": train_scalars,
                              "evaluation": evaluation})
    run_dir = Path(config["run_dir"])
    writer.submit(lambda: _save_checkpoints(run_dir, kept["checkpoint"], improved))
    if summary is not None:
        writer.submit(lambda: write_json(run_dir / "metrics.json", kept["summary"], indent=2, default=float))
    submit_extra(writer, "TensorBoard scalars and confusion matrix", epoch,
                 lambda: _log_scalars(tb, kept["scheduler_rows"], kept["train_scalars"], kept["evaluation"],
                                      data.class_names, epoch))
    if summary is None:
        return None
    if epoch == config["epochs"]:
        submit_extra(writer, "TensorBoard HParams tab", epoch,
                     lambda: tb.hparams(config, hparam_metrics(kept["summary"]), epoch))
    if epoch == config["epochs"] or epoch % config["log"]["attention_every"] == 0:
        run_extra("attention maps and embedding projector", epoch,
                  lambda: log_what_the_model_sees(config, data, model, tb, attention_ids, epoch, writer))
    submit_extra(writer, "history.csv and figures", epoch,
                 lambda: write_history(run_dir, kept["summary"], data.class_names, config["log"]["figure_format"]))
    return summary


def submit_extra(writer: BackgroundWriter, name: str, epoch: int, extra: Callable[[], None]) -> None:
    """Have ``writer`` run ``extra`` as :func:`run_extra` does: its failure is one warning, never the run's error."""
    writer.submit(lambda: run_extra(name, epoch, extra))


def _kept_for(writer: BackgroundWriter, tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` as ``writer`` may read it: a host snapshot when it writes later, in the background; else itself."""
    return host_snapshot(tree) if writer.background else tree


def run_extra(name: str, epoch: int, extra: Callable[[], None]) -> None:
    """Run ``extra``, something the run writes beside its checkpoints and metrics.json: its failure is one warning
    naming ``name`` and the error (the traceback at debug level), and the run goes on."""
    try:
        extra()
    except SignalException:  # the worker is being stopped (a peer died): not the extra's failure
        raise
    except Exception as error:  # noqa: BLE001 - an extra never stops the run; the warning shows what failed
        log.warning("epoch %d: the %s failed (%s: %s); the checkpoint and metrics are saved, the run goes on",
                    epoch, name, type(error).__name__, str(error).replace("\n", " "))
        log.debug("the %s failed", name, exc_info=True)


def _log_scalars(tb: TensorBoardLogger, scheduler_rows: list[dict[str, float]], train_scalars: dict[str, float],
                 evaluation: EpochEvaluation | None, class_names: list[str], epoch: int) -> None:
    """This epoch's training scalars and scheduler rows (``Strategy.stats``); when evaluated, its accuracies and
    the confusion matrix."""
    tb.scalars(train_scalars, epoch)
    for row in scheduler_rows:
        tb.scalars({f"scheduler/{key}": value for key, value in row.items() if isinstance(value, (int, float))},
                   int(row.get("interval", epoch)))
    if evaluation is None:
        return
    metrics = evaluation.test
    scalars = {f"test/oa/{head}": value for head, value in metrics["oa"].items()}
    scalars["test/kappa"] = metrics["kappa"]
    if evaluation.val is not None:
        scalars.update({f"val/oa/{head}": value for head, value in evaluation.val["oa"].items()})
    tb.scalars(scalars, epoch)
    tb.confusion_matrix(np.asarray(metrics["confusion_matrix"]), class_names, epoch)


def _select(evaluation: EpochEvaluation, state: RunState, train_scalars: dict[str, float], epochs: int) -> bool:
    """This epoch's metrics into the state and the log; True if validation improved."""
    epoch = state.epoch
    metrics = state.last_metrics = evaluation.test
    record = {"epoch": epoch, "wall_time_s": round(state.wall_time_s, 3), "test_accuracy": metrics["accuracy"],
              "oa": metrics["oa"], **_rounded(train_scalars)}
    val = evaluation.val
    if val is not None:
        record["val_accuracy"] = val["accuracy"]
    improved = val is not None and (state.selected is None or val["accuracy"] > state.selected["val_accuracy"])
    if improved:
        state.selected = {"epoch": epoch, "val_accuracy": val["accuracy"], "metrics": metrics}
    state.history.append(record)
    chosen = state.selected
    picked = f", validation {record['val_accuracy']:.2f} % (selected: epoch {chosen['epoch']})" if chosen else ""
    log.info("epoch %d/%d: test accuracy %.2f %%%s, %s", epoch, epochs, metrics["accuracy"], picked,
             ", ".join(f"{head} {value:.2f}" for head, value in metrics["oa"].items()))
    return improved


def checkpoint_payload(config: dict[str, Any], data: DataBundle, model: torch.nn.Module,
                        optimizer: torch.optim.Optimizer, strategy: Strategy, state: RunState) -> dict[str, Any]:
    """A checkpoint's contents: the live model, optimizer, scheduler and run state, the data's facts, the config,
    and the torchrun job that wrote it (``TORCHRUN_JOB_KEY``: its workers started again go on from it)."""
    return {TORCHRUN_JOB_KEY: os.environ.get("TORCHELASTIC_RUN_ID"), "model_config": model.model_config,
            "model_state": model.state_dict(), "class_names": data.class_names,
            "image_size": data.image_size, "mean": list(data.mean), "std": list(data.std),
            "bands": None if data.bands is None else data.bands.to_metadata(), "footprint": data.footprint,
            "optimizer_state": optimizer.state_dict(), "strategy_state": strategy.state_dict(), "config": config,
            **state.as_payload()}


def _save_checkpoints(run_dir: Path, payload: dict[str, Any], improved: bool) -> None:
    """``last.pt`` after every epoch (what resume reads); ``best.pt`` when validation improved."""
    save_checkpoint(run_checkpoint_path(run_dir, "last.pt"), payload)
    if improved:
        save_checkpoint(run_checkpoint_path(run_dir, "best.pt"), payload)


def log_what_the_model_sees(config: dict[str, Any], data: DataBundle, model: torch.nn.Module, tb: TensorBoardLogger,
                            attention_ids: list[int], epoch: int, writer: BackgroundWriter) -> None:
    """Attention maps of every branch, and the main branch's features of ``log.embedding_images`` test images: the
    model's forward passes here, on its device (the live model); their drawing and writing by ``writer``."""
    images = np.stack([data.test.raw(index) for index in attention_ids])
    tiles = attention_tiles(model, images, data.mean, data.std, data.class_names,
                            [int(data.test.labels[index]) for index in attention_ids], data.bands)
    indices = pick_embedding_images(data.test.labels, config["log"]["embedding_images"])
    batch = eval_batch_size(config["eval_batch_size"], next(model.parameters()).device, config["batch_size"])
    features = dataset_features(model, data.test, indices, batch_size=batch)

    def write() -> None:
        tb.attention_pages(tiles, epoch)
        tb.embeddings(features, *embedding_labels(data.test, indices), epoch)

    submit_extra(writer, "attention maps and embedding projector", epoch, write)


def protocol(config: dict[str, Any], data: DataBundle) -> dict[str, Any]:
    """What makes two runs comparable (grouped by in ``rsnet-aggregate``): the evaluation protocol and budget."""
    dataset = config["dataset"]
    return {"dataset": dataset["name"], "data": dataset_folder(dataset["name"], dataset["root"], dataset.get("bands")),
            "train_ratio": data.split.train_ratio, "val_ratio": data.split.val_ratio,
            "image_size": data.image_size, "pretrained": pretrained_tag(config["backbone"]["pretrained"]),
            "epochs": config["epochs"], "eval_every": int(config["eval_every"]),
            "selection": "validation" if data.val is not None else "last epoch"}


def run_summary(config: dict[str, Any], data: DataBundle, state: RunState,
                scheduler: dict[str, Any]) -> dict[str, Any]:
    """The metrics.json document: the test metrics of the selected (else last evaluated) epoch and the run's facts,
    floats rounded (:func:`rounded_numbers`)."""
    epochs_done, wall, selected = state.epoch, state.wall_time_s, state.selected
    headline = selected["metrics"] if selected else state.last_metrics
    summary = {
        "dataset": config["dataset"]["name"], "model": config["model"]["arch"], "backbone": config["backbone"]["name"],
        "trainer": config["trainer"]["name"], "seed": config["seed"], "protocol": protocol(config, data),
        "eval_amp": config["eval_amp"],
        "epochs": epochs_done, "epochs_planned": config["epochs"], "train_samples": len(data.train),
        "val_samples": len(data.val) if data.val is not None else 0, "test_samples": len(data.test),
        "wall_time_s": round(wall, 2), "images_per_s": round(len(data.train) * epochs_done / wall, 2) if wall else 0.0,
        **headline}
    if selected:
        last = state.last_metrics
        summary.update(selected_epoch=selected["epoch"], val_accuracy=selected["val_accuracy"],
                       last_epoch_test={"accuracy": last["accuracy"], "oa": last["oa"]})
    if state.changes:
        summary["membership_changes"] = state.changes
    return rounded_numbers({**summary, "scheduler": scheduler, "history": state.history})


def _rounded(scalars: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 5) for key, value in scalars.items()}
