"""What a run's folder and an evaluation's result identify: the image folder a run trained on (its run dir), the
checkpoint an evaluation scored (its epoch and the SHA-256 of its bytes), and that a name read from a checkpoint
never leads outside its folder."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
from helpers import EXPORT_CLASSES, compose_command, dataset_config, write_checkpoint, write_image
from omegaconf import OmegaConf

import rsnet.checkpoint
import rsnet.commands  # noqa: F401 - registers the run folder resolvers of conf/config.yaml
from rsnet.commands import evaluate
from rsnet.model_loading import load_model
from rsnet.run_folders import dataset_folder


def run_dir(*overrides: str) -> str:
    """rsnet-train's default run dir (``hydra.run.dir``) for these command-line ``overrides``."""
    return str(compose_command("config", *overrides, return_hydra_config=True).hydra.run.dir)


def sweep_subdir(*overrides: str) -> str:
    """rsnet-train -m's folder of one job (``hydra.sweep.subdir``) for these ``overrides``."""
    return str(compose_command("config", *overrides, return_hydra_config=True).hydra.sweep.subdir)


def image_folder(root: Path, classes: list[str] = EXPORT_CLASSES, per_class: int = 4) -> Path:
    """A tiny image_folder dataset at ``root``: ``per_class`` 16 px images in one sub-folder per class."""
    for label, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            write_image(root / name / f"{index}.png", 40 * label + index)
    return root


def every_path(folder: Path) -> set[Path]:
    """Every file and folder below ``folder``."""
    return set(folder.rglob("*"))


