"""The inference commands (export, evaluate, predict) as a user runs them, each command's code in this process with
the settings Hydra composes from its command line (the installed commands run as processes in test_install.py):
which model a path means, and one-line errors for bad settings, unwritable outputs and unreadable images (exit
status 2) and a full disk (1)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import REPO, command_in_process, compose_command
from omegaconf import OmegaConf

from rsnet.data import DATASETS
from rsnet.checkpoint import load_checkpoint, save_checkpoint
from rsnet.export import export_checkpoint
from rsnet.models import build_model

SIZE = 32
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
NOT_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose checkpoints/ holds best.pt (ucmerced_mini at 32 px) and, beside it, an export left there
    by an earlier rsnet (model.pt + model.json)."""
    run = tmp_path_factory.mktemp("inference") / "run"
    classes = list(DATASETS["ucmerced_mini"].classes)
    torch.manual_seed(0)
    model = build_model("esd_mbenet", "test_resnet", len(classes))
    dataset = {**OmegaConf.to_container(compose_command("config", "dataset=ucmerced_mini").dataset),
               "image_size": SIZE}
    best = save_checkpoint(run / "checkpoints" / "best.pt", {
        "model_config": model.model_config, "model_state": model.state_dict(), "class_names": classes,
        "image_size": SIZE, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "epoch": 1,
        "config": {"dataset": dataset, "seed": 0}})
    export = run.parent / "export"
    export_checkpoint(best, export, format="state_dict")
    for name in ("model.pt", "model.json"):
        shutil.copy(export / name, run / "checkpoints" / name)
    return run


def script(name: str, *args: str, capture: pytest.CaptureFixture) -> subprocess.CompletedProcess:
    """scripts/<name> (export_main_branch.py: the export command) with these command-line settings, in this process:
    its exit status and what it printed."""
    return command_in_process("export" if name == "export_main_branch.py" else name, *args, capture=capture)


def model_args(name: str, run: Path, images: Path) -> list[str]:
    """The model (and, for predict, the images) of a run of script ``name``."""
    return [f"checkpoint={run}", f"images={images}"] if name == "predict.py" else [f"checkpoint={run}"]


def one_line_error(result: subprocess.CompletedProcess, status: int = 2) -> str:
    """The single stderr line of a refused run (exit ``status``: 2 for input, 1 for a full disk; no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert result.returncode == status and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_export_into_a_run_is_refused(run: Path, capsys: pytest.CaptureFixture) -> None:
    """Was: out=<run>/checkpoints wrote model.pt there, and later predict model=.../best.pt used it."""
    checkpoints = run / "checkpoints"
    before = {p.name: p.stat().st_mtime_ns for p in checkpoints.iterdir()}
    error = one_line_error(script("export_main_branch.py", f"checkpoint={run}", "format=state_dict",
                                  f"out={checkpoints}", capture=capsys))
    assert error == (f"error: out={checkpoints} holds training checkpoints (best.pt); an export there would overwrite "
                     f"or shadow them: pass another path, e.g. out={run / 'export'}")
    assert {p.name: p.stat().st_mtime_ns for p in checkpoints.iterdir()} == before


def test_a_checkpoint_file_is_that_file_even_beside_an_export(run: Path, images: Path,
                                                              capsys: pytest.CaptureFixture) -> None:
    """Was: predict model=.../best.pt silently ran the model.pt exported beside it."""
    result = script("predict.py", f"checkpoint={run / 'checkpoints' / 'best.pt'}", f"images={images}", capture=capsys)
    assert result.returncode == 0, result.stderr
    assert f"checkpoint {run / 'checkpoints' / 'best.pt'}: esd_mbenet" in result.stderr
    assert len(result.stdout.splitlines()) == 2


def test_evaluate_reads_a_run_folder(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Was: checkpoint=<run> was taken for an export folder."""
    out = tmp_path / "eval.json"
    result = script("evaluate.py", f"checkpoint={run}", f"out={out}", "batch_size=105", capture=capsys)
    assert result.returncode == 0, result.stderr
    best = run / "checkpoints" / "best.pt"
    assert f"model: checkpoint {best} (the best checkpoint of {run})" in result.stdout
    assert OmegaConf.load(out)["checkpoint"] == str(best)


