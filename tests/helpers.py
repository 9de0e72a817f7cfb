"""Shared test doubles and helpers, imported by the test modules (``from helpers import ...``); fixtures live in
conftest.py.

- paths: ``REPO``, ``CONF``, ``MINI_ROOT`` (data/ucmerced-mini), ``TIF_SAMPLE_ROOT``
  (tests/fixtures/ucmerced-tif-sample), ``RSNET`` (the package's folder);
- commands: ``compose_command`` (a command's Hydra settings), ``training_config`` / ``trainer_config`` (rsnet-train's
  settings as a dict), ``run_train`` (rsnet-train in-process), ``command_in_process`` (export, predict or evaluate
  in-process), ``load_predict_script``, ``load_export_script``, ``run_evaluate_script``;
- fake archives: ``make_fake_archive(base, name, ...)`` writes a tiny archive of ``name`` ("ucmerced",
  "nwpu_resisc45", "aid", "ucmerced_mini") with the real class names and file naming. Every image is a solid colour
  that encodes its label (red channel = ``label_value(label)``), so tests can check labels from pixels;
- models and data: ``StandInModel`` (two branches, like rsnet's multi-branch models), ``PlainClassifier`` (an
  exported-style model), ``TensorDataset``; checkpoints: ``checkpoint_payload`` (for predict), ``write_checkpoint``
  (a real test_resnet model, for export);
- export: ``full_logits``, ``export_recording``, ``deprecations_from_rsnet``;
- ``DictStore``: an in-memory stand-in for the c10d store's counter;
- waiting on events: ``wait_for`` (a condition such as a file or a store key, with a ceiling only a hang reaches),
  ``wait_for_exit`` (a process that is not this one's child ends).
"""

from __future__ import annotations

import copy
import importlib
import os
import select
import subprocess
import time
import warnings
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image
from torch import nn

import rsnet
import rsnet.data
from rsnet.data import DATASETS

if TYPE_CHECKING:
    from rsnet.export import ExportResult
    from rsnet.models.output import MultiBranchOutput

# rsnet's models, checkpoints and exports (timm and the rest) are imported where used: training workers that a test
# spawns import the test's module, hence this one, and each import of timm costs them seconds of start-up

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
MINI_ROOT = REPO / "data" / "ucmerced-mini"
TIF_SAMPLE_ROOT = REPO / "tests" / "fixtures" / "ucmerced-tif-sample"
RSNET = Path(rsnet.__file__).resolve().parent

STAND_IN_CLASSES = list("abcd")  # the classes of run_evaluate_script's checkpoint
PREDICT_CLASSES = ["forest", "river", "beach", "harbor"]  # the classes of checkpoint_payload
EXPORT_CLASSES = ["farm", "forest", "harbor"]  # the classes of write_checkpoint
EXPORT_SIZE = 64  # the image size of write_checkpoint


# --------------------------------------------------------------------------------------------- commands


def compose_command(config_name: str, *overrides: str, return_hydra_config: bool = False) -> DictConfig:
    """A command's settings as its Hydra app receives them for these command-line ``overrides``
    (conf/<config_name>.yaml); pass them to the command's ``main(cfg)``. ``return_hydra_config``: with the
    ``hydra`` section too."""
    from hydra import compose, initialize_config_dir

    from rsnet.config_schema import register_schemas

    register_schemas()  # as importing rsnet.commands does
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def training_config(*overrides: str) -> dict:
    """rsnet-train's settings as a plain dict (conf/config.yaml and its groups, every value from the yaml files),
    for the code that takes the resolved config; ``run_dir`` stays unresolved (no Hydra run here)."""
    return OmegaConf.to_container(compose_command("config", *overrides))


def dataset_config(name: str, **overrides: object) -> dict:
    """conf/dataset/<name>.yaml as a run composes it (with conf/_base/dataset.yaml), plus ``overrides``."""
    return {**training_config(f"dataset={name}")["dataset"], **overrides}


def trainer_config(name: str, **overrides: object) -> dict:
    """conf/trainer/<name>.yaml as a run composes it (with conf/_base/launcher.yaml), plus ``overrides``."""
    return {**training_config(f"trainer={name}")["trainer"], **overrides}