def run_evaluate(*overrides: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """rsnet-evaluate in this process, its settings composed from ``overrides``: exit status, stdout, stderr."""
    capsys.readouterr()
    try:
        evaluate.main(compose_command("evaluate", *overrides))
        status = 0
    except SystemExit as stop:
        status = int(stop.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_two_image_folders_get_their_own_run_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two image folders get two run dirs, each named after its folder and a digest of its path."""
    first, second = image_folder(tmp_path / "a" / "scenes"), image_folder(tmp_path / "b" / "scenes")
    dirs = [run_dir("dataset=image_folder", f"dataset.root={root}") for root in (first, second)]
    assert dirs[0] != dirs[1]
    for root, folder in zip((first, second), dirs):
        digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:8]
        assert folder == f"outputs/image_folder-scenes-{digest}/r0.5_128px_scratch/esd_mbenet_resnet18/seed0"
    assert {sweep_subdir("dataset=image_folder", f"dataset.root={root}").split("/")[0] for root in (first, second)} \
        == {Path(folder).parts[1] for folder in dirs}
    monkeypatch.chdir(tmp_path / "a")
    (tmp_path / "link").symlink_to(first)
    assert run_dir("dataset=image_folder", "dataset.root=scenes") == dirs[0]
    assert run_dir("dataset=image_folder", f"dataset.root={tmp_path / 'link'}") == dirs[0]


def test_shipped_datasets_keep_their_name_as_run_dir() -> None:
    assert run_dir("dataset=aid", "dataset.root=/data/AID", "dataset.train_ratio=0.2") == \
        "outputs/aid/r0.2_224px_scratch/esd_mbenet_resnet18/seed0"
    assert dataset_folder("image_folder", None) == "image_folder"
    assert dataset_folder("image_folder", "/").startswith("image_folder-root-")


def test_runs_of_other_bands_get_their_own_run_dirs() -> None:
    assert run_dir("dataset=eurosat_ms", "dataset.root=/data") == \
        "outputs/eurosat_ms_bands-all/r0.8_64px_scratch/esd_mbenet_resnet18/seed0"
    assert run_dir("dataset=eurosat_ms", "dataset.root=/data", "dataset.bands=[B04,B03,B02,B08]").startswith(
        "outputs/eurosat_ms_bands-B04-B03-B02-B08/")
    folder = dataset_folder("image_folder", "/data/rgbn", [4, 3, 2])
    assert folder.startswith("image_folder-rgbn-") and folder.endswith("_bands-4-3-2")


@pytest.mark.parametrize("name", ["../../../../escaped/x", "nested/name", ".."])
def test_a_checkpoint_dataset_name_cannot_lead_outside_its_folder(tmp_path: Path, name: str,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """A crafted checkpoint's dataset.name ../../... is refused in one line before rsnet-evaluate creates any
    folder: nothing under the test's folder changes."""
    config = {"dataset": {**dataset_config("ucmerced_mini"), "name": name}, "seed": 0}
    checkpoint = write_checkpoint(tmp_path / "a" / "b" / "run" / "checkpoints" / "last.pt", config=config)
    before = every_path(tmp_path)
    status, _, err = run_evaluate(f"checkpoint={checkpoint}", capsys=capsys)
    assert every_path(tmp_path) == before
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {checkpoint}: its dataset.name {name!r}") and "dataset=<name>" in err


def test_a_dataset_name_with_a_separator_on_the_command_line_is_refused(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    checkpoint = write_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    before = every_path(tmp_path)
    status, _, err = run_evaluate(f"checkpoint={checkpoint}", "dataset=image_folder", "dataset.name=../x",
                                  capsys=capsys)
    assert every_path(tmp_path) == before
    assert status == 2 and err.startswith("error: dataset.name='../x'"), err


def test_eval_result_records_the_epoch_and_sha256_of_the_checkpoint_it_scored(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture) -> None:
    """An eval_*.json names the epoch and the SHA-256 of the checkpoint it scored, which stay true after the next
    epoch replaces last.pt."""
    root = image_folder(tmp_path / "scenes")
    config = {"dataset": dataset_config("image_folder", root=str(root)), "seed": 0}
    checkpoint = write_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", config=config, epoch=7)
    digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    status, out, err = run_evaluate(f"checkpoint={checkpoint}", "progress_bar=false", "device=cpu", capsys=capsys)
    assert status == 0, err
    result = json.loads((checkpoint.parent / "eval_image_folder_test.json").read_text())
    assert result["checkpoint"] == str(checkpoint)
    assert result["epoch"] == 7 and result["checkpoint_sha256"] == digest
    assert f"epoch 7, sha256 {digest}" in out


def test_an_exported_model_records_no_epoch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rsnet.export import export_checkpoint

    root = image_folder(tmp_path / "scenes")
    export = tmp_path / "export"
    export_checkpoint(write_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt"), export, format="state_dict")
    status, _, err = run_evaluate(f"checkpoint={export}", "dataset=image_folder", f"dataset.root={root}",
                                  f"out={tmp_path / 'eval.json'}", "progress_bar=false", "device=cpu", capsys=capsys)
    assert status == 0, err
    result = OmegaConf.load(tmp_path / "eval.json")
    assert result["epoch"] is None and result["checkpoint_sha256"] is None


def test_the_digest_is_of_the_bytes_that_were_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run replaces last.pt with the next epochs' while an evaluation loads it: the epoch and digest the
    evaluation records are of one file, never the epoch of one and the digest of another."""
    last = write_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", epoch=1)
    later = [write_checkpoint(tmp_path / f"epoch{epoch}.pt", epoch=epoch) for epoch in (2, 3)]
    digests = {epoch: hashlib.sha256(path.read_bytes()).hexdigest()
               for epoch, path in ((1, last), (2, later[0]), (3, later[1]))}
    real_load = torch.load

    def load_while_the_run_writes_the_next_epochs(*args: object, **kwargs: object) -> object:
        if not later[0].exists():
            return real_load(*args, **kwargs)
        os.replace(later[0], last)
        payload = real_load(*args, **kwargs)
        os.replace(later[1], last)
        return payload

    monkeypatch.setattr(rsnet.checkpoint.torch, "load", load_while_the_run_writes_the_next_epochs)
    loaded = load_model(last)
    assert loaded.sha256 == digests[loaded.epoch]
