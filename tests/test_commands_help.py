"""One CLI style: every command is a Hydra app whose --help lists its own settings and groups, from its config."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, compose_command
from omegaconf import OmegaConf

from rsnet.cli import check_no_bare_words, check_renamed_setting
from rsnet.commands.help import command_help

CONF = REPO / "conf"
# command config -> the config groups its help must list (the others it does not read)
COMMANDS = {"config": {"dataset", "model", "backbone", "trainer"}, "evaluate": {"dataset"}, "predict": set(),
            "export": set(), "aggregate": set()}
GROUPS = {"dataset", "model", "backbone", "trainer"}


def own_keys(config_name: str) -> set[str]:
    config = OmegaConf.load(CONF / f"{config_name}.yaml")
    return {str(key) for key in config} - {"defaults", "hydra"}


@pytest.mark.parametrize("config_name", sorted(COMMANDS))
def test_help_lists_the_commands_own_keys_and_groups_only(config_name: str) -> None:
    text = command_help(config_name).replace("$$", "$")
    settings = text.split("== Settings (key=value) ==", 1)[1]
    for key in own_keys(config_name):
        assert f"\n{key}:" in settings, key
    listed = {line.split(":", 1)[0] for line in text.splitlines() if line.split(":", 1)[0] in GROUPS}
    assert listed == COMMANDS[config_name]
    assert text.startswith(f"rsnet-{'train' if config_name == 'config' else config_name}: ")  # what it does


@pytest.mark.parametrize("config_name", sorted(COMMANDS))
def test_every_command_config_renders_its_own_help(config_name: str) -> None:
    config = OmegaConf.load(CONF / f"{config_name}.yaml")
    assert OmegaConf.to_container(config.hydra.help)["template"] == f"${{rsnet_help:{config_name}}}"


def test_help_escapes_dollar_signs_for_hydras_template() -> None:
    # config.yaml has run_dir: ${hydra:runtime.output_dir}; string.Template would fail on a single "$"
    assert "run_dir: $${hydra:runtime.output_dir}" in command_help("config")


def test_the_same_device_default_everywhere() -> None:
    assert OmegaConf.load(CONF / "predict.yaml").device == OmegaConf.load(CONF / "evaluate.yaml").device == "auto"
    for trainer in (CONF / "trainer").glob("*.yaml"):
        assert compose_command("config", f"trainer={trainer.stem}").trainer.devices == "auto", trainer


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_help_through_hydra_lists_the_commands_own_settings() -> None:
    """One interpreter for the real --help path (Hydra, its template, our resolver): evaluate's help lists the
    dataset group it reads but not the training groups it ignores."""
    result = _script("evaluate.py", "--help")
    assert result.returncode == 0, result.stderr
    options = ", ".join(sorted(path.stem for path in (CONF / "dataset").glob("*.yaml")))
    assert f"dataset: {options}  (default: the run's own)" in result.stdout
    settings = result.stdout.split("== Settings (key=value) ==\n")[1].split("\n\n")[0]
    assert [line.split(":")[0] for line in settings.splitlines() if not line.startswith(" ")] == [
        # conf/evaluate.yaml's, no training setting
        "checkpoint", "seed", "batch_size", "device", "out", "progress_bar", "tta", "amp"]
    assert "tta: none " in settings and "backbone:" not in result.stdout and "trainer:" not in result.stdout


def test_predicts_old_model_key_is_named() -> None:
    refused = _script("predict.py", "model=run/best.pt", "images=x")
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: model=run/best.pt: this command takes checkpoint=... (model= is a training config group here)")


def test_a_missing_required_setting_is_one_line() -> None:
    result = _script("export_main_branch.py", "format=onnx")
    assert result.returncode == 2 and result.stderr == (
        "error: checkpoint=... is required (export_main_branch.py --help lists every setting)\n")


def test_bare_words_and_renamed_keys_are_refused_with_the_key_to_use() -> None:
    with pytest.raises(ValueError, match=r"multirun/: settings are key=value; did you mean folders=multirun/\?"):
        check_no_bare_words(["multirun/"], "folders")
    with pytest.raises(ValueError, match=r"did you mean folders=\[a,b\]\?"):
        check_no_bare_words(["a", "b", "--help"], "folders")
    check_no_bare_words(["folders=a", "--cfg", "job", "--config-dir", "mine", "-m"], "folders")  # Hydra's flags pass
    with pytest.raises(ValueError, match=r"\+model=x: this command takes checkpoint="):
        check_renamed_setting(["+model=x"], "model", "checkpoint")
    check_renamed_setting(["checkpoint=model=x"], "model", "checkpoint")


def test_a_group_left_out_is_none_for_train_and_the_runs_own_for_evaluate() -> None:
    from rsnet.commands.help import command_help

    assert "experiment: cpu_aid_dev, paper_aid, paper_nwpu_resisc45, paper_recipe, paper_ucmerced  (default: none)" \
        in command_help("config")
    assert "(default: the run's own)" in command_help("evaluate") and "(default: none)" not in command_help("evaluate")


def test_help_shows_the_keys_of_the_chosen_groups_with_their_comments() -> None:
    """--help lists the keys of the chosen config groups (dataset.*, model.loss.*, trainer.*) with their yaml
    comments, for the groups the command line picks."""
    text = command_help("config")  # the defaults
    # the shared dataset keys (conf/_base/dataset.yaml), a key the dataset sets again shown with its own line
    assert "dataset (ucmerced_mini): dataset.<key>=value\n  root: null                # null = the bundled" in text
    assert "\n  val_ratio: 0.0" in text and "\n  name: ucmerced_mini\n" in text and text.count("\n  root: null") == 1
    assert "\n    alpha: 4.0              # weight of T^2 * KL(teacher || main)" in text  # model.loss.alpha
    assert "trainer (adaptive): trainer.<key>=value\n  devices: auto" in text  # from the included launcher base
    result = _script("train.py", "dataset=aid", "trainer=sync", "experiment=paper_aid", "--help")
    assert result.returncode == 0, result.stderr
    assert "dataset (aid): dataset.<key>=value\n  root: null                # REQUIRED" in result.stdout
    assert "\n  name: aid\n" in result.stdout
    assert "trainer (sync): trainer.<key>=value" in result.stdout and "  interval_steps: 16" in result.stdout
    assert "experiment (paper_aid): a preset of top-level keys, it sets\n" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["epoch=3"], "epoch=3: there is no setting 'epoch' (did you mean 'epochs'?); train.py --help lists every setting"),
    (["dataset=aid", "dataset.rot=/data"],
     "dataset.rot=/data: there is no setting 'rot' in dataset (did you mean 'dataset.root'?); train.py --help lists"),
    (["model.loss.alhpa=2"], "model.loss.alhpa=2: there is no setting 'alhpa' in model.loss (did you mean "
                             "'model.loss.alpha'?)"),
    (["model=foo"], "model=foo: there is no such model; choose one of baseline, esd_mbenet, mgml_fenet"),
    (["trainer=synk"], "trainer=synk: there is no such trainer; choose one of adaptive, local_sgd, static, sync"),
    (["backbone=efficientnet_b0"], "backbone=efficientnet_b0: there is no such backbone; choose one of densenet121, "
                                   "resnet18, resnet50, test_resnet, vgg16, or set backbone.name=efficientnet_b0 "
                                   "(any timm CNN: docs/models.md)"),
    (["epochs=[3"], "cannot read the override 'epochs=[3': "),
])
def test_a_mistyped_override_names_the_closest_key_or_the_choices(argv: list[str], message: str) -> None:
    from rsnet.commands.overrides import check_overrides

    with pytest.raises(ValueError) as refused:
        check_overrides("config", argv, "scripts/train.py")
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_valid_overrides_and_hydras_own_modes_pass_the_check() -> None:
    from rsnet.commands.overrides import check_overrides

    check_overrides("config", ["dataset=aid", "dataset.root=/x", "experiment=paper_aid", "+extra=1",
                               "hydra.run.dir=/tmp/r", "--help"], "train.py")
    check_overrides("config", ["-m", "epochs=1,2", "model=baseline,esd_mbenet"], "train.py")  # a sweep, each value
    check_overrides("config", ["-cn", "mine", "epoch=1"], "train.py")  # another primary config: left to Hydra
    check_overrides("evaluate", ["checkpoint=run", "tta=flips"], "evaluate.py")


def test_a_typo_is_one_line_and_exit_2_in_every_command() -> None:
    """A mistyped setting or group option is one line with exit 2 in every command, suggesting the nearest
    setting."""
    result = _script("train.py", "epoch=3")
    assert result.returncode == 2 and result.stderr == (
        "error: epoch=3: there is no setting 'epoch' (did you mean 'epochs'?); train.py --help lists every setting\n")
    result = _script("evaluate.py", "checkpoint=run", "batchsize=8")
    assert result.returncode == 2 and result.stderr.startswith(
        "error: batchsize=8: there is no setting 'batchsize' (did you mean 'batch_size'?)"), result.stderr
