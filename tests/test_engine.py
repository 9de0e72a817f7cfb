"""Unit tests of the training loop's pure parts: lr schedule, config checks, atomic checkpoints."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from rsnet.engine.checkpoint import load_checkpoint, save_checkpoint
from rsnet.engine.config_checks import ConfigError, check_run_dir, check_training_config
from rsnet.engine.lr_schedule import learning_rate

CONFIG = {
    "epochs": 2, "batch_size": 8, "eval_batch_size": 8,
    "dataset": {"name": "ucmerced_mini", "train_ratio": 0.8, "image_size": 64},
    "model": {"arch": "baseline"}, "backbone": {"name": "test_resnet"},
    "trainer": {"devices": ["cpu", "cpu"]}, "lr_schedule": {"name": "cosine"},
}


def test_warmup_then_cosine_reaches_floor() -> None:
    kwargs = dict(base_lr=0.1, epochs=10, warmup_epochs=2, min_lr_ratio=0.01)
    assert learning_rate(0.0, **kwargs) < learning_rate(1.0, **kwargs) < learning_rate(2.0, **kwargs)
    assert learning_rate(2.0, **kwargs) == pytest.approx(0.1)
    assert learning_rate(10.0, **kwargs) == pytest.approx(0.001)
    values = [learning_rate(2 + e / 4, **kwargs) for e in range(33)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_step_schedule_decays_at_milestones() -> None:
    kwargs = dict(base_lr=1.0, epochs=10, name="step", milestones=[0.5, 0.8], gamma=0.1)
    assert [learning_rate(e, **kwargs) for e in (4.9, 5.0, 8.0)] == pytest.approx([1.0, 0.1, 0.01])
    with pytest.raises(ValueError, match="linear"):
        learning_rate(0.0, base_lr=1.0, epochs=1, name="linear")


def test_valid_config_passes() -> None:
    check_training_config(copy.deepcopy(CONFIG), num_workers=2)


@pytest.mark.parametrize("path, value, needle", [
    (("batch_size",), 0, "batch_size=0"),
    (("batch_size",), 1, "number of workers"),
    (("epochs",), -1, "epochs=-1"),
    (("dataset", "train_ratio"), 0.0, "dataset.train_ratio"),
    (("model", "arch"), "resnet_ensemble", "esd_mbenet"),
    (("dataset", "image_size"), 8, "dataset.image_size=8"),
    (("lr_schedule", "name"), "linear", "lr_schedule.name"),
])
def test_bad_settings_name_what_to_fix(path: tuple[str, ...], value: object, needle: str) -> None:
    config = copy.deepcopy(CONFIG)
    target = config
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        check_training_config(config, num_workers=2)


def test_run_dir_guards_earlier_runs(tmp_path: Path) -> None:
    assert check_run_dir(tmp_path, resume=False, overwrite=False) is None
    with pytest.raises(ConfigError, match="does not exist"):
        check_run_dir(tmp_path, resume=True, overwrite=False)
    last = tmp_path / "checkpoints" / "last.pt"
    last.parent.mkdir()
    last.write_bytes(b"x")
    with pytest.raises(ConfigError, match="trainer.resume=true"):
        check_run_dir(tmp_path, resume=False, overwrite=False)
    assert check_run_dir(tmp_path, resume=False, overwrite=True) is None
    assert check_run_dir(tmp_path, resume=True, overwrite=False) == last


def test_checkpoint_write_is_atomic_and_validated(tmp_path: Path) -> None:
    payload = {"model_config": {"arch": "baseline"}, "model_state": {"w": torch.ones(2)}, "class_names": ["a"],
               "image_size": 64, "mean": [0.0] * 3, "std": [1.0] * 3}
    path = save_checkpoint(tmp_path / "ck" / "last.pt", payload)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left behind
    assert load_checkpoint(path)["format_version"] == 1
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not an rsnet training checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
