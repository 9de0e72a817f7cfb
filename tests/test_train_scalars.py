"""The epoch's training scalars (train/* in TensorBoard, the history, the curves) count every worker's samples."""

from __future__ import annotations

import pytest
import torch

from rsnet.engine.epoch_loop import EpochMeter, EpochTotals, group_train_scalars
from rsnet.parallel import launch


def _totals(samples: int, correct: int, loss: float, data_s: float, compute_s: float,
            lr: float | None = 0.1) -> EpochTotals:
    busy = data_s + compute_s
    return EpochTotals(samples=samples, steps=samples // 2, correct=correct,
                       loss_sums={"total": loss} if samples else {}, data_seconds=data_s, busy_seconds=busy,
                       slowest_busy_seconds=busy, lr=lr if samples else None)


def test_unequal_shares_add_up_and_the_slowest_worker_times_the_epoch() -> None:
    """Worker 0: 10 samples, 5 right, loss sum 20, 1 s data + 1 s compute; worker 1: 30 samples, 27 right, loss
    sum 30, 0 s + 3 s: loss 50 / 40, accuracy 32 / 40, 40 images over the slowest worker's 3 s, 1 s of 5 waiting."""
    group = EpochTotals.combined([_totals(10, 5, 20.0, 1.0, 1.0, lr=0.1), _totals(30, 27, 30.0, 0.0, 3.0, lr=0.3)])
    assert (group.samples, group.steps, group.correct) == (40, 20, 32)
    assert group.summary() == pytest.approx({"train/loss/total": 1.25, "train/oa_main": 80.0,
                                             "train/images_per_s": 40 / 3, "train/data_stall": 0.2, "train/lr": 0.1,
                                             "train/samples": 40})


def test_a_worker_left_out_counts_for_nothing_and_divides_by_nothing() -> None:
    """Worker 0 trained no sample (left out): the scalars are worker 1's, the lr its own; a lone empty worker's
    scalars are 0."""
    empty = EpochMeter().totals()
    assert empty == _totals(0, 0, 0.0, 0.0, 0.0)
    alone = _totals(8, 6, 4.0, 0.5, 1.5, lr=0.3)
    assert EpochTotals.combined([empty, alone]).summary() == alone.summary() == pytest.approx(
        {"train/loss/total": 0.5, "train/oa_main": 75.0, "train/images_per_s": 4.0, "train/data_stall": 0.25,
         "train/lr": 0.3, "train/samples": 8})
    assert empty.summary() == {"train/oa_main": 0.0, "train/images_per_s": 0.0, "train/data_stall": 0.0,
                               "train/lr": 0.0, "train/samples": 0}


def test_a_meters_totals_are_its_sums_on_the_host() -> None:
    meter = EpochMeter()
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    meter.update({"total": torch.tensor(2.0)}, logits, torch.tensor([0, 0, 0]), lr=0.05)
    meter.update({"total": torch.tensor(1.0)}, logits[:1], torch.tensor([1]), lr=0.04)
    meter.data_seconds, meter.compute_seconds = 1.0, 3.0
    assert meter.totals() == EpochTotals(samples=4, steps=2, correct=2, loss_sums={"total": 7.0}, data_seconds=1.0,
                                         busy_seconds=4.0, slowest_busy_seconds=4.0, lr=0.04)


def _worker_scalars(ctx, shares: list[int]) -> dict[str, float] | None:
    """A meter of ``shares[rank]`` samples, right when the label is even, each with loss = its label; the group's
    scalars (on rank 0)."""
    meter = EpochMeter()
    first = sum(shares[:ctx.rank])
    for label in range(first, first + shares[ctx.rank]):
        logits = torch.tensor([[1.0, 0.0]])
        meter.update({"total": torch.tensor(float(label))}, logits, torch.tensor([label % 2]), lr=0.1 * (ctx.rank + 1))
    meter.data_seconds, meter.compute_seconds = 0.0, float(shares[ctx.rank])
    return group_train_scalars(ctx, meter)


@pytest.mark.parametrize("shares", [[0, 6], [2, 4]])
def test_the_primary_logs_every_workers_samples(shares: list[int]) -> None:
    """Two gloo workers, samples 0..5 split as ``shares``: the primary's scalars are those of all six (loss
    (0 + ... + 5) / 6 = 2.5, labels 0, 2, 4 right), whether it trained none of them or a third."""
    scalars = launch(_worker_scalars, ["cpu", "cpu"], shares, timeout_s=30.0)
    first_lr = 0.1 if shares[0] else 0.2
    assert scalars == pytest.approx({"train/loss/total": 2.5, "train/oa_main": 50.0,
                                     "train/images_per_s": 6 / max(shares), "train/data_stall": 0.0,
                                     "train/lr": first_lr, "train/samples": 6})
