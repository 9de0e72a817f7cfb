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


def test_model_paths_resolve_to_the_file_meant(checkpoint: Path, tmp_path: Path) -> None:
    """Was: a best.pt beside an export's model.json was taken for the export (predict used model.pt instead)."""
    from rsnet.export import resolve_model_path

    run = tmp_path / "run"
    best = write_checkpoint(run / "checkpoints" / "best.pt")
    last = write_checkpoint(run / "checkpoints" / "last.pt")
    export_checkpoint(checkpoint, tmp_path / "sd", format="state_dict", head="main")
    for name in ("model.pt", "model.json"):  # an export left in checkpoints/ by an earlier version
        (run / "checkpoints" / name).write_bytes((tmp_path / "sd" / name).read_bytes())
    assert resolve_model_path(best).kind == "checkpoint" and resolve_model_path(best).path == best
    assert resolve_model_path(run / "checkpoints" / "model.pt").kind == "export"
    assert resolve_model_path(run / "checkpoints" / "model.json").kind == "export"
    source = resolve_model_path(run)
    assert (source.kind, source.path, source.note) == ("checkpoint", best, f"the best checkpoint of {run}")
    with pytest.raises(ValueError, match="holds both training checkpoints and an export"):
        resolve_model_path(run / "checkpoints")
    with pytest.raises(ExportError, match="best.pt is not an exported model"):
        load_exported(best)
    best.unlink()
    source = resolve_model_path(run)
    assert source.path == last and "last checkpoint" in source.note and "no best.pt" in source.note
    assert resolve_model_path(tmp_path / "sd") == resolve_model_path(tmp_path / "sd" / "model.json")
    with pytest.raises(FileNotFoundError, match="model=.*nope does not exist"):
        resolve_model_path(tmp_path / "nope", "model")
    with pytest.raises(FileNotFoundError, match="holds no model"):
        resolve_model_path(tmp_path)


def test_export_reads_a_run_folder(checkpoint: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    best = write_checkpoint(run / "checkpoints" / "best.pt")
    result = export_checkpoint(run, tmp_path / "export", format="state_dict")
    assert result.source.path == best and load_exported(tmp_path / "export").class_names == CLASSES
    with pytest.raises(ExportError, match="is an exported model, not a training checkpoint"):
        export_checkpoint(tmp_path / "export", tmp_path / "again")


def test_export_never_overwrites_or_shadows_a_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_checkpoint(run / "checkpoints" / "best.pt")
    for out in (run / "checkpoints", run):
        refused = rf"out={out} holds training checkpoints \(best.pt\).*out={run / 'export'}"
        with pytest.raises(ExportError, match=refused):
            export_checkpoint(checkpoint, out, format="state_dict")
    with pytest.raises(ExportError, match=r"best.pt is a training checkpoint.*out="):
        export_checkpoint(checkpoint, run / "checkpoints" / "best.pt")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt"]
    export_checkpoint(checkpoint, tmp_path / "sd", format="state_dict")
    export_checkpoint(checkpoint, tmp_path / "sd", format="state_dict")  # its own model.pt is no checkpoint


def test_a_full_disk_is_one_line_and_keeps_the_previous_export(checkpoint: Path, tmp_path: Path, monkeypatch,
                                                               capsys) -> None:
    import errno

    import rsnet.export

    out = tmp_path / "sd"
    export_checkpoint(checkpoint, out, format="state_dict")
    before = (out / "model.pt").read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rsnet.export.torch, "save", full)
    with pytest.raises(SystemExit) as stop:
        _export_script().main([f"checkpoint={checkpoint}", "format=state_dict", f"out={out}"])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.startswith(f"error: no space left on device while writing {out / 'model.pt'}")
    assert len(err.strip().splitlines()) == 1
    assert (out / "model.pt").read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["model.json",
                                                                                                    "model.pt"]


def test_export_script_numbers_are_checked(checkpoint: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        _export_script().main([f"checkpoint={checkpoint}", "batch_size=abc", f"out={tmp_path}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == "error: batch_size='abc': must be a whole number >= 1\n"


def _export_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rsnet_export_script", ROOT / "scripts" / "export_main_branch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
