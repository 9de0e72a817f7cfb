"""dataset=image_folder: the user's own data, one sub-folder of images per class, its spec read from dataset.root."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, compose_command, run_train
from omegaconf import OmegaConf
from PIL import Image

from rsnet.data import DatasetNotFoundError, DatasetValidationError, build_datasets, get_spec
from rsnet.data.datasets import build_datasets_from_config
from rsnet.data.specs import IMAGE_EXTENSIONS, image_folder_spec

CLASSES = ("river", "Beach", "city")  # written in this order; the labels follow the sorted names


def write_scenes(root: Path, per_class: dict[str, int] | None = None, size: int = 16) -> Path:
    """``root/<class>/<i>.jpg|.PNG`` solid images whose red channel encodes the class's sorted position."""
    per_class = per_class if per_class is not None else dict.fromkeys(CLASSES, 6)
    order = sorted(per_class)
    for cls, n in per_class.items():
        folder = root / cls
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            pixels = np.zeros((size, size, 3), np.uint8)
            pixels[..., 0] = 20 + 60 * order.index(cls)
            Image.fromarray(pixels).save(folder / f"{cls}_{i}.{'PNG' if i % 2 else 'jpg'}")  # both cases of suffix
    return root


def test_classes_are_the_sorted_folder_names_with_their_image_counts(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "my_scenes", {"river": 3, "Beach": 5, "city": 2})
    (root / "city" / "notes.txt").write_text("not an image")
    (root / "city" / ".hidden.jpg").write_bytes(b"")
    (root / "river" / "sub").mkdir()  # a folder inside a class folder is not an image
    spec = image_folder_spec(root)
    assert spec.name == "image_folder" and spec.classes == ("Beach", "city", "river")
    assert dict(spec.counts) == {"Beach": 5, "city": 2, "river": 3} and spec.num_images == 10
    assert spec.base_dir == "my_scenes" and spec.images_subdir == "" and spec.layout.startswith("my_scenes/<class>/")
    assert spec.title == f"image folder {root}"
    assert spec.url == ("none: dataset=image_folder is your own data (a folder with one sub-folder of images per "
                        "class), read from dataset.root")
    assert get_spec("image_folder", root) == spec  # the lookup of dataset.name builds the same spec


def test_folders_without_images_and_hidden_folders_are_not_classes(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "scenes")
    (root / "empty").mkdir()
    (root / "only_text").mkdir()
    (root / "only_text" / "readme.md").write_text("x")
    (root / "nested" / "deeper").mkdir(parents=True)
    write_scenes(root / "nested" / "deeper", {"x": 2})  # images two levels down do not make 'nested' a class
    write_scenes(root / ".ipynb_checkpoints", {"y": 2})
    (root / ".thumbs").mkdir()
    Image.new("RGB", (8, 8)).save(root / ".thumbs" / "a.jpg")
    assert image_folder_spec(root).classes == ("Beach", "city", "river")


def test_build_ignores_a_folder_without_images(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "scenes")
    (root / "empty").mkdir()
    bundle = build_datasets("image_folder", root, 0.5, 0, 16)
    assert bundle.class_names == ["Beach", "city", "river"] and len(bundle.train) + len(bundle.test) == 18


def test_build_gives_a_stratified_split_with_the_folder_classes(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "scenes", {"river": 6, "Beach": 4, "city": 10})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the counts come from the folder: no DatasetCountWarning
        bundle = build_datasets("image_folder", root, 0.5, seed=1, image_size=16)
    assert bundle.class_names == ["Beach", "city", "river"]
    assert bundle.root == root and bundle.spec.name == "image_folder"
    assert np.bincount(bundle.train.labels, minlength=3).tolist() == [2, 5, 3]
    assert np.bincount(bundle.test.labels, minlength=3).tolist() == [2, 5, 3]
    assert set(bundle.split.train).isdisjoint(bundle.split.test) and len(bundle.split.train + bundle.split.test) == 20
    for ds in (bundle.train, bundle.test):  # every label matches the folder its file came from (pixels too)
        for i in range(len(ds)):
            assert ds.names[i].split("/")[0] == bundle.class_names[ds.labels[i]]
            assert abs(int(ds.raw(i)[..., 0].mean()) - (20 + 60 * int(ds.labels[i]))) <= 3


