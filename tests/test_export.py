"""Export: TorchScript / state dict / ONNX of the main branch or ensemble, reload, script, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rsnet.engine.checkpoint import save_checkpoint
from rsnet.export import ExportError, export_checkpoint, load_exported
from rsnet.models import build_model

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["farm", "forest", "harbor"]
SIZE = 64


def write_checkpoint(path: Path, arch: str = "esd_mbenet", classes: list[str] = CLASSES, **overrides) -> Path:
    torch.manual_seed(0)
    model = build_model(arch, "test_resnet", len(classes))
    model.eval()
    payload = {"model_config": model.model_config, "model_state": model.state_dict(), "class_names": classes,
               "image_size": SIZE, "mean": [0.4, 0.4, 0.4], "std": [0.2, 0.2, 0.2], "epoch": 0, **overrides}
    return save_checkpoint(path, payload)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "best.pt")


def full_logits(checkpoint: Path, x: torch.Tensor, head: str) -> torch.Tensor:
    from rsnet.export import model_from_training_checkpoint

    model, _ = model_from_training_checkpoint(checkpoint)
    with torch.no_grad():
        out = model(x)
    return out.main_logits if head == "main" else out.prediction_logits


def test_torchscript_reloads_in_a_fresh_process(checkpoint: Path, tmp_path: Path) -> None:
    result = export_checkpoint(checkpoint, tmp_path / "ts", format="torchscript", head="main")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5
    meta = json.loads((tmp_path / "ts" / "model.json").read_text())
    assert meta["class_names"] == CLASSES and meta["image_size"] == SIZE and meta["num_classes"] == 3
    assert meta["backbone"] == "test_resnet" and meta["head"] == "main" and meta["mean"] == [0.4] * 3
    x = torch.randn(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(5))
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys, torch; m = torch.jit.load(sys.argv[1]); x = torch.load(sys.argv[2]); "
            "torch.save(m(x).detach(), sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, str(result.path), str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
                   check=True, capture_output=True, timeout=120)
    y = torch.load(tmp_path / "y.pt")
    assert (y - full_logits(checkpoint, x, "main")).abs().max() <= 1e-5


@pytest.mark.parametrize(("fmt", "head"), [("state_dict", "main"), ("state_dict", "ensemble"),
                                           ("torchscript", "ensemble")])
def test_roundtrip(checkpoint: Path, tmp_path: Path, fmt: str, head: str) -> None:
    result = export_checkpoint(checkpoint, tmp_path, format=fmt, head=head)
    model = load_exported(tmp_path)
    assert model.class_names == CLASSES and model.image_size == SIZE and model.metadata["head"] == head
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        assert (model(x) - full_logits(checkpoint, x, head)).abs().max() <= 1e-5
    assert result.max_abs_diff <= 1e-5
    assert load_exported(result.path).metadata == model.metadata  # the model file works as well as the folder


def test_onnx_main_branch(checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    result = export_checkpoint(checkpoint, tmp_path, format="onnx", head="main")
    assert result.path.name == "model.onnx" and result.path.stat().st_size > 0
    import onnx

    onnx.checker.check_model(onnx.load(str(result.path)))


def test_onnx_runs_and_matches_the_main_branch(checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    result = export_checkpoint(checkpoint, tmp_path, format="onnx", head="main")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    exported = load_exported(tmp_path)
    assert exported(torch.zeros(3, 3, exported.image_size, exported.image_size)).shape == (3, len(exported.class_names))


def test_export_script_end_to_end(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_main_branch.py"), f"checkpoint={checkpoint}",
                          "format=torchscript", "head=main", f"out={out}"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "max abs logit difference" in run.stdout
    assert (out / "model.ts").is_file() and (out / "model.json").is_file()
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_main_branch.py"),
                          f"checkpoint={out / 'model.json'}", f"out={tmp_path / 'x'}"], capture_output=True,
                         text=True, cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "not" in bad.stderr and "Traceback" not in bad.stderr


def test_errors(checkpoint: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt"
    torch.save({"weights": torch.zeros(2)}, junk)
    with pytest.raises(ValueError, match="not an rsnet training checkpoint"):
        export_checkpoint(junk, tmp_path / "a")
    mismatch = write_checkpoint(tmp_path / "mismatch.pt", class_names=["only", "two"])
    with pytest.raises(ExportError, match="class-count mismatch"):
        export_checkpoint(mismatch, tmp_path / "b")
    other = torch.load(checkpoint, weights_only=True)
    other["model_state"] = build_model("mgml_fenet", "test_resnet", 3).state_dict()
    save_checkpoint(tmp_path / "other.pt", other)
    with pytest.raises(ExportError, match="another model"):
        export_checkpoint(tmp_path / "other.pt", tmp_path / "c")
    with pytest.raises(ExportError, match="format"):
        export_checkpoint(checkpoint, tmp_path / "d", format="tflite")
    with pytest.raises(ExportError, match="model.json"):
        load_exported(tmp_path)


def test_exported_models_are_told_apart_from_training_checkpoints(checkpoint: Path, tmp_path: Path) -> None:
    from rsnet.export import is_exported_model

    export_checkpoint(checkpoint, tmp_path / "sd", format="state_dict", head="main")
    assert is_exported_model(tmp_path / "sd") and is_exported_model(tmp_path / "sd" / "model.pt")
    assert is_exported_model(tmp_path / "sd" / "model.json")
    assert not is_exported_model(checkpoint)
