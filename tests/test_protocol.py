"""The protocol bookkeeping: run folder names, evaluation every N epochs, the sweep's table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rsnet.engine.epoch_end import evaluates_after
from rsnet.settings import pretrained_tag, protocol_folder

REPO = Path(__file__).resolve().parent.parent
TINY = ["backbone=test_resnet", "dataset.image_size=32", "batch_size=32", "log.progress_bar=false",
        "trainer.devices=[cpu]", "model=baseline"]


@pytest.mark.parametrize("args, folder", [
    ((0.5, 0.0, 64, False), "r0.5_64px_scratch"),
    ((0.2, 0.1, 224, True), "r0.2_val0.1_224px_pretrained"),
    ((0.8, None, 256, "/weights/resnet50_a1.pth"), "r0.8_256px_resnet50_a1"),
])
def test_protocol_folder_names_ratio_validation_size_and_weights(args: tuple, folder: str) -> None:
    assert protocol_folder(*args) == folder


def test_pretrained_tags() -> None:
    assert [pretrained_tag(value) for value in (False, None, True, "w/densenet121.pth")] == \
        ["scratch", "scratch", "pretrained", "densenet121"]


def test_every_nth_epoch_and_the_last_are_evaluated() -> None:
    config = {"epochs": 7, "eval_every": 3}
    assert [epoch for epoch in range(1, 8) if evaluates_after(epoch, config)] == [3, 6, 7]
    assert all(evaluates_after(epoch, {"epochs": 7}) for epoch in range(1, 8))


def train(*args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), *flags, *TINY, *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow
def test_eval_every_tests_every_nth_epoch_and_the_last(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train("epochs=3", "eval_every=2", f"hydra.run.dir={run_dir}", "log.attention_every=100")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [("test_accuracy" in row) for row in metrics["history"]] == [False, True, True]
    assert metrics["protocol"]["eval_every"] == 2 and metrics["accuracy"] == metrics["history"][-1]["test_accuracy"]
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("test/oa/main")] == [2, 3]
    assert [event.step for event in events.Scalars("train/loss/total")] == [1, 2, 3]


@pytest.mark.slow
def test_a_sweep_over_ratios_writes_one_folder_per_protocol_and_prints_the_papers_table(tmp_path: Path) -> None:
    result = train("epochs=1", "dataset.train_ratio=0.5,0.6", f"hydra.sweep.dir={tmp_path}", flags=("-m",))
    runs = sorted(str(path.parent.relative_to(tmp_path)) for path in tmp_path.rglob("metrics.json"))
    assert runs == ["ucmerced_mini/r0.5_32px_scratch/baseline_test_resnet/seed0",
                    "ucmerced_mini/r0.6_32px_scratch/baseline_test_resnet/seed0"]
    assert f"rsnet-aggregate folders={tmp_path}" in result.stdout
    assert "| method | train 50% | train 60% |" in result.stdout
    assert "| baseline (test_resnet) | " in result.stdout
