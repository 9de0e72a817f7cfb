"""``pip install .`` (not editable) gives a working tool: the wheel holds the commands, the configs and the bundled
sample, and the commands work from a folder outside the checkout.

The wheel is built from a copy of the sources (so no build/ folder is left in the checkout) and installed with
``--no-deps`` into a fresh venv outside the repository; a ``.pth`` file there makes the dev venv's packages (torch,
timm, hydra, ...) importable without reinstalling them. A plain path in a ``.pth`` file adds that folder to
``sys.path`` without running the ``.pth`` files inside it, so the dev venv's editable rsnet (its finder is
installed by a ``.pth`` file) stays out and rsnet is imported from the wheel, which is checked.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "README.md", "rsnet", "conf", "data")
# a run's end without the attention pages of every class and the projector's images: seconds of drawing that the
# installed commands do not depend on
TINY = ["backbone=test_resnet", "dataset.image_size=32", "epochs=1", "trainer.devices=[cpu]", "log.progress_bar=false",
        "log.attention_images=1", "log.embedding_images=0"]


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 180):
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{result.args} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a copy of the checkout's sources (build isolation off: the dev venv's setuptools builds it)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(REPO / name, source / name)
    _ok(_run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "--quiet",
              "-w", str(work / "dist")], cwd=work, timeout=300))
    (found,) = (work / "dist").glob("rsnet-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(bin folder, environment, a working folder outside the checkout) of a fresh venv with the wheel installed."""
    home = tmp_path_factory.mktemp("installed")
    root = home / "venv"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=home))
    python = root / "bin" / "python"
    _ok(_run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--quiet",
              str(wheel)], cwd=home, timeout=300))
    site = Path(_ok(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         cwd=home)).strip())
    (site / "zz_dev_venv_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(root),
               PYTHONDONTWRITEBYTECODE="1")
    work = home / "work"
    work.mkdir()
    return root / "bin", env, work


def test_wheel_holds_every_package_the_configs_and_the_sample(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(init.parent.relative_to(REPO)) for init in (REPO / "rsnet").rglob("__init__.py")}
    assert {f"{package}/__init__.py" for package in packages} <= names  # pyproject.toml lists the packages
    project = (REPO / "pyproject.toml").read_text()
    config_groups = [f'"rsnet.conf.{folder.name}"' for folder in (REPO / "conf").iterdir()
                     if folder.is_dir() and any(folder.glob("*.yaml"))]  # not __pycache__
    assert all(group in project for group in config_groups), config_groups  # else setuptools warns of each at install
    configs = {f"rsnet/conf/{path.relative_to(REPO / 'conf')}" for path in (REPO / "conf").rglob("*.yaml")}
    assert configs and configs <= names
    images = {f"rsnet/sample/{path.relative_to(REPO / 'data')}" for path in (REPO / "data").rglob("*.jpg")}
    assert len(images) == 420 and images <= names
    assert wheel.stat().st_size < 10 * 2**20
    entry_points = zipfile.ZipFile(wheel).read("rsnet-0.1.0.dist-info/entry_points.txt").decode()
    for command in ("rsnet-train", "rsnet-evaluate", "rsnet-export", "rsnet-predict", "rsnet-aggregate"):
        assert f"{command} = rsnet.commands." in entry_points


def test_installed_commands_train_export_predict_outside_the_checkout(venv, tmp_path: Path) -> None:
    bin_dir, env, work = venv
    where = _ok(_run([str(bin_dir / "python"), "-c",
                      "import rsnet, importlib.resources as r; from rsnet.data.datasets import default_root; "
                      "print(rsnet.__file__); print(r.files('rsnet.conf')); print(default_root('ucmerced_mini'))"],
                     cwd=work, env=env)).splitlines()
    venv_root = bin_dir.parent
    assert all(Path(line).is_relative_to(venv_root) for line in where), where  # the wheel's, not the checkout's

    assert "dataset: aid, eurosat_ms, eurosat_rgb, image_folder, nwpu_resisc45, ucmerced, ucmerced_mini" in _ok(
        _run([str(bin_dir / "rsnet-train"), "--help"], cwd=work, env=env))
    assert "checkpoint: ???" in _ok(_run([str(bin_dir / "rsnet-predict"), "--help"], cwd=work, env=env))

    run_dir = tmp_path / "run"
    out = _ok(_run([str(bin_dir / "rsnet-train"), *TINY, f"hydra.run.dir={run_dir}"], cwd=work, env=env))
    assert f"run dir: {run_dir}" in out and "test accuracy" in out
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()

    exported = tmp_path / "exported"
    out = _ok(_run([str(bin_dir / "rsnet-export"), f"checkpoint={run_dir}", f"out={exported}"], cwd=work, env=env))
    assert "exported main head" in out and (exported / "model.safetensors").is_file()  # format=auto: timm's
    assert "deprecated" not in out.lower()

    images = tmp_path / "images"
    shutil.copytree(Path(where[2]) / "Images" / "beach", images)
    preds = tmp_path / "preds.csv"
    _ok(_run([str(bin_dir / "rsnet-predict"), f"checkpoint={exported}", f"images={images}", f"out={preds}"],
             cwd=work, env=env))
    with preds.open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == len(list(images.glob("*.jpg"))) == 20  # the sample's beach

    metrics = tmp_path / "eval.json"
    out = _ok(_run([str(bin_dir / "rsnet-evaluate"), f"checkpoint={run_dir}", f"out={metrics}"], cwd=work, env=env))
    assert "ucmerced_mini test split (210 images)" in out and metrics.is_file()

    out = _ok(_run([str(bin_dir / "rsnet-aggregate"), f"folders={run_dir}"], cwd=work, env=env))
    assert "| esd_mbenet | test_resnet | 0 |" in out and "| esd_mbenet (test_resnet) ensemble |" in out
    assert not list(work.iterdir())  # nothing written to the working folder: every output went where it was sent
