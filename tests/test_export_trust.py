"""An export is used only as rsnet wrote it: an edited model.json, a model.json that names a file or a model outside
its folder, and damaged or crafted model files are refused in one line naming the file, before anything outside the
export is opened; a raw pickle is refused without torch's warning."""

from __future__ import annotations

import json
import pickle
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import timm
import torch
from helpers import EXPORT_CLASSES, EXPORT_SIZE, compose_command, load_predict_script, write_checkpoint
from PIL import Image

from rsnet.checkpoint import load_checkpoint
from rsnet.export import export_checkpoint
from rsnet.exported_model import ExportError, load_exported
from rsnet.models import build_model

EXPORTS = {"timm": ("timm", "main"), "state_dict": ("state_dict", "main"), "ensemble": ("state_dict", "ensemble"),
           "torchscript": ("torchscript", "main")}


@pytest.fixture(scope="module")
def exports(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One export of each kind in ``EXPORTS``, written once; a test that changes one works on a copy."""
    root = tmp_path_factory.mktemp("exports")
    for name, (fmt, head) in EXPORTS.items():
        export_checkpoint(checkpoint, root / name, format=fmt, head=head)
    return {name: root / name for name in EXPORTS}


def copy_of(exports: dict[str, Path], name: str, tmp_path: Path) -> Path:
    """A fresh copy of the export ``name`` under ``tmp_path``."""
    return Path(shutil.copytree(exports[name], tmp_path / name))


def edit_metadata(folder: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """Apply ``change`` to ``folder``'s model.json as a hand edit would; the path of model.json."""
    path = folder / "model.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta, indent=2))
    return path


def as_unhashed(meta: dict[str, Any]) -> None:
    """Make ``meta`` an export of an older rsnet, which recorded no SHA-256 at all."""
    del meta["sha256"]
    meta["rsnet_export"] = 1


@pytest.fixture
def opened_files() -> Iterator[list[str]]:
    """The paths this process opens with Python's open() while the test runs."""
    opened: list[str] = []
    recording = [True]

    def record(event: str, args: tuple[Any, ...]) -> None:
        if recording[0] and event == "open" and isinstance(args[0], (str, Path)):
            opened.append(str(args[0]))

    sys.addaudithook(record)
    yield opened
    recording[0] = False


def swap_first_classes(meta: dict[str, Any]) -> None:
    meta["class_names"][0], meta["class_names"][1] = meta["class_names"][1], meta["class_names"][0]


EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "swapped class names": swap_first_classes,
    "mean": lambda meta: meta.update(mean=[0.5, 0.5, 0.5]),
    "image size": lambda meta: meta.update(image_size=32),
    "high bit depth": lambda meta: meta.update(high_bit_depth="minmax"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edited_model_json_is_refused_naming_it(edit: str, exports: dict[str, Path], tmp_path: Path) -> None:
    """An edited model.json (two class names swapped, another mean) is refused in one line: its contents do not
    match the SHA-256 it records."""
    for name in EXPORTS:
        metadata = edit_metadata(copy_of(exports, name, tmp_path), EDITS[edit])
        with pytest.raises(ExportError) as refused:
            load_exported(metadata.parent)
        message = str(refused.value)
        assert message.startswith(f"{metadata} was changed after the export: its contents do not match the SHA-256 "
                                  "it records for them") and "\n" not in message, message


def test_predict_with_an_edited_model_json_is_one_line(exports: dict[str, Path], tmp_path: Path, capsys) -> None:
    folder = copy_of(exports, "timm", tmp_path)
    metadata = edit_metadata(folder, swap_first_classes)
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(images / "a.png")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        load_predict_script().main(compose_command("predict", f"checkpoint={folder}", f"images={images}"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"error: {metadata} was changed after the export")
    assert err.count("\n") == 1 and err.rstrip().endswith("export the checkpoint again"), err


def test_a_model_json_that_lost_its_own_hash_is_refused(exports: dict[str, Path], tmp_path: Path) -> None:
    metadata = edit_metadata(copy_of(exports, "state_dict", tmp_path), lambda meta: meta["sha256"].pop("model.json"))
    with pytest.raises(ExportError, match=f"^{metadata} has lost the SHA-256 of its own contents"):
        load_exported(metadata)


def test_a_timm_export_of_the_previous_version_is_checked_against_its_config_json(
        exports: dict[str, Path], tmp_path: Path, caplog) -> None:
    """An export written before model.json hashed itself (rsnet_export 2): the class names, mean/std and image
    size of a timm export are compared with the hashed config.json beside it."""
    def previous_version(meta: dict[str, Any]) -> None:
        meta["sha256"].pop("model.json")
        meta["rsnet_export"] = 2

    folder = copy_of(exports, "timm", tmp_path)
    metadata = edit_metadata(folder, previous_version)
    assert load_exported(folder).class_names == EXPORT_CLASSES
    assert "cannot be verified" in caplog.text
    previous = metadata.read_text()
    for change in (swap_first_classes, EDITS["mean"], EDITS["image size"]):
        edit_metadata(folder, change)
        with pytest.raises(ExportError, match=f"^{metadata} does not agree with {folder / 'config.json'}, the "
                                              "hashed timm config of the same export"):
            load_exported(folder)
        metadata.write_text(previous)


def outside_file(meta: dict[str, Any]) -> None:
    meta["file"] = "../x.pt"


def pretrained_file(meta: dict[str, Any]) -> None:
    meta["model_config"]["pretrained"] = "../weights.pth"


def local_dir_backbone(meta: dict[str, Any]) -> None:
    meta["model_config"]["backbone"] = meta["backbone"] = "local-dir:../elsewhere"


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("state_dict", outside_file, "names the file '../x.pt'; an export's model file is model.pt in its own folder"),
    ("ensemble", pretrained_file, "names backbone weights '../weights.pth' (model_config.pretrained) outside the "
                                  "export"),
    ("ensemble", local_dir_backbone, "names the backbone 'local-dir:../elsewhere', a model outside the export"),
    ("state_dict", local_dir_backbone, "names the backbone 'local-dir:../elsewhere', a model outside the export"),
])
@pytest.mark.parametrize("hashed", [False, True])
def test_a_model_json_never_makes_rsnet_open_a_file_outside_the_export(
        name: str, change: Callable[[dict[str, Any]], None], expected: str, hashed: bool, exports: dict[str, Path],
        tmp_path: Path, opened_files: list[str]) -> None:
    """A model.json that names a file outside the export (``file`` ../x.pt, a ``pretrained`` file, a ``local-dir:``
    backbone) is refused naming that entry, with or without digests, and rsnet opens no file outside the export."""
    folder = copy_of(exports, name, tmp_path)
    shutil.copy(folder / "model.pt", tmp_path / "x.pt")  # loads fine: only the check can stop it
    shutil.copy(folder / "model.pt", tmp_path / "weights.pth")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "config.json").write_text(json.dumps({"architecture": "test_resnet", "num_classes": 3}))

    def crafted(meta: dict[str, Any]) -> None:
        change(meta)
        if hashed:
            meta["sha256"][meta["file"]] = meta["sha256"]["model.pt"]
            meta["sha256"].pop("model.json")
            meta["rsnet_export"] = 2
        else:
            as_unhashed(meta)

    metadata = edit_metadata(folder, crafted)
    opened_files.clear()
    with pytest.raises(ExportError) as refused:
        load_exported(folder)
    message = str(refused.value)
    assert message.startswith(f"{metadata} {expected}") and "\n" not in message, message
    assert message.endswith("export the checkpoint again"), message
    assert not [path for path in opened_files if not Path(path).resolve().is_relative_to(folder.resolve())
                and Path(path).resolve().is_relative_to(tmp_path.resolve())], opened_files


