"""End-to-end runs on the bundled data with a tiny backbone: rsnet-train in-process (``helpers.run_train``), and
the real scripts as a user runs them where the command line itself is under test (Hydra's errors and callbacks,
Ctrl-C, export/predict/evaluate/aggregate on a trained run)."""

from __future__ import annotations

import csv
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, command_in_process, run_train, wait_for
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rsnet.checkpoint import load_checkpoint

TINY = ["backbone=test_resnet", "dataset.image_size=64", "batch_size=32", "log.progress_bar=false",
        "trainer.devices=[cpu]", "log.attention_every=1"]
METRIC_FIELDS = ("oa", "accuracy", "reported_head", "kappa", "average_accuracy", "per_class_accuracy",
                 "confusion_matrix", "num_samples", "epochs", "train_samples", "test_samples", "wall_time_s",
                 "images_per_s", "protocol", "history")

pytestmark = pytest.mark.slow


def run_script(script: str, *args: str, expect_ok: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run one of scripts/ as a user would, from the repository root."""
    result = subprocess.run([sys.executable, str(REPO / "scripts" / script), *args], cwd=REPO, capture_output=True,
                            text=True, timeout=timeout)
    if expect_ok:
        assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"
    return result


def train(capfd: pytest.CaptureFixture | None, run_dir: Path, *args: str,
          expect_ok: bool = True) -> subprocess.CompletedProcess:
    """rsnet-train in this process with ``TINY`` and ``args``; its exit status and output (with ``capfd``)."""
    if capfd is not None:
        capfd.readouterr()  # what earlier steps of the test printed
    status = run_train(run_dir, *TINY, *args)
    out, err = capfd.readouterr() if capfd is not None else ("", "")
    if expect_ok:
        assert status == 0, f"rsnet-train {' '.join(args)} failed:\n{out}\n{err}"
    return subprocess.CompletedProcess(args, status, out, err)


def train_script(run_dir: Path, *args: str, expect_ok: bool = True) -> subprocess.CompletedProcess:
    """scripts/train.py as a user runs it, with ``TINY`` and ``args``."""
    return run_script("train.py", *TINY, f"hydra.run.dir={run_dir}", *args, expect_ok=expect_ok)


def image_tags(run_dir: Path) -> set[str]:
    tags: set[str] = set()
    for events in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
        accumulator.Reload()
        tags |= set(accumulator.Tags()["images"])
    return tags


@pytest.fixture(scope="module")
def esd_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs with a validation part (a quarter of the training images): best.pt is selected on it."""
    run_dir = tmp_path_factory.mktemp("esd") / "run"
    train(None, run_dir, "model=esd_mbenet", "epochs=2", "dataset.val_ratio=0.25")
    return run_dir


@pytest.mark.parametrize("model", ["baseline", "mgml_fenet"])
def test_train_writes_every_output(tmp_path: Path, model: str, capfd: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    result = train(capfd, run_dir, f"model={model}", "epochs=1", "log.figure_format=both")
    assert "test accuracy" in result.stdout and ", 1 epoch, " in result.stdout  # singular
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in result.stdout
    metrics = check_run_outputs(run_dir, epochs=1)
    assert all((run_dir / f"{name}.pdf").read_bytes().startswith(b"%PDF-") for name in ("curves", "confusion"))
    assert not (run_dir / "checkpoints" / "best.pt").exists()  # without validation nothing is selected on test
    assert metrics["protocol"]["selection"] == "last epoch" and "selected_epoch" not in metrics
    if model == "mgml_fenet":  # grids fitted to the 64 px maps: S4 is 2x2, so its 4x4 grid became the 2x2 one
        assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["model_config"]["image_size"] == 64
        assert {"fem_s4_g1", "fem_s4_g2", "fem_s2_g4"} <= set(metrics["oa"]) and "fem_s4_g4" not in metrics["oa"]


def check_run_outputs(run_dir: Path, epochs: int) -> dict:
    for name in ("checkpoints/last.pt", "metrics.json", "split.json"):
        assert (run_dir / name).is_file(), name
    metrics = json.loads((run_dir / "metrics.json").read_text())
    missing = [field for field in METRIC_FIELDS if field not in metrics]
    assert not missing, missing
    assert metrics["epochs"] == epochs and len(metrics["history"]) == epochs
    assert metrics["train_samples"] + metrics["val_samples"] + metrics["test_samples"] == 420
    assert "main" in metrics["oa"] and len(metrics["per_class_accuracy"]) == 21
    assert sum(map(sum, metrics["confusion_matrix"])) == metrics["test_samples"]
    tags = image_tags(run_dir)
    assert "attention/cam_main" in tags and "attention/cam_main/page2" in tags, tags  # 21 classes: two pages
    assert not any(tag.startswith("attention/gradcam") for tag in tags), tags  # it equalled cam_main
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["epoch"] == epochs and len(checkpoint["class_names"]) == 21
    with (run_dir / "history.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["epoch"]) for row in rows] == list(range(1, epochs + 1))
    assert [float(row["test_accuracy"]) for row in rows] == [h["test_accuracy"] for h in metrics["history"]]
    assert float(rows[-1]["oa/main"]) == metrics["history"][-1]["oa"]["main"]
    assert Image.open(run_dir / "curves.png").size == (1160, 460)  # accuracy, then the training loss
    assert Image.open(run_dir / "confusion.png").size[0] > 21 * 20  # the headline epoch's, 21 classes
    return metrics


def test_esd_run_outputs_and_attention_of_every_branch(esd_run: Path) -> None:
    metrics = check_run_outputs(esd_run, epochs=2)
    assert {"main", "ensemble"} <= set(metrics["oa"])
    assert metrics["val_samples"] == 21 * 3 and metrics["train_samples"] == 21 * 7  # round(10 / 4) = 3 a class
    assert metrics["protocol"] == {"dataset": "ucmerced_mini", "data": "ucmerced_mini", "train_ratio": 0.5,
                                   "val_ratio": 0.25, "image_size": 64, "pretrained": "scratch", "epochs": 2,
                                   "eval_every": 1, "selection": "validation"}
    tags = image_tags(esd_run)
    cams = {tag for tag in tags if tag.startswith("attention/cam_")}  # the main and every auxiliary branch
    heads = ("main", "aux1", "aux2", "feature_ensemble")
    assert cams == {f"attention/cam_{head}{page}" for head in heads for page in ("", "/page2")}, tags  # 21 classes


def _stopped_before_epoch(stop: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C as epoch ``stop`` (1-based) starts: the epochs before it are trained and saved."""
    import rsnet.engine.trainer as trainer

    real_epoch = trainer.train_one_epoch

    def train_one_epoch(ctx, config, epoch, *rest, **options):
        if epoch + 1 == stop:
            raise KeyboardInterrupt
        return real_epoch(ctx, config, epoch, *rest, **options)

    monkeypatch.setattr(trainer, "train_one_epoch", train_one_epoch)


def test_a_resumed_run_trains_as_the_uninterrupted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped after epoch 1 of 2 and resumed, a run ends with the weights, optimizer state and history of the run
    that was never stopped (dropout on, so the global generators must be where they were too)."""
    settings = ("model=baseline", "model.options.drop_rate=0.5", "dataset.image_size=32", "epochs=2",
                "deterministic=true", "log.attention_every=2", "log.embedding_images=0",
                "log.background_writes=false")
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert run_train(whole, *TINY, *settings) == 0
    with monkeypatch.context() as patch:
        _stopped_before_epoch(2, patch)
        assert run_train(resumed, *TINY, *settings) == 130
    assert load_checkpoint(resumed / "checkpoints" / "last.pt")["epoch"] == 1
    assert run_train(resumed, *TINY, *settings, "resume=true") == 0
    expected, got = (load_checkpoint(run / "checkpoints" / "last.pt") for run in (whole, resumed))
    assert got["epoch"] == expected["epoch"] == 2
    assert expected["model_state"].keys() == got["model_state"].keys()
    for key, value in expected["model_state"].items():
        torch.testing.assert_close(got["model_state"][key], value, rtol=0, atol=1e-6, msg=key)
    for state, value in expected["optimizer_state"]["state"].items():
        for name, tensor in value.items():
            torch.testing.assert_close(got["optimizer_state"]["state"][state][name], tensor, rtol=0, atol=1e-6)
    history = [json.loads((run / "metrics.json").read_text())["history"] for run in (whole, resumed)]
    drop_time = [{key: value for key, value in row.items() if key not in ("wall_time_s", "train/images_per_s",
                                                                           "train/data_stall")} for row in history[0]]
    assert [{key: row[key] for key in drop_time[0]} for row in history[1]] == drop_time


def test_resuming_a_finished_run_reports_its_metrics(esd_run: Path, tmp_path: Path, capfd: pytest.CaptureFixture,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "finished"
    shutil.copytree(esd_run, run_dir)
    before = json.loads((run_dir / "metrics.json").read_text())
    result = train(capfd, run_dir, "model=esd_mbenet", "epochs=2", "resume=true")
    assert f"test accuracy (ensemble): {before['accuracy']:.2f} %" in result.stdout
    # it says that nothing was left to train (and launches no worker), then gives the figures
    assert "has trained 2 of epochs=2, so nothing is left to train; its figures follow" in caplog.text
    assert json.loads((run_dir / "metrics.json").read_text())["history"] == before["history"]


def test_resuming_from_a_damaged_checkpoint_is_refused_before_training(esd_run: Path, tmp_path: Path,
                                                                      capfd: pytest.CaptureFixture) -> None:
    """A last.pt with 200 bytes of a weight overwritten is refused before any worker starts (exit 2, the last line
    names the file and its SHA-256 mismatch): no epoch is trained from it."""
    run_dir = shutil.copytree(esd_run, tmp_path / "run")
    last = run_dir / "checkpoints" / "last.pt"
    data = bytearray(last.read_bytes())
    weight = max(load_checkpoint(last)["model_state"].values(), key=torch.Tensor.numel)
    start = bytes(data).find(weight.numpy().tobytes())
    data[start:start + 200] = bytes(range(200))
    last.write_bytes(bytes(data))
    result = train(capfd, run_dir, "model=esd_mbenet", "epochs=3", "resume=true", expect_ok=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: {last} is damaged: its contents do not match the SHA-256 written with them"), result.stderr
    assert "epoch 3/3" not in result.stdout + result.stderr and "launched" not in result.stderr


def test_a_non_finite_learning_rate_is_refused_before_the_data_is_decoded(tmp_path: Path,
                                                                         capfd: pytest.CaptureFixture) -> None:
    """optimizer.lr=nan is refused in one line (exit 2) before the data is decoded or a checkpoint folder made."""
    result = train(capfd, tmp_path / "run", "model=baseline", "epochs=1", "optimizer.lr=nan", expect_ok=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: optimizer.lr=nan: must be a finite number"
    assert "decoded" not in result.stdout + result.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_a_bad_figure_format_is_refused_before_the_data_is_decoded(tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture) -> None:
    result = train(capfd, tmp_path / "run", "model=baseline", "epochs=1", "log.figure_format=svg", expect_ok=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == ("error: log.figure_format='svg': use png (the default), pdf "
                                                      "(vector, for a paper) or both")


def test_resume_under_another_image_size_is_refused(esd_run: Path, capfd: pytest.CaptureFixture) -> None:
    """Resuming at another dataset.image_size is refused in one line naming both sizes, with no traceback."""
    result = train(capfd, esd_run, "model=esd_mbenet", "epochs=3", "resume=true", "dataset.image_size=32",
                   expect_ok=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"error: resume=true: dataset.image_size=32 but the run in {esd_run / 'checkpoints' / 'last.pt'} has "
        "dataset.image_size=64; "), result.stderr
    assert "Traceback" not in result.stderr


def test_rerun_without_resume_refuses_to_overwrite_and_changes_nothing(esd_run: Path, tmp_path: Path) -> None:
    """A second run into a run dir without resume=true is refused (exit 2) and leaves every file of the dir as it
    was, .hydra/config.yaml included."""
    esd_run = shutil.copytree(esd_run, tmp_path / "run")
    (esd_run / "train.log").write_text("the first run's log\n")  # what the command line leaves (not run_train)
    before = dir_contents(esd_run)
    assert (esd_run / ".hydra" / "config.yaml").is_file() and (esd_run / ".hydra" / "overrides.yaml").is_file()
    result = train_script(esd_run, "model=esd_mbenet", "epochs=2", "seed=7", expect_ok=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {esd_run} already holds a run ({esd_run / 'checkpoints' / 'last.pt'}); pass resume=true to continue "
        "it, overwrite=true to start afresh there, or choose another hydra.run.dir"), result.stderr
    assert dir_contents(esd_run) == before


def test_overwrite_starts_afresh_without_the_earlier_runs_outputs(esd_run: Path, tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture) -> None:
    """overwrite=true removes the earlier run's TensorBoard events and its best.pt (selected on validation, which the
    new run lacks): the new run's curves and checkpoints are its own."""
    run_dir = shutil.copytree(esd_run, tmp_path / "run")
    earlier_events = {path.name for path in (run_dir / "tensorboard").glob("events.out.tfevents.*")}
    assert earlier_events and (run_dir / "checkpoints" / "best.pt").is_file()
    train(capfd, run_dir, "model=baseline", "epochs=1", "overwrite=true")
    events = {path.name for path in (run_dir / "tensorboard").glob("events.out.tfevents.*")}
    assert len(events) == 1 and not events & earlier_events, events
    assert not (run_dir / "checkpoints" / "best.pt").exists()
    metrics = check_run_outputs(run_dir, epochs=1)
    assert metrics["val_samples"] == 0


@pytest.mark.parametrize("bad_input", ["dataset.root=/no/such/folder", "backbone.pretrained=/no/such/weights.pth"])
def test_overwrite_with_a_bad_input_leaves_every_byte_of_the_earlier_run(esd_run: Path, tmp_path: Path,
                                                                          capfd: pytest.CaptureFixture,
                                                                          bad_input: str) -> None:
    """overwrite=true sets the earlier run aside, not deletes it: a run that stops on a bad input (here in its
    workers, after the run dir was accepted) puts it back byte for byte, .hydra/ and TensorBoard events included."""
    run_dir = shutil.copytree(esd_run, tmp_path / "run")
    before = dir_contents(run_dir)
    result = train(capfd, run_dir, "model=baseline", "epochs=1", "overwrite=true", bad_input, expect_ok=False)
    assert result.returncode == 2, result.stderr
    assert "error: " in result.stderr and bad_input.partition("=")[2] in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert dir_contents(run_dir) == before


def dir_contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (but the run lock and the pid of its last holder) and its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and path.name not in (".rsnet.lock", ".rsnet.pid")}


def test_export_predict_and_evaluate(esd_run: Path, images: Path, tmp_path: Path,
                                     capfd: pytest.CaptureFixture) -> None:
    """export, predict and evaluate on a trained run, in this process (test_install.py runs the installed commands
    as a user does)."""

    def run_command(name: str, *args: str) -> str:
        done = command_in_process(name, *args, capture=capfd)
        assert done.returncode == 0, done.stderr
        return done.stdout

    export_dir = tmp_path / "exported"
    printed = run_command("export", f"checkpoint={esd_run / 'checkpoints' / 'best.pt'}", "format=torchscript",
                          f"out={export_dir}")
    assert "max abs logit difference vs the full model's main logits: " in printed
    predictions = tmp_path / "preds.csv"
    run_command("predict", f"checkpoint={export_dir}", f"images={images}", f"out={predictions}")
    rows = predictions.read_text().strip().splitlines()
    assert len(rows) == 3  # header + 2 images
    attention = tmp_path / "attention"
    run_command("predict", f"checkpoint={esd_run / 'checkpoints' / 'best.pt'}", f"images={images}",
                f"attention_dir={attention}")
    assert {path.name for path in attention.iterdir()} == {
        f"{stem}_{tag}.png" for stem in ("beach80", "forest81")
        for tag in ("cam_main", "cam_aux1", "cam_aux2", "cam_feature_ensemble")}
    out = tmp_path / "eval.json"
    run_command("evaluate", f"checkpoint={esd_run / 'checkpoints' / 'best.pt'}", f"out={out}")
    full = json.loads(out.read_text())
    trained = json.loads((esd_run / "metrics.json").read_text())
    selected = max(trained["history"], key=lambda row: row["val_accuracy"])  # the first epoch on a tie
    assert trained["selected_epoch"] == selected["epoch"] and trained["val_accuracy"] == selected["val_accuracy"]
    assert full["accuracy"] == pytest.approx(selected["test_accuracy"], abs=1e-6) == trained["accuracy"]
    assert full["amp"] == trained["eval_amp"] == "none"  # one precision for both by default (float32)
    out_exported = tmp_path / "eval_exported.json"
    run_command("evaluate", f"checkpoint={export_dir}", "dataset=ucmerced_mini", "dataset.image_size=64",
                f"out={out_exported}")
    exported = json.loads(out_exported.read_text())
    assert exported["oa"]["main"] == pytest.approx(full["oa"]["main"], abs=1e-6) and exported["amp"] == "none"


def test_aggregate_prints_mean_and_std(esd_run: Path) -> None:
    result = run_script("aggregate.py", f"folders={esd_run.parent}")
    assert "| ucmerced_mini | 0.5 | 0.25 | 64 | scratch | 2 | esd_mbenet | test_resnet | 0 |" in result.stdout
    assert "| esd_mbenet (test_resnet) ensemble | " in result.stdout and "train 50% (val 25% of it)" in result.stdout


@pytest.mark.parametrize("override, message", [
    ("batch_size=0", "batch_size=0"),
    ("dataset.train_ratio=1.5", "dataset.train_ratio=1.5"),
    ("dataset.image_size=8", "dataset.image_size=8"),
    ("+epoch=1", "did you mean 'epochs'"),  # was accepted, and the default 12 epochs trained
    ("dataset.root=/no/such/folder", "/no/such/folder"),  # found by the workers, after the run dir was accepted
])
def test_bad_settings_fail_before_training(tmp_path: Path, override: str, message: str,
                                           capfd: pytest.CaptureFixture) -> None:
    result = train(capfd, tmp_path / "run", "epochs=1", override, expect_ok=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()  # no stub run folder left behind


def test_unknown_group_option_lists_valid_ones(tmp_path: Path) -> None:
    """An unknown model= is refused in one line (exit 2) that lists the models there are."""
    result = train_script(tmp_path / "run", "model=resnet_ensemble", expect_ok=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("error: model=resnet_ensemble: there is no such model; choose one of baseline, "
                             "esd_mbenet, mgml_fenet\n")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(esd_run: Path, tmp_path: Path,
                                                       capfd: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "diverging"
    shutil.copytree(esd_run, run_dir)
    result = train(capfd, run_dir, "model=esd_mbenet", "epochs=3", "resume=true", "optimizer.lr=1e30",
                   "lr_schedule.warmup_epochs=0", expect_ok=False)
    assert result.returncode == 1, result.stderr
    assert "error: the run stopped: the loss became NaN or infinite at epoch 3, within steps " in result.stderr
    assert f"Its last good checkpoint is {run_dir / 'checkpoints' / 'last.pt'} (after epoch 2)." in result.stderr
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert checkpoint["epoch"] == 2
    assert all(torch.isfinite(value).all() for value in checkpoint["model_state"].values() if value.is_floating_point())


def test_three_unequal_cpu_workers_exit_0_with_no_batch_below_batch_min(tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture) -> None:
    """Three CPU workers at speeds 1:1:3 train two epochs to the end, every sample once per epoch, with no batch
    below the batch minimum (a batch of 1 fails in BatchNorm)."""
    run_dir = tmp_path / "three_workers"
    train(capfd, run_dir, "trainer.devices=[cpu,cpu,cpu]", "trainer.cpu_threads=1", "trainer.slowdown=[1.0,1.0,3.0]",
          "trainer.merge_rounds=2", "trainer.merge_cost_max=0", "trainer.leave_out=false", "model=baseline",
          "dataset.image_size=32", "epochs=2", "log.attention_every=100")
    report = json.loads((run_dir / "metrics.json").read_text())["scheduler"]
    assert report["strategy"] == "adaptive" and report["simulated_slowdown"] == [1.0, 1.0, 3.0]
    workers = report["workers"]
    assert [w["device"] for w in workers] == ["cpu"] * 3
    assert sum(w["samples"] for w in workers) == 2 * 210  # every training sample once per epoch
    # B = 3 workers x share_min 16 = 48; 210 = 96 + 114: the last 18 samples join the second interval. Epoch 1 begins
    # with the speed probe, which lasts until every worker has timed a step: here up to the whole epoch (the slow
    # worker's first step, allocations included, takes 3 x as long), so 1-3 merges; a prober left then probes again.
    assert 3 <= report["merges"] <= 6
    assert all(w["updates"] > 0 and w["mean_batch"] >= 4 and w["active"] for w in workers)


@pytest.mark.parametrize("on_device", ["true", "false"])
def test_prefetch_changes_timing_only(tmp_path: Path, capfd: pytest.CaptureFixture, on_device: str) -> None:
    """The background thread prepares the same batches in the same order: identical weights either way, with the
    augmentation on the worker's device (the default) and with OpenCV on the host."""
    states = []
    for prefetch in ("true", "false"):
        run_dir = tmp_path / f"prefetch_{prefetch}"
        train(capfd, run_dir, "model=baseline", "epochs=1", f"prefetch={prefetch}", "dataset.image_size=32",
              f"augment.on_device={on_device}")
        states.append(load_checkpoint(run_dir / "checkpoints" / "last.pt")["model_state"])
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][key], states[1][key]) for key in states[0])


def _default_ctrl_c() -> None:
    """In the child before it runs Python: SIGINT's default disposition, as a shell gives every command (a child
    inherits an ignored SIGINT, and Python then never raises KeyboardInterrupt). In two full test runs the
    interrupted run went on to finish all its epochs as if it never got SIGINT; no single earlier test file
    reproduced it, so the cause is presumed, not shown, to be a disposition inherited from the test process."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("devices", ["[cpu]", "[cpu,cpu]"])
def test_ctrl_c_says_how_to_resume_without_a_traceback(tmp_path: Path, devices: str) -> None:
    """Ctrl-C ends the run with exit 130 and no traceback, keeps the checkpoint and prints the command that
    continues the run, which works."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen([sys.executable, str(REPO / "scripts" / "train.py"), *TINY, "model=baseline",
                                "epochs=50", f"trainer.devices={devices}", f"hydra.run.dir={run_dir}"],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=_default_ctrl_c)
    wait_for((run_dir / "checkpoints" / "last.pt").exists, "the run's first checkpoint", alive=process)
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: every process of the group
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    last_lines = stderr.strip().splitlines()[-2:]
    # two workers commit their merges: the newest point may be a merge within the next epoch (commit.pt)
    assert last_lines[0].startswith((f"interrupted: {run_dir / 'checkpoints' / 'last.pt'} holds epoch",
                                     f"interrupted: {run_dir / 'checkpoints' / 'commit.pt'} holds epoch")), stderr
    command = shlex.split(last_lines[1])
    assert command[-2:] == [f"hydra.run.dir={run_dir}", "resume=true"]
    # the interpreter that ran it (was: "python", not the venv's after `make demo`), relative to the folder run in
    assert (REPO / command[0]).resolve() == Path(sys.executable).resolve(), command
    if devices == "[cpu]":
        epoch = load_checkpoint(run_dir / "checkpoints" / "last.pt")["epoch"]
        assert (REPO / command[1]).resolve() == REPO / "scripts" / "train.py", command
        settings = [arg for arg in command[2:] if not arg.startswith("hydra.run.dir=")]  # its settings, in process
        assert run_train(run_dir, *settings, f"epochs={epoch + 1}") == 0
        assert load_checkpoint(run_dir / "checkpoints" / "last.pt")["epoch"] == epoch + 1


def test_a_workers_input_error_is_one_line_like_in_one_process(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """With two workers a missing dataset root is the same one-line error as with one (exit 2): no worker rank, no
    traceback."""
    result = train(capfd, tmp_path / "run", "trainer.devices=[cpu,cpu]", f"dataset.root={tmp_path / 'nowhere'}",
                   expect_ok=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "worker rank" not in result.stderr, result.stderr
    assert "error: UC Merced Land Use (bundled mini sample) ('ucmerced_mini') not found" in result.stderr
    assert f"looked in: '{tmp_path / 'nowhere'}'" in result.stderr


def test_a_run_dir_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    """A run dir that cannot be created is one line (exit 2) naming it and the reason."""
    blocker = tmp_path / "a_file"
    blocker.write_text("in the way")
    result = run_script("train.py", *TINY, "epochs=1", f"hydra.run.dir={blocker / 'run'}", expect_ok=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"error: hydra.run.dir={blocker / 'run'} cannot be written (Not a directory): "
                                     "choose a folder you can write to")
