"""Evaluation sharded over the workers gives exactly the metrics of one process evaluating everything."""

from __future__ import annotations

import numpy as np
import torch
from helpers import MINI_ROOT, REPO, StandInModel, TensorDataset
from omegaconf import OmegaConf
from torch import nn

from rsnet.data import SceneDataset, build_datasets
from rsnet.engine.sharded_eval import concatenate, shard_bounds, sharded_evaluate
from rsnet.evaluation import EvalFeed, EvalResult, compute_metrics, evaluate
from rsnet.parallel import WorkerContext, launch
from rsnet.parallel.strategies import build_strategy

CLASSES = list("abcd")


def _model(num_classes: int = len(CLASSES)) -> StandInModel:
    torch.manual_seed(3)
    return StandInModel(num_classes=num_classes).eval()


CASES = [
    (2, None),  # equal slices; 2 < 3 workers: one worker's slice is empty
    (11, [50.0, 1.0, 0.0]),  # by speed: a slow worker takes a small slice, a worker left out none
    (210, [3.0, 1.0, 2.0]),  # a SceneDataset (the bundled sample's test split), read from its cache in batches
]


def _dataset(num_samples: int) -> tuple[TensorDataset | SceneDataset, list[str]]:
    """The case's dataset and its classes."""
    if num_samples == 210:
        test = build_datasets("ucmerced_mini", MINI_ROOT, 0.5, 0, 16).test
        return test, test.class_names
    return TensorDataset(n=num_samples, size=16), CLASSES


def _sharded_worker(ctx, cases: list[tuple[int, list[float] | None]]):
    """Each case evaluated by the three workers in turn (one launch: a launch's start-up costs more than the work)."""
    results = []
    for num_samples, shares in cases:
        dataset, classes = _dataset(num_samples)
        result = sharded_evaluate(ctx, _model(len(classes)), dataset, batch_size=4, shares=shares,
                                  feed=EvalFeed(prefetch=ctx.rank != 1))  # rank 1 reads its batches inline
        results.append(None if result is None else (result, compute_metrics(result, classes)))
    return results


def test_three_workers_get_the_single_process_predictions_and_metrics() -> None:
    outcomes = launch(_sharded_worker, ["cpu", "cpu", "cpu"], CASES, timeout_s=120)
    for (num_samples, shares), (result, metrics) in zip(CASES, outcomes, strict=True):
        dataset, classes = _dataset(num_samples)
        alone = evaluate(_model(len(classes)), dataset, batch_size=4)
        assert metrics == compute_metrics(alone, classes), (num_samples, shares)
        np.testing.assert_array_equal(result.targets, alone.targets)
        for head in alone.predictions:
            np.testing.assert_array_equal(result.predictions[head], alone.predictions[head])
            np.testing.assert_allclose(result.probabilities[head], alone.probabilities[head], rtol=0, atol=1e-6)


def test_concatenate_puts_every_slice_back_in_its_place() -> None:
    targets = np.arange(7) % 3
    whole = EvalResult(predictions={"main": np.arange(7)}, probabilities={"main": np.eye(7, 3, dtype=np.float32)},
                       targets=targets)
    bounds = [0, 4, 4, 7]  # the middle worker's slice is empty
    shards = [EvalResult({"main": whole.predictions["main"][a:b]}, {"main": whole.probabilities["main"][a:b]},
                         targets[a:b]) if b > a else None for a, b in zip(bounds, bounds[1:])]
    merged = concatenate(shards)
    np.testing.assert_array_equal(merged.predictions["main"], np.arange(7))
    np.testing.assert_array_equal(merged.probabilities["main"], whole.probabilities["main"])
    np.testing.assert_array_equal(merged.targets, targets)


def test_slices_follow_the_shares() -> None:
    """A GPU 50x faster than the CPU beside it evaluates 50/51 of the set; a worker left out (share 0) nothing;
    shares that are all 0 (no speed measured yet) split equally; the slices always cover the set once."""
    assert shard_bounds(10_200, [50.0, 1.0]) == [0, 10_000, 10_200]
    assert shard_bounds(9, [2.0, 0.0, 1.0]) == [0, 6, 6, 9]
    assert shard_bounds(10, [0.0, 0.0]) == [0, 5, 10]
    assert shard_bounds(0, [1.0, 1.0, 1.0]) == [0, 0, 0, 0]


def test_the_adaptive_scheduler_shares_evaluation_by_measured_speed() -> None:
    """Equal shares until a speed is measured; then the speeds, with 0 for a worker left out (the same list on every
    worker: each moves its schedule on from the same merged table)."""
    trainer = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "trainer" / "adaptive.yaml"))
    ctx = WorkerContext(rank=0, world_size=3, device=torch.device("cpu"), store=None, is_primary=True)
    strategy = build_strategy(trainer, ctx, nn.Linear(2, 2), 64, 24, 0)
    assert strategy.work_shares() == [1.0, 1.0, 1.0]
    strategy.schedule.speeds, strategy.schedule.active = [300.0, 6.0, 2.0], [True, True, False]
    assert strategy.work_shares() == [300.0, 6.0, 0.0]
