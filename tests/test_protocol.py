"""The protocol bookkeeping: run folder names, evaluation every N epochs, the sweep's table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, compose_command, run_train
from omegaconf import OmegaConf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rsnet.engine.epoch_end import evaluates_after
from rsnet.run_folders import parse_pretrained, pretrained_tag, protocol_folder

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


@pytest.mark.parametrize(("value", "tag"), [("TRUE", "pretrained"), (" true", "pretrained"), ("False", "scratch"),
                                            ("", "scratch")])
def test_the_folder_names_the_weights_the_model_is_built_with(value: str, tag: str) -> None:
    """The run folder and protocol.pretrained read ``backbone.pretrained`` as the model does: one parser for both."""
    assert pretrained_tag(value) == tag and parse_pretrained(value) is (tag == "pretrained")


def test_every_nth_epoch_and_the_last_are_evaluated() -> None:
    config = {"epochs": 7, "eval_every": 3}
    assert [epoch for epoch in range(1, 8) if evaluates_after(epoch, config)] == [3, 6, 7]
    assert all(evaluates_after(epoch, {"epochs": 7, "eval_every": 1}) for epoch in range(1, 8))


def train_sweep(*args: str) -> subprocess.CompletedProcess:
    """scripts/train.py -m (a Hydra multirun) as a user runs it, with ``TINY`` and ``args``."""
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "train.py"), "-m", *TINY, *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result


def floats_in(document: object) -> list[float]:
    """Every float of a JSON document, nested dicts and lists walked."""
    if isinstance(document, float):
        return [document]
    values = document.values() if isinstance(document, dict) else document if isinstance(document, list) else []
    return [value for item in values for value in floats_in(item)]


@pytest.mark.slow
def test_eval_every_tests_every_nth_epoch_and_the_last(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert run_train(run_dir, *TINY, "epochs=3", "eval_every=2", "log.attention_every=100") == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [("test_accuracy" in row) for row in metrics["history"]] == [False, True, True]
    assert metrics["protocol"]["eval_every"] == 2 and metrics["accuracy"] == metrics["history"][-1]["test_accuracy"]
    assert all(value == round(value, 6) for value in floats_in(metrics))  # 0.6, not 0.6000000000000001
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("test/oa/main")] == [2, 3]
    assert [event.step for event in events.Scalars("train/loss/total")] == [1, 2, 3]


@pytest.mark.slow
def test_a_sweep_over_ratios_writes_one_folder_per_protocol_and_prints_the_papers_table(tmp_path: Path) -> None:
    # without the attention pages of every class and the projector's images: seconds that this test reads nothing of
    result = train_sweep("epochs=1", "dataset.train_ratio=0.5,0.6", f"hydra.sweep.dir={tmp_path}",
                         "log.attention_images=1", "log.embedding_images=0")
    runs = sorted(str(path.parent.relative_to(tmp_path)) for path in tmp_path.rglob("metrics.json"))
    assert runs == ["ucmerced_mini/r0.5_32px_scratch/baseline_test_resnet/seed0",
                    "ucmerced_mini/r0.6_32px_scratch/baseline_test_resnet/seed0"]
    assert f"rsnet-aggregate folders={tmp_path}" in result.stdout
    assert "| method | train 50% | train 60% |" in result.stdout
    assert "| baseline (test_resnet) | " in result.stdout


@pytest.mark.parametrize("preset, dataset, ratios", [
    ("paper_aid", "aid", "0.2,0.5"), ("paper_nwpu_resisc45", "nwpu_resisc45", "0.1,0.2"),
    ("paper_ucmerced", "ucmerced", "0.5,0.8"),
])
def test_paper_presets_set_the_recipe_and_sweep_the_protocol(preset: str, dataset: str, ratios: str) -> None:
    cfg = compose_command("config", f"experiment={preset}", return_hydra_config=True)
    assert cfg.dataset.name == dataset and cfg.dataset.image_size == 224 and cfg.epochs == 60
    assert cfg.backbone.name == "resnet50" and cfg.backbone.pretrained is True
    assert dict(cfg.hydra.sweeper.params) == {"dataset.train_ratio": ratios, "model": "baseline,esd_mbenet,mgml_fenet",
                                              "seed": "0,1,2,3,4"}
    assert cfg.hydra.sweep.dir == f"multirun/{preset}"


def test_the_cpu_preset_is_the_recipe_check() -> None:
    cfg = compose_command("config", "experiment=cpu_aid_dev", "backbone=test_resnet", return_hydra_config=True)
    assert (cfg.dataset.name, cfg.dataset.image_size, cfg.dataset.train_ratio, cfg.epochs) == ("aid", 64, 0.5, 30)
    assert cfg.backbone.name == "test_resnet"  # a command-line group choice wins over the preset's


@pytest.mark.parametrize("override, message", [
    ("dataset.val_ratio=1.0", "dataset.val_ratio"), ("dataset.val_ratio=-0.1", "dataset.val_ratio"),
    ("eval_every=0", "eval_every=0: must be a positive integer"),  # eval_every=2.5: the schema's (test_config_schema)
])
def test_bad_protocol_settings_are_refused_before_training(override: str, message: str) -> None:
    from rsnet.engine.config_checks import ConfigError, check_training_config

    cfg = compose_command("config", "backbone=test_resnet", override, return_hydra_config=True)
    config = OmegaConf.to_container(cfg, resolve=False)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_training_config(config)