def test_build_from_the_shipped_config_with_a_user_root(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "scenes")
    config = OmegaConf.to_container(compose_command("config", "dataset=image_folder").dataset)  # with its base
    config["root"] = str(root)
    bundle = build_datasets_from_config(config, seed=0, image_size=32)
    assert bundle.image_size == 32 and bundle.train.raw(0).shape == (32, 32, 3)
    assert bundle.class_names == ["Beach", "city", "river"] and (len(bundle.train), len(bundle.test)) == (9, 9)
    assert bundle.split.dataset == "image_folder" and bundle.split.class_names == ["Beach", "city", "river"]


def test_the_config_has_the_keys_of_the_other_dataset_configs() -> None:
    mine = compose_command("config", "dataset=image_folder").dataset
    mini = compose_command("config", "dataset=ucmerced_mini").dataset
    assert set(mine) == set(mini) and mine.name == "image_folder" and mine.root is None
    assert 0 < mine.train_ratio < 1 and mine.cache in ("memory", "disk", "none")


@pytest.mark.parametrize("root", [None, ""])
def test_root_not_set_is_one_line_naming_dataset_root(root) -> None:
    with pytest.raises(ValueError) as err:
        build_datasets("image_folder", root, 0.5, 0, 16)
    assert str(err.value) == ("dataset.root=... is required for dataset=image_folder: "
                              "a folder with one sub-folder of images per class")


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_root_missing_or_not_a_folder_is_file_not_found(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "scenes"
    if kind == "file":
        root.write_text("x")
    with pytest.raises(FileNotFoundError) as err:
        build_datasets("image_folder", root, 0.5, 0, 16)
    assert isinstance(err.value, DatasetNotFoundError)
    message = str(err.value)
    assert f"dataset.root='{root}'" in message and "\n" not in message
    assert ("does not exist" if kind == "missing" else "is not a folder") in message


def test_one_class_is_refused_naming_root_and_what_was_found(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "scenes", {"river": 4})
    (root / "empty").mkdir()
    Image.new("RGB", (8, 8)).save(root / "loose.png")
    with pytest.raises(ValueError) as err:
        build_datasets("image_folder", root, 0.5, 0, 16)
    assert str(err.value) == (
        f"dataset.root='{root}' holds only 1 sub-folder with images ('river', 4 images), and 1 images directly in it "
        "(they are not read); dataset=image_folder needs a folder with one sub-folder of images per class, at least "
        f"2 classes (extensions {', '.join(IMAGE_EXTENSIONS)})")


def test_no_class_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "scenes" / "a").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds no sub-folder with images; dataset=image_folder needs"):
        image_folder_spec(tmp_path / "scenes")


def test_a_class_with_one_image_is_refused_as_for_every_dataset(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "scenes", {"river": 3, "Beach": 1})
    with pytest.raises(DatasetValidationError, match=r"'Beach' has 1 image\(s\).*every class needs at least 2 images"):
        build_datasets("image_folder", root, 0.5, 0, 16)


def test_unknown_name_lists_image_folder() -> None:
    with pytest.raises(ValueError, match=r"valid names: .*'image_folder'"):
        get_spec("my_scenes")


@pytest.mark.slow
def test_train_on_a_user_config_dir_dataset(tmp_path: Path) -> None:
    root = write_scenes(tmp_path / "scenes")
    conf = tmp_path / "my_conf" / "dataset"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text(f"defaults: [image_folder, _self_]\nroot: {json.dumps(str(root))}\n")
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), "--config-dir", str(tmp_path / "my_conf"), "dataset=mine",
         "backbone=test_resnet", "model=baseline", "epochs=1", "dataset.image_size=32", "batch_size=8",
         "log.progress_bar=false", "trainer.devices=[cpu]", f"hydra.run.dir={run_dir}"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    matrix = metrics["confusion_matrix"]
    assert len(matrix) == len(CLASSES) and all(len(row) == len(CLASSES) for row in matrix)
    assert metrics["test_samples"] == 9 and sum(map(sum, matrix)) == 9
    assert json.loads((run_dir / "split.json").read_text())["class_names"] == sorted(CLASSES)


@pytest.mark.slow
def test_train_without_a_root_is_one_line_exit_2(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    status = run_train(tmp_path / "run", "dataset=image_folder", "backbone=test_resnet", "trainer.devices=[cpu]")
    err = capfd.readouterr().err
    assert status == 2, err
    assert err.strip().splitlines()[-1] == (
        "error: dataset.root=... is required for dataset=image_folder: "
        "a folder with one sub-folder of images per class")
    assert not (tmp_path / "run" / "checkpoints").exists()