def test_evaluate_prints_its_result_before_a_full_disk(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: best.pt beside an export was refused; and a failed write lost the whole evaluation."""
    out = tmp_path / "results" / "eval.json"

    def full(descriptor: int) -> None:  # every fsync: the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    result = script("evaluate.py", f"checkpoint={run / 'checkpoints' / 'best.pt'}", f"out={out}", "batch_size=105",
                    capture=capsys)
    assert one_line_error(result, status=1).startswith(f"error: no space left on device while writing {out}")
    assert "ucmerced_mini test split (210 images): accuracy" in result.stdout
    assert list(out.parent.iterdir()) == []  # neither the file nor a temp file is left


@NO_CUDA
@pytest.mark.parametrize(("name", "device"), [("predict.py", "cuda"), ("evaluate.py", "cuda:0"),
                                              ("predict.py", "tpu")])
def test_devices_this_machine_lacks(run: Path, images: Path, name: str, device: str, capsys) -> None:
    """Was (evaluate): the checkpoint file was blamed for an absent CUDA device."""
    result = command_in_process(name, *model_args(name, run, images), f"device={device}", capture=capsys)
    expected = (f"error: device={device}: not a device rsnet runs on; use auto, cpu or cuda:<index> (this machine "
                "has: cpu)" if device == "tpu" else
                f"error: device={device}: no such CUDA device here (this machine has: cpu); use device=cpu or "
                "device=auto")
    assert one_line_error(result) == expected


@pytest.mark.parametrize(("name", "argument"), [("predict.py", "topk=abc"), ("evaluate.py", "batch_size=abc")])
def test_numbers_that_are_not(run: Path, images: Path, name: str, argument: str, capsys) -> None:
    key = argument.split("=")[0]
    assert one_line_error(command_in_process(name, *model_args(name, run, images), argument, capture=capsys)) == \
        f"error: {key}='abc': must be a whole number >= 1"


def _refused_before_running(name: str, run: Path, images: Path, out: str,
                            capsys: pytest.CaptureFixture) -> tuple[str, str]:
    result = command_in_process(name, *model_args(name, run, images), f"out={out}", capture=capsys)
    return one_line_error(result), result.stdout


@pytest.mark.parametrize("name", ["predict.py", "evaluate.py"])
def test_an_output_under_a_file_fails_fast(run: Path, images: Path, tmp_path: Path, name: str, capsys) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    error, stdout = _refused_before_running(name, run, images, f"{blocker}/results.out", capsys)
    assert error.startswith(f"error: out={blocker} cannot be written (") and "choose a folder you can write to" in error
    assert "accuracy" not in stdout and "beach80" not in stdout


@NOT_ROOT
@pytest.mark.parametrize("name", ["predict.py", "evaluate.py"])
def test_a_read_only_output_folder_fails_fast(run: Path, images: Path, tmp_path: Path, name: str, capsys) -> None:
    """Was: evaluate computed everything, then lost it; predict printed every row, then failed on the CSV."""
    folder = tmp_path / "read_only"
    folder.mkdir(mode=0o500)
    try:
        error, stdout = _refused_before_running(name, run, images, f"{folder}/results.out", capsys)
    finally:
        folder.chmod(0o700)
    assert error.startswith(f"error: out={folder} cannot be written (Permission denied)")
    assert "accuracy" not in stdout and "beach80" not in stdout


def test_unreadable_images_name_predicts_own_switch(run: Path, images: Path, capsys: pytest.CaptureFixture) -> None:
    """Was: the message told the user to set dataset.skip_corrupt=true, a training setting."""
    for name in ("b_broken.png", "z_broken.jpg"):
        (images / name).write_bytes(b"not an image")
    error = one_line_error(script("predict.py", f"checkpoint={run}", f"images={images}", capture=capsys))
    assert error.startswith(f"error: 2 unreadable image(s): {images / 'b_broken.png'}, {images / 'z_broken.jpg'}; "
                            "fix or remove them, or pass skip_corrupt=true to skip them (cannot read image")
    assert "dataset.skip_corrupt" not in error


def test_evaluate_names_the_skip_override_that_works_on_the_runs_own_dataset(run: Path, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """Was: the hint said dataset.skip_corrupt=true, which Hydra refuses when the dataset is the checkpoint's own,
    and +dataset.skip_corrupt=true then failed with a KeyError traceback."""
    root = tmp_path / "ucmerced-mini"
    shutil.copytree(REPO / "data" / "ucmerced-mini", root)
    (root / "Images" / "beach" / "beach80.jpg").write_bytes(b"not a jpeg")
    checkpoint = load_checkpoint(run / "checkpoints" / "best.pt")
    checkpoint["config"]["dataset"]["root"] = str(root)
    moved = save_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt", checkpoint)
    line = one_line_error(script("evaluate.py", f"checkpoint={moved}", f"out={tmp_path / 'eval.json'}",
                                 capture=capsys))
    assert "beach80.jpg" in line and "pass +dataset.skip_corrupt=true to skip it" in line
    result = command_in_process("evaluate.py", f"checkpoint={moved}", f"out={tmp_path / 'eval.json'}",
                        "+dataset.skip_corrupt=true", capture=capsys)  # the override as Hydra parses it
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "eval.json").read_text())["num_samples"] in (209, 210)  # 419 images split in two
