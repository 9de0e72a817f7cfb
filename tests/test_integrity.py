"""Files that are not what rsnet wrote are refused in one line naming the file: a checkpoint with a flipped bit or
random bytes, an empty one, an export whose model file was swapped, weights files torch cannot read; and a full disk
however a library reports it."""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import shutil
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from helpers import EXPORT_CLASSES, compose_command, load_export_script, load_predict_script, write_checkpoint

import rsnet.files
from rsnet.cli import user_errors
from rsnet.export import export_checkpoint
from rsnet.files import DiskFullError, disk_full_named
from rsnet.integrity import content_digest
from rsnet.models import build_model
from rsnet.checkpoint import load_checkpoint, save_checkpoint
from rsnet.exported_model import ExportError, load_exported
from rsnet.viz.tensorboard import TensorBoardLogger

DAMAGED = "is damaged: its contents do not match the SHA-256 written with them"


def flip_bits_of_tensor(path: Path, tensor: torch.Tensor, count: int = 16) -> None:
    """Flip one bit in each of ``count`` float32 values of ``tensor``'s bytes where they lie in the file (torch
    stores tensors uncompressed)."""
    data = bytearray(path.read_bytes())
    start = bytes(data).find(tensor.contiguous().numpy().tobytes())
    assert start >= 0
    for value in range(count):
        data[start + 4 * value + 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_checkpoint_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    """A checkpoint with flipped bits in a weight is refused as damaged, naming the file, by the loader and by
    rsnet-export and rsnet-predict (exit 2, one line): nothing is computed from it."""
    path = write_checkpoint(tmp_path / "best.pt")
    weight = max(load_checkpoint(path)["model_state"].values(), key=torch.Tensor.numel)
    flip_bits_of_tensor(path, weight)
    with pytest.raises(ValueError, match=DAMAGED):
        load_checkpoint(path)
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(images / "a.png")
    commands = {"export": (load_export_script(), [f"out={tmp_path / 'out'}"]),
                "predict": (load_predict_script(), [f"images={images}"])}
    for name, (command, settings) in commands.items():
        with pytest.raises(SystemExit) as stop:
            command.main(compose_command(name, f"checkpoint={path}", *settings))
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(f"error: {path} {DAMAGED}") and err.count("\n") == 1, err


def test_random_bytes_and_an_empty_file_say_what_is_wrong(tmp_path: Path) -> None:
    """200 random bytes inside a checkpoint and a 0-byte checkpoint are each refused with one message naming the
    file and what is wrong with it (damaged, or not an rsnet checkpoint), never loaded."""
    path = write_checkpoint(tmp_path / "last.pt")
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(0)
    offset = len(data) // 2
    data[offset:offset + 200] = rng.integers(0, 256, 200, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"^{path} (is damaged|cannot be read as an rsnet checkpoint)"):
        load_checkpoint(path)
    path.write_bytes(b"")
    for mmap in (True, False):
        with pytest.raises(ValueError) as refused:
            load_checkpoint(path, mmap=mmap)
        assert str(refused.value).startswith(f"{path} cannot be read as an rsnet checkpoint: the file is empty "
                                             "(0 bytes); if it is a run's last.pt")
        assert "mmap" not in str(refused.value) and "weights_only" not in str(refused.value)


def test_resaving_a_loaded_checkpoint_writes_a_fresh_digest(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "a.pt")
    loaded = load_checkpoint(path)
    loaded["epoch"] = 5
    load_checkpoint(save_checkpoint(tmp_path / "b.pt", loaded))  # verified: the stale digest was not kept
    assert content_digest({"b": torch.ones(2), "a": 1}) == content_digest({"a": 1, "b": torch.ones(2)})
    assert content_digest({"a": torch.ones(2)}) != content_digest({"a": torch.ones(2, dtype=torch.float64)})


def test_a_checkpoint_without_a_digest_loads_with_a_warning(tmp_path: Path, caplog) -> None:
    """Checkpoints of an older rsnet (format 1) stay usable, unverified, and the log says so."""
    path = write_checkpoint(tmp_path / "old.pt")
    payload = load_checkpoint(path)
    del payload["sha256"]
    torch.save({**payload, "format_version": 1}, path)
    assert load_checkpoint(path)["epoch"] == 0
    assert "was written by an rsnet without content hashes" in caplog.text
    torch.save({**payload, "format_version": 2}, path)  # a current checkpoint that lost its digest
    with pytest.raises(ValueError, match="has lost its content hash"):
        load_checkpoint(path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "best.pt")


@pytest.mark.parametrize("fmt", ["torchscript", "state_dict", "timm"])
def test_an_export_whose_model_file_was_swapped_is_refused(fmt: str, checkpoint: Path, tmp_path: Path) -> None:
    """An export whose model file was replaced by another model's is refused: model.json's digests no longer match."""
    ours, other = tmp_path / "ours", tmp_path / "other"
    export_checkpoint(checkpoint, ours, format=fmt)
    meta = json.loads((ours / "model.json").read_text())
    assert meta["output_size"] == meta["num_classes"] == len(EXPORT_CLASSES) and meta["rsnet_export"] == 3
    assert set(meta["sha256"]) == {"model.json"} | ({"model.safetensors", "config.json"} if fmt == "timm"
                                                    else {meta["file"]})
    torch.manual_seed(1)
    seven = build_model("esd_mbenet", "test_resnet", 7).eval()
    other_checkpoint = write_checkpoint(tmp_path / "seven.pt", classes=[f"c{i}" for i in range(7)],
                                        model_state=seven.state_dict(), model_config=seven.model_config)
    export_checkpoint(other_checkpoint, other, format=fmt)
    shutil.copy(other / meta["file"], ours / meta["file"])
    with pytest.raises(ExportError, match=f"^{ours / meta['file']} does not match the SHA-256 that "
                                          f"{ours / 'model.json'} records for it: .*export the checkpoint again$"):
        load_exported(ours)


def test_an_export_that_scores_another_number_of_classes_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    """Without the digests (an export of an older rsnet) the model's output size is still checked against the
    classes model.json names: a mismatch is refused in one message naming both numbers."""
    export_checkpoint(checkpoint, tmp_path, format="torchscript")
    meta = json.loads((tmp_path / "model.json").read_text())
    del meta["sha256"], meta["output_size"]
    meta["class_names"] = meta["class_names"] + ["extra"]
    meta["num_classes"] = len(meta["class_names"])
    (tmp_path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(ExportError, match=f"^{tmp_path / 'model.json'} names {len(EXPORT_CLASSES) + 1} classes "
                                          f".* but model.ts scores {len(EXPORT_CLASSES)}: the model file and its "
                                          "model.json do not belong together"):
        load_exported(tmp_path)


def test_weights_torch_cannot_read_get_a_reason_not_unsafe_advice(tmp_path: Path) -> None:
    """Random bytes as backbone.pretrained are refused with the reason, never with advice to retry with
    weights_only=False (which would run code from the file)."""
    from rsnet.models.timm_classifier import BackboneError, create_timm_classifier

    junk = tmp_path / "weights.pth"
    junk.write_bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    with pytest.raises(BackboneError) as refused:
        create_timm_classifier("test_resnet", 3, pretrained=str(junk))
    message = str(refused.value)
    assert message.startswith(f"backbone.pretrained={junk} does not load into backbone.name='test_resnet' (the file "
                              "(4000 bytes) is not in torch.save's format")
    assert "weights_only" not in message and "\n" not in message


def test_a_raw_pickle_as_backbone_weights_is_one_line_without_torchs_warning(tmp_path: Path) -> None:
    """A raw pickle as backbone weights is refused in rsnet's one line, with no warning of torch's before it."""
    from rsnet.models.timm_classifier import BackboneError, create_timm_classifier

    weights = tmp_path / "weights.pth"
    weights.write_bytes(pickle.dumps({"conv.weight": [1.0, 2.0]}))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(BackboneError) as refused:
        warnings.simplefilter("always")
        create_timm_classifier("test_resnet", 3, pretrained=str(weights))
    assert "is not in torch.save's format" in str(refused.value)
    assert not [str(warning.message) for warning in caught if "pickle" in str(warning.message)], caught



def test_a_local_dir_backbone_whose_weights_hold_objects_is_one_line_without_unsafe_advice(tmp_path: Path) -> None:
    """A local-dir backbone whose weights hold objects is refused in one line: no torch warning, no advice to retry
    with weights_only=False."""
    from rsnet.models.timm_classifier import BackboneError, create_timm_classifier

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architecture": "test_resnet", "num_classes": 10}))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"conv.weight": [1.0], "note": Path("x")}))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(BackboneError) as refused:
        warnings.simplefilter("always")
        create_timm_classifier(f"local-dir:{folder}", 3, pretrained=True)
    message = str(refused.value)
    assert f"{folder / 'pytorch_model.bin'}: the file" in message, message
    assert "weights_only" not in message and "\n" not in message, message
    assert not [str(warning.message) for warning in caught if "pickle" in str(warning.message)], caught

class _FillsUp(io.RawIOBase):
    """A file on a disk that fills up after ``room`` bytes."""

    def __init__(self, room: int) -> None:
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)


def test_a_full_disk_inside_torch_save_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """A disk that fills up inside torch.save (which wraps the file's OSError in its own RuntimeError) is the one
    line of a full disk, and the previous checkpoint stays as it was."""
    last = write_checkpoint(tmp_path / "last.pt")
    before = last.read_bytes()
    real_fdopen = os.fdopen

    def fills_up(fd: int, mode: str = "r", *args, **kwargs):
        real_fdopen(fd, mode).close()
        return io.BufferedWriter(_FillsUp(room=20_000))

    monkeypatch.setattr(rsnet.files.os, "fdopen", fills_up)
    with pytest.raises(SystemExit) as stopped, user_errors():
        save_checkpoint(last, {**load_checkpoint(last), "epoch": 1})
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (f"error: no space left on device while writing {last}; free space on that file "
                                       "system or write elsewhere (its previous version, if any, is intact)\n")
    monkeypatch.undo()
    assert last.read_bytes() == before and [path.name for path in tmp_path.iterdir()] == ["last.pt"]


def test_a_full_disk_in_tensorboards_writer_thread_is_one_line(tmp_path: Path, capsys) -> None:
    """A full disk in TensorBoard's writer thread is reported once, as the one line of a full disk where TensorBoard
    raises it again: no traceback from the thread nor from the worker."""
    logger = TensorBoardLogger(tmp_path / "tensorboard")
    failing = threading.Thread(target=lambda: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    failing.start()
    failing.join()
    assert "Traceback" not in capsys.readouterr().err  # the writer thread's death is reported where it is re-raised
    with pytest.raises(DiskFullError, match=f"^no space left on device while writing {tmp_path}; "):
        with disk_full_named(tmp_path):
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    with pytest.raises(ValueError, match="unrelated"), disk_full_named(tmp_path):
        raise ValueError("unrelated")
    logger.close()