def raw_pickle(path: Path) -> None:
    path.write_bytes(pickle.dumps({"conv.weight": [1.0, 2.0], "note": Path("x")}))


def random_bytes(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes())


@pytest.mark.parametrize(("name", "file", "damage", "reason"), [
    ("state_dict", "model.pt", raw_pickle, "is not in torch.save's format"),
    ("ensemble", "model.pt", random_bytes, "is not in torch.save's format"),
    ("torchscript", "model.ts", random_bytes, "cannot be read as a TorchScript model"),
    ("timm", "model.safetensors", random_bytes, "cannot be read as safetensors"),
])
def test_a_damaged_model_file_of_an_unhashed_export_is_one_line(name: str, file: str, damage: Callable[[Path], None],
                                                                 reason: str, exports: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """A damaged model file of an export without digests is refused in one line naming the file and the reason,
    with no advice to retry with weights_only=False."""
    folder = copy_of(exports, name, tmp_path)
    edit_metadata(folder, as_unhashed)
    damage(folder / file)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ExportError) as refused:
        warnings.simplefilter("always")
        load_exported(folder)
    message = str(refused.value)
    assert message.startswith(f"{folder / file} ") and reason in message, message
    assert "\n" not in message and "weights_only" not in message and message.endswith("export the checkpoint again")
    assert not [str(w.message) for w in caught if "weights_only" in str(w.message)]


def test_a_raw_pickle_checkpoint_is_refused_without_torchs_warning(tmp_path: Path) -> None:
    """A raw pickle as a checkpoint is refused in rsnet's one message, with no warning of torch's."""
    path = tmp_path / "best.pt"
    raw_pickle(path)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError) as refused:
        warnings.simplefilter("always")
        load_checkpoint(path)
    assert str(refused.value).startswith(f"{path} cannot be read as an rsnet checkpoint: the file")
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]


def test_an_export_of_a_local_dir_backbone_needs_nothing_outside_it(tmp_path: Path) -> None:
    """model.json records the timm architecture a ``local-dir:`` backbone builds, not the folder: the export loads
    once the folder is gone."""
    folder = tmp_path / "backbone"
    torch.manual_seed(3)
    timm.models.save_for_hf(timm.create_model("test_resnet"), folder, safe_serialization=True)
    torch.manual_seed(0)
    model = build_model("esd_mbenet", f"local-dir:{folder}", len(EXPORT_CLASSES))
    checkpoint = write_checkpoint(tmp_path / "best.pt", model_state=model.state_dict(),
                                  model_config=model.model_config)
    for head in ("main", "ensemble"):
        result = export_checkpoint(checkpoint, tmp_path / head, format="state_dict", head=head)
        assert result.metadata["backbone"] == result.metadata["model_config"]["backbone"] == "test_resnet"
    shutil.rmtree(folder)
    x = torch.randn(2, 3, EXPORT_SIZE, EXPORT_SIZE)
    with torch.no_grad():
        for head in ("main", "ensemble"):
            assert load_exported(tmp_path / head)(x).shape == (2, len(EXPORT_CLASSES))