def command_in_process(name: str, *args: str, capture: pytest.CaptureFixture) -> subprocess.CompletedProcess:
    """rsnet-<name> (``export``, ``predict``, ``evaluate``; a trailing ``.py`` is dropped) in this process: its
    settings composed from ``args`` as Hydra composes the command line, then the command's ``main`` (no interpreter
    start); its exit status (0 when it returned) and what it printed (``capture``: capsys or capfd)."""
    command = name.removesuffix(".py")
    main = importlib.import_module(f"rsnet.commands.{command}").main
    capture.readouterr()
    try:
        main(compose_command(command, *args))
        status = 0
    except SystemExit as stop:
        status = stop.code
    captured = capture.readouterr()
    return subprocess.CompletedProcess([name, *args], status, captured.out, captured.err)


def run_train(run_dir: Path, *overrides: str) -> int:
    """rsnet-train in this process, as Hydra runs it for the command line ``overrides`` with ``hydra.run.dir=run_dir``
    (without its callbacks and log file); returns the exit status (0 when the command returned). Its output is the
    test's (``capfd``: the spawned workers' too)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    from rsnet.commands import train

    cfg = compose_command("config", *overrides, f"hydra.run.dir={run_dir}", return_hydra_config=True)
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(run_dir)  # what Hydra sets when the job starts
    HydraConfig.instance().set_config(cfg)
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        del task_cfg["hydra"]  # the task sees its settings only, as under Hydra
    Path(run_dir).mkdir(parents=True, exist_ok=True)  # Hydra creates the run dir before the job starts
    try:
        train.main(task_cfg)
    except SystemExit as stop:
        return int(stop.code or 0)
    finally:
        HydraConfig.instance().cfg = None
    return 0


def load_predict_script() -> ModuleType:
    """The code of scripts/predict.py (a thin wrapper) and of the rsnet-predict command."""
    return importlib.import_module("rsnet.commands.predict")


def load_export_script() -> ModuleType:
    """The code of scripts/export_main_branch.py (a thin wrapper) and of the rsnet-export command."""
    return importlib.import_module("rsnet.commands.export")


# --------------------------------------------------------------------------------------------- fake archives


def label_value(label: int) -> int:
    """Red-channel value of a fake image of class ``label`` (distinct for up to 45 classes)."""
    return 10 + 5 * label


def fake_file_name(name: str, cls: str, i: int) -> str:
    """File name of image ``i`` of class ``cls`` in the layout of dataset ``name``."""
    if name == "ucmerced":
        return f"{cls}{i:02d}.tif"
    if name == "ucmerced_mini":
        return f"{cls}{i:02d}.jpg"
    if name == "nwpu_resisc45":
        return f"{cls}_{i + 1:03d}.jpg"
    if name == "aid":
        return f"{cls.lower()}_{i + 1}.jpg"
    raise ValueError(name)


def write_image(path: Path, value: int, size: int = 16) -> None:
    """A solid ``size`` px image: red = ``value``, green 128, blue 255 - ``value`` (jpg at quality 95)."""
    arr = np.zeros((size, size, 3), np.uint8)
    arr[..., 0] = value
    arr[..., 1] = 128
    arr[..., 2] = 255 - value
    img = Image.fromarray(arr)
    if path.suffix == ".jpg":
        img.save(path, quality=95)
    else:
        img.save(path)


def truncate_file(path: Path, keep: float = 0.5) -> None:
    """Cut a file to a fraction of its bytes (a typical broken download)."""
    data = path.read_bytes()
    path.write_bytes(data[: max(1, int(len(data) * keep))])


def make_fake_archive(
    base: Path,
    name: str,
    per_class: int | dict[str, int] = 3,
    size: int = 16,
    classes: Iterable[str] | None = None,
    missing: Iterable[str] = (),
    extra: Iterable[str] = (),
    empty: Iterable[str] = (),
    odd_sizes: dict[str, int] | None = None,
) -> Path:
    """Write a fake archive of dataset ``name`` under ``base``; returns its top folder (e.g. ``.../UCMerced_LandUse``).

    Args:
        per_class: images per class (int, or class -> count).
        size: side of the images.
        classes: class list to write (default: the dataset's); ``missing`` are left out.
        extra: additional (unexpected) class folders, with images.
        empty: class folders created without images.
        odd_sizes: relative file -> side, for images of another size (e.g. UCM's 257 px files).
    """
    spec = DATASETS[name]
    top = Path(base) / spec.base_dir
    class_root = top / spec.images_subdir if spec.images_subdir else top
    class_root.mkdir(parents=True, exist_ok=True)
    missing = set(missing)
    empty = set(empty)
    odd_sizes = odd_sizes or {}
    wanted = [c for c in (classes or spec.classes) if c not in missing]
    for cls in [*wanted, *extra]:
        d = class_root / cls
        d.mkdir(exist_ok=True)
        if cls in empty:
            continue
        label = spec.classes.index(cls) if cls in spec.classes else 0
        n = per_class[cls] if isinstance(per_class, dict) else per_class
        for i in range(n):
            fname = fake_file_name(name, cls, i)
            write_image(d / fname, label_value(label), odd_sizes.get(f"{cls}/{fname}", size))
    return top


# --------------------------------------------------------------------------------------------- models and data


class StandInModel(nn.Module):
    """conv trunk -> two branches (main, aux1), each GAP -> Linear; ensemble = mean of their logits."""

    def __init__(self, num_classes: int = 4, width: int = 8) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                   nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU())
        self.main_block = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.aux_block = nn.Sequential(nn.Conv2d(width, width, 3, padding=2, dilation=2), nn.ReLU())
        self.fc_main = nn.Linear(width, num_classes)
        self.fc_aux1 = nn.Linear(width, num_classes)

    def cam_classifiers(self) -> dict[str, nn.Linear]:
        return {"main": self.fc_main, "aux1": self.fc_aux1}

    def forward(self, x: torch.Tensor) -> MultiBranchOutput:
        shared = self.trunk(x)
        features = {"main": self.main_block(shared), "aux1": self.aux_block(shared)}
        logits = {k: self.cam_classifiers()[k](f.mean(dim=(2, 3))) for k, f in features.items()}
        logits["ensemble"] = (logits["main"] + logits["aux1"]) / 2
        from rsnet.models.output import MultiBranchOutput

        return MultiBranchOutput(logits=logits, features=features, ensemble="ensemble")


class PlainClassifier(nn.Module):
    """An exported-style model: returns a logits Tensor."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TensorDataset(torch.utils.data.Dataset):
    """``n`` random images (seeded) labelled 0, 1, ..., num_classes - 1, 0, 1, ... in turn."""

    def __init__(self, n: int = 10, num_classes: int = 4, size: int = 32, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.labels = (torch.arange(n) % num_classes).numpy()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.labels[i])


def run_evaluate_script(model: nn.Module, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *overrides: str) -> None:
    """scripts/evaluate.py in-process, its command line ``overrides`` parsed by Hydra from conf/evaluate.yaml; the
    checkpoint is ``model`` (classes ``STAND_IN_CLASSES``, 16 px) and its test split ``TensorDataset(n=8, size=16)``."""
    import rsnet.model_loading
    from rsnet.model_loading import LoadedModel, ModelSource

    script = importlib.import_module("rsnet.commands.evaluate")  # the code of scripts/evaluate.py (a thin wrapper)
    loaded = LoadedModel(model, ModelSource(tmp_path / "run" / "checkpoints" / "best.pt", "checkpoint"),
                         {"class_names": STAND_IN_CLASSES, "image_size": 16, "mean": [0.5] * 3, "std": [0.5] * 3},
                         {"dataset": {"name": "stand_in", "train_ratio": 0.5}, "seed": 0})
    monkeypatch.setattr(rsnet.model_loading, "load_model", lambda path, device: loaded)
    monkeypatch.setattr(rsnet.data, "build_datasets_from_config", lambda *args, **kwargs: SimpleNamespace(
        test=TensorDataset(n=8, size=16), class_names=STAND_IN_CLASSES))
    script.main(compose_command("evaluate", "checkpoint=stand_in", *overrides))


# --------------------------------------------------------------------------------------------- checkpoints


def checkpoint_payload(model_config: dict, state: dict) -> dict:
    """A training checkpoint's contents for predict: classes ``PREDICT_CLASSES``, 32 px, ImageNet statistics."""
    return {"model_config": model_config, "model_state": state, "class_names": PREDICT_CLASSES, "image_size": 32,
            "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "epoch": 1}


def write_checkpoint(path: Path, arch: str = "esd_mbenet", classes: list[str] = EXPORT_CLASSES,
                     **overrides: object) -> Path:
    """A training checkpoint of a seeded ``arch`` on test_resnet (``EXPORT_SIZE`` px); ``overrides`` replace its
    entries."""
    from rsnet.models import build_model

    torch.manual_seed(0)
    return save_model_checkpoint(path, build_model(arch, "test_resnet", len(classes)), classes, **overrides)


def save_model_checkpoint(path: Path, model: nn.Module, classes: list[str] = EXPORT_CLASSES,
                          without: str | None = None, **overrides: object) -> Path:
    """A training checkpoint of ``model`` (put in eval mode; ``EXPORT_SIZE`` px) whose model_config lacks the setting
    ``without`` (None: none), as rsnet wrote before that setting; ``overrides`` replace its entries."""
    from rsnet.checkpoint import save_checkpoint

    model.eval()
    config = {key: value for key, value in model.model_config.items() if key != without}
    payload = {"model_config": config, "model_state": model.state_dict(), "class_names": classes,
               "image_size": EXPORT_SIZE, "mean": [0.4, 0.4, 0.4], "std": [0.2, 0.2, 0.2], "epoch": 0, **overrides}
    return save_checkpoint(path, payload)


# --------------------------------------------------------------------------------------------- export


def full_logits(checkpoint: Path, x: torch.Tensor, head: str) -> torch.Tensor:
    """The logits of the full model of a training checkpoint: its main branch (``head="main"``) or its prediction."""
    from rsnet.model_loading import model_from_training_checkpoint

    model, _ = model_from_training_checkpoint(checkpoint)
    with torch.no_grad():
        out = model(x)
    return out.main_logits if head == "main" else out.prediction_logits


def export_recording(checkpoint: Path, out: Path, **kwargs: object) -> tuple[ExportResult,
                                                                             list[warnings.WarningMessage]]:
    """``export_checkpoint`` with every warning it emits recorded (none filtered out by the test)."""
    from rsnet.export import export_checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = export_checkpoint(checkpoint, out, **kwargs)
    return result, caught


def deprecations_from_rsnet(caught: list[warnings.WarningMessage]) -> list[str]:
    """The DeprecationWarnings/FutureWarnings attributed to rsnet's own files (its calls of deprecated APIs)."""
    return [f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}" for w in caught
            if issubclass(w.category, (DeprecationWarning, FutureWarning)) and Path(w.filename).is_relative_to(RSNET)]


# --------------------------------------------------------------------------------------------- distributed


class DictStore:
    """An in-memory stand-in for the c10d store's atomic counter (``add``), for scheduler tests without processes."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def add(self, key: str, amount: int) -> int:
        self.values[key] = self.values.get(key, 0) + amount
        return self.values[key]


# ------------------------------------------------------------------------------------------- waiting on events

HANG_S = 240.0  # the ceiling of a wait on an event: only a hang reaches it, however busy the machine


def wait_for(condition: Callable[[], object], what: str, ceiling_s: float = HANG_S,
             alive: subprocess.Popen | None = None) -> object:
    """Return ``condition()``'s first truthy value, checked every few milliseconds (a file written, a store key set:
    events another process makes, which no in-process primitive can signal); fail naming ``what`` when ``ceiling_s``
    passes, or at once when ``alive`` ends first. The ceiling is not a measure of anything: it only ends a hang."""
    deadline = time.monotonic() + ceiling_s
    while not (value := condition()):
        if alive is not None and alive.poll() is not None:
            pytest.fail(f"{what}: the process ended first (exit code {alive.returncode})")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {ceiling_s:.0f} s (a hang)")
        time.sleep(0.005)
    return value


def wait_for_exit(pid: int, what: str, ceiling_s: float = HANG_S) -> None:
    """Block until process ``pid`` (not necessarily this one's child) has ended: its pidfd becomes readable at the
    exit, no polling; fail naming ``what`` when ``ceiling_s`` passes first."""
    try:
        descriptor = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        poller = select.poll()
        poller.register(descriptor, select.POLLIN)
        if not poller.poll(int(ceiling_s * 1000)):
            pytest.fail(f"{what}: process {pid} still runs after {ceiling_s:.0f} s (a hang)")
    finally:
        os.close(descriptor)
