"""The typed config schema (rsnet/config_schema.py): Hydra refuses a value of the wrong type while composing, in
one line naming the setting; every shipped yaml fills every typed key; the code's defaults are the yamls'."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from helpers import CONF, compose_command
from omegaconf import OmegaConf

from rsnet.commands.overrides import check_overrides
from rsnet.config_schema import TRAINER_SCHEMAS, DatasetSchema, TrainSchema
from rsnet.losses import MultiBranchLoss
from rsnet.models import MODELS


def refusal(*argv: str) -> str:
    """rsnet-train's one-line refusal of these command-line arguments (before Hydra runs the job)."""
    with pytest.raises(ValueError) as refused:
        check_overrides("config", list(argv), "rsnet-train")
    return str(refused.value)


@pytest.mark.parametrize("argv, message", [
    (["optimizer.lr=abc"], "optimizer.lr='abc': must be a number"),  # before any worker starts
    (["dataset.train_ratio=abc"], "dataset.train_ratio='abc': must be a number"),
    (["seed=abc"], "seed='abc': must be a whole number"),
    (["seed=1.5"], "seed=1.5: must be a whole number"),
    (["epochs=true"], "epochs=True: must be a whole number"),
    (["eval_every=2.5"], "eval_every=2.5: must be a whole number"),
    (["dataset.image_size=32.5"], "dataset.image_size=32.5: must be a whole number"),  # not cut to 32
    (["compile=maybe"], "compile='maybe': must be true or false"),
    (["max_grad_norm=abc"], "max_grad_norm='abc': must be a number or null"),
    (["log.attention_images=x"], "log.attention_images='x': must be a whole number or null"),
    (["lr_schedule.milestones=[0.5,x]"], "lr_schedule.milestones[1]='x': must be a number"),
    (["trainer.timeout_s=null"], "trainer.timeout_s=None: must be a number"),
    (["trainer.merge_rounds=x"], "trainer.merge_rounds='x': must be a whole number"),
    (["trainer=sync", "trainer.interval_steps=2.5"], "trainer.interval_steps=2.5: must be a whole number"),
    (["trainer=local_sgd", "trainer.torch_averager=x"], "trainer.torch_averager='x': must be true or false"),
    (["optimizer=3"], "optimizer=3: optimizer holds settings; set one of them (optimizer.<key>=value)"),
    (["model.options=3"], "model.options=3: model.options holds settings; set one of them (model.options.<key>=value)"),
    (["-m", "seed=0,1", "optimizer.lr=0.1,abc"], "optimizer.lr='abc': must be a number"),  # each value of a sweep
    (["-m", "model=baseline,foo"], "model=foo: there is no such model; choose one of baseline, esd_mbenet, "),
])
def test_a_value_of_the_wrong_type_is_refused_in_one_line_naming_the_setting(argv: list[str], message: str) -> None:
    assert refusal(*argv) == message or refusal(*argv).startswith(message)
    assert "\n" not in refusal(*argv)


def test_the_schemas_are_not_offered_as_options() -> None:
    assert refusal("trainer=synk") == "trainer=synk: there is no such trainer; choose one of adaptive, local_sgd, " \
                                      "static, sync"


@pytest.mark.parametrize("trainer", sorted(TRAINER_SCHEMAS))
def test_every_shipped_trainer_is_typed_and_fills_every_key(trainer: str) -> None:
    config = compose_command("config", f"trainer={trainer}")
    assert OmegaConf.get_type(config) is TrainSchema and OmegaConf.get_type(config.trainer) is TRAINER_SCHEMAS[trainer]
    OmegaConf.to_container(config, throw_on_missing=True)  # raises MissingMandatoryValue for a key without value


@pytest.mark.parametrize("dataset", sorted(path.stem for path in (CONF / "dataset").glob("*.yaml")))
def test_every_shipped_dataset_fills_every_key(dataset: str) -> None:
    config = compose_command("config", f"dataset={dataset}")
    assert OmegaConf.get_type(config.dataset) is DatasetSchema
    OmegaConf.to_container(config, throw_on_missing=True)


def test_a_searchpath_on_the_command_line_is_composed_with(tmp_path: Path) -> None:
    """The up-front check composes with hydra.searchpath: a dataset of the user's own config dir is accepted, and a
    typo in its keys is named."""
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "mine.yaml").write_text("defaults: [image_folder, _self_]\nroot: /data/mine\n")
    check_overrides("config", [f"hydra.searchpath=[file://{tmp_path}]", "dataset=mine"], "rsnet-train")
    assert refusal(f"hydra.searchpath=[file://{tmp_path}]", "dataset=mine", "dataset.roots=/x").startswith(
        "dataset.roots=/x: there is no setting 'roots' in dataset (did you mean 'dataset.root'?)")


def test_the_loss_defaults_are_esd_mbenets_recipe() -> None:
    """MultiBranchLoss() trains as conf/model/esd_mbenet.yaml does (it had label_smoothing 0.0 against 0.1)."""
    defaults = {name: parameter.default for name, parameter in
                inspect.signature(MultiBranchLoss.__init__).parameters.items() if name != "self"}
    assert defaults == OmegaConf.to_container(OmegaConf.load(CONF / "model" / "esd_mbenet.yaml").loss)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_each_model_yaml_gives_its_options_the_code_defaults(arch: str) -> None:
    """A model built from Python (build_model without options) is the model rsnet-train builds. Two differences:
    ``image_size: auto``, which rsnet-train fills from dataset.image_size and Python leaves None (geometry as set)
    until given a size; and MGML-FENet's ``main_heads: auto``, none in Python, since a model_config without the key
    (every checkpoint made before it) must rebuild the model it was: no heads."""
    options = OmegaConf.to_container(OmegaConf.load(CONF / "model" / f"{arch}.yaml").options)
    if "image_size" in options:
        assert options["image_size"] == "auto"
        options["image_size"] = None
    if "main_heads" in options:
        assert options["main_heads"] == "auto"
        options["main_heads"] = []
    signature = inspect.signature(MODELS[arch].__init__).parameters
    code = {name: list(value) if isinstance(value := signature[name].default, tuple) else value for name in options}
    assert code == options


def test_a_config_dir_is_composed_with_and_a_yaml_that_leaves_a_typed_key_empty_is_named(tmp_path: Path) -> None:
    """The up-front check composes with --config-dir (a typo in the user's dataset is named), and a dataset yaml of
    the user's own that leaves a required key unset is refused naming it (``--help`` still shows)."""
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "mine.yaml").write_text("defaults: [image_folder, _self_]\nroot: /data/mine\n")
    (tmp_path / "dataset" / "bare.yaml").write_text("name: image_folder\nroot: /data\ntrain_ratio: 0.5\n"
                                                    "image_size: 64\n")
    check_overrides("config", ["--config-dir", str(tmp_path), "dataset=mine"], "rsnet-train")
    assert refusal(f"--config-dir={tmp_path}", "dataset=mine", "dataset.roots=/x").startswith(
        "dataset.roots=/x: there is no setting 'roots' in dataset")
    assert refusal("-cd", str(tmp_path), "dataset=bare").startswith(
        "dataset.val_ratio=... is required: the chosen dataset yaml does not set it")
    check_overrides("config", ["-cd", str(tmp_path), "dataset=bare", "--help"], "rsnet-train")  # help still shows
