"""Evaluation sharded over the workers gives exactly the metrics of one process evaluating everything."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import StandInModel, TensorDataset

from rsnet.engine.sharded_eval import interleave, sharded_evaluate
from rsnet.evaluation import EvalResult, compute_metrics, evaluate
from rsnet.parallel import launch

CLASSES = list("abcd")


def _model() -> StandInModel:
    torch.manual_seed(3)
    return StandInModel(num_classes=len(CLASSES)).eval()


def _sharded_worker(ctx, num_samples: int):
    result = sharded_evaluate(ctx, _model(), TensorDataset(n=num_samples, size=16), batch_size=4)
    return None if result is None else (result, compute_metrics(result, CLASSES))


@pytest.mark.parametrize("num_samples", [11, 2])  # 2 < 3 workers: one worker's shard is empty
def test_three_workers_get_the_single_process_predictions_and_metrics(num_samples: int) -> None:
    result, metrics = launch(_sharded_worker, ["cpu", "cpu", "cpu"], num_samples, timeout_s=120)
    alone = evaluate(_model(), TensorDataset(n=num_samples, size=16), batch_size=4)
    assert metrics == compute_metrics(alone, CLASSES)
    np.testing.assert_array_equal(result.targets, alone.targets)
    for head in alone.predictions:
        np.testing.assert_array_equal(result.predictions[head], alone.predictions[head])
        np.testing.assert_allclose(result.probabilities[head], alone.probabilities[head], rtol=0, atol=1e-6)


def test_interleave_puts_every_sample_back_in_its_place() -> None:
    targets = np.arange(7) % 3
    whole = EvalResult(predictions={"main": np.arange(7)}, probabilities={"main": np.eye(7, 3, dtype=np.float32)},
                       targets=targets)
    shards = [EvalResult({"main": whole.predictions["main"][r::3]}, {"main": whole.probabilities["main"][r::3]},
                         targets[r::3]) for r in range(3)]
    merged = interleave(shards, 7)
    np.testing.assert_array_equal(merged.predictions["main"], np.arange(7))
    np.testing.assert_array_equal(merged.probabilities["main"], whole.probabilities["main"])
    np.testing.assert_array_equal(merged.targets, targets)
