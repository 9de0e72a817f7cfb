"""Export: TorchScript / state dict / ONNX of the main branch or ensemble, reload, script, errors, warnings.

The timm format (``save_for_hf`` / ``local-dir:``) is tested in test_export_timm.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import (EXPORT_CLASSES, EXPORT_SIZE, HANG_S, command_in_process, compose_command, deprecations_from_rsnet,
                     export_recording, full_logits, load_export_script, write_checkpoint)

import rsnet.export
from rsnet.export import ExportResult, export_checkpoint
from rsnet.checkpoint import save_checkpoint
from rsnet.exported_model import ExportError, load_exported
from rsnet.models import build_model


def torch_jit_notices() -> set[str]:
    """The deprecation notices this torch itself emits for tracing and saving TorchScript (none on older torch)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2)), io.BytesIO())
    return {str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))}


def test_torchscript_reloads_in_a_fresh_process(checkpoint: Path, tmp_path: Path) -> None:
    result = export_checkpoint(checkpoint, tmp_path / "ts", format="torchscript", head="main")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5
    meta = json.loads((tmp_path / "ts" / "model.json").read_text())
    assert meta["class_names"] == EXPORT_CLASSES and meta["image_size"] == EXPORT_SIZE and meta["num_classes"] == 3
    assert meta["backbone"] == "test_resnet" and meta["head"] == "main" and meta["mean"] == [0.4] * 3
    x = torch.randn(3, 3, EXPORT_SIZE, EXPORT_SIZE, generator=torch.Generator().manual_seed(5))
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys, torch; m = torch.jit.load(sys.argv[1]); x = torch.load(sys.argv[2]); "
            "torch.save(m(x).detach(), sys.argv[3])")
    subprocess.run([sys.executable, "-c", code, str(result.path), str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
                   check=True, capture_output=True, timeout=HANG_S)
    y = torch.load(tmp_path / "y.pt")
    assert (y - full_logits(checkpoint, x, "main")).abs().max() <= 1e-5


@pytest.mark.parametrize(("fmt", "head"), [("state_dict", "main"), ("state_dict", "ensemble"),
                                           ("torchscript", "ensemble")])
def test_roundtrip(checkpoint: Path, tmp_path: Path, fmt: str, head: str) -> None:
    result = export_checkpoint(checkpoint, tmp_path, format=fmt, head=head)
    model = load_exported(tmp_path)
    assert model.class_names == EXPORT_CLASSES and model.image_size == EXPORT_SIZE and model.metadata["head"] == head
    x = torch.randn(2, 3, EXPORT_SIZE, EXPORT_SIZE)
    with torch.no_grad():
        assert (model(x) - full_logits(checkpoint, x, head)).abs().max() <= 1e-5
    assert result.max_abs_diff <= 1e-5
    assert load_exported(result.path).metadata == model.metadata  # the model file works as well as the folder


@pytest.fixture(scope="module")
def onnx_main(checkpoint: Path, tmp_path_factory) -> tuple[ExportResult, list[warnings.WarningMessage]]:
    """The main branch exported once to ONNX (dynamo exporter), with the warnings the export emitted; it prints
    nothing (was: a page of the exporter's passes)."""
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx packages (pip install -e .[onnx])")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exported = export_recording(checkpoint, tmp_path_factory.mktemp("onnx"), format="onnx", head="main")
    assert printed.getvalue() == ""
    return exported


def test_onnx_main_branch_has_a_dynamic_batch(onnx_main) -> None:
    import onnx

    result, _ = onnx_main
    proto = onnx.load(str(result.path))
    onnx.checker.check_model(proto)
    (images,) = proto.graph.input
    dims = images.type.tensor_type.shape.dim
    assert images.name == "images" and [o.version for o in proto.opset_import if o.domain == ""] == [18]
    assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == [3, EXPORT_SIZE, EXPORT_SIZE]
    assert [o.name for o in proto.graph.output] == ["logits"]


@pytest.mark.parametrize("batch", [1, 3])
def test_onnxruntime_matches_pytorch(onnx_main, checkpoint: Path, batch: int) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: the ONNX file cannot be run here")
    result, _ = onnx_main
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5
    exported = load_exported(result.path)
    x = torch.randn(batch, 3, EXPORT_SIZE, EXPORT_SIZE, generator=torch.Generator().manual_seed(batch))
    assert (exported(x) - full_logits(checkpoint, x, "main")).abs().max() <= 1e-5


def test_onnx_export_failure_is_one_clear_error(checkpoint: Path, tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx packages (pip install -e .[onnx])")

    def cannot(*args, **kwargs):
        raise RuntimeError("Unsupported: data-dependent pooling\n(long exporter report)")

    monkeypatch.setattr(torch.onnx, "export", cannot)
    expected = (rf"ONNX \(torch.export\) cannot express this model at {EXPORT_SIZE} px \(RuntimeError: Unsupported: "
                r"data-dependent pooling\); use format=torchscript or format=state_dict$")
    with pytest.raises(ExportError, match=expected):
        export_checkpoint(checkpoint, tmp_path, format="onnx", head="ensemble")
    assert list(tmp_path.iterdir()) == []  # no model.onnx, no temporary file, no model.json


@pytest.mark.parametrize("fmt", ["state_dict", "torchscript"])
def test_export_and_reload_emit_no_deprecation_from_rsnet(checkpoint: Path, tmp_path: Path, fmt: str) -> None:
    result, caught = export_recording(checkpoint, tmp_path, format=fmt, head="ensemble")
    with warnings.catch_warnings(record=True) as reloaded:
        warnings.simplefilter("always")
        load_exported(tmp_path)
    assert deprecations_from_rsnet(caught + reloaded) == []
    if fmt == "torchscript":  # torch's own notices that TorchScript is deprecated are shown, not swallowed
        assert torch_jit_notices() <= {str(w.message) for w in caught + reloaded}


@pytest.mark.parametrize("head, files", [("main", ["config.json", "model.json", "model.safetensors"]),
                                         ("ensemble", ["model.json", "model.pt"])])
def test_the_default_format_is_not_deprecated(checkpoint: Path, tmp_path: Path, head: str, files: list[str]) -> None:
    """The default format (timm for the main head, state_dict otherwise) exports and loads without a warning."""
    result, caught = export_recording(checkpoint, tmp_path, head=head)  # format="auto"
    with warnings.catch_warnings(record=True) as reloaded:
        warnings.simplefilter("always")
        load_exported(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == files
    assert result.metadata["format"] == ("timm" if head == "main" else "state_dict")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5  # checked against the full model
    notices = [str(w.message) for w in caught + reloaded if issubclass(w.category, (DeprecationWarning, FutureWarning))]
    assert not [notice for notice in notices if "jit" in notice or "TorchScript" in notice], notices


def test_onnx_export_emits_no_deprecation(onnx_main) -> None:
    _, caught = onnx_main
    assert deprecations_from_rsnet(caught) == []


def test_export_script_end_to_end(checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """rsnet-export's main with the settings Hydra composes (the installed command itself runs in test_install.py):
    the export and its report; an export given as the checkpoint is one line and exit status 2."""
    out = tmp_path / "exported"
    done = command_in_process("export", f"checkpoint={checkpoint}", "format=torchscript", "head=main", f"out={out}",
                              capture=capsys)
    assert done.returncode == 0, done.stderr
    assert "max abs logit difference" in done.stdout
    assert sorted(path.name for path in out.iterdir()) == ["model.json", "model.ts"]
    bad = command_in_process("export", f"checkpoint={out / 'model.json'}", f"out={tmp_path / 'x'}", capture=capsys)
    assert bad.returncode == 2
    assert bad.stderr == (f"error: checkpoint={out / 'model.json'} is an exported model, not a training checkpoint; "
                          "export reads a run's checkpoints/best.pt (or the run folder)\n")


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
    with pytest.raises(ExportError, match="format must be auto or one of .*'timm'"):
        export_checkpoint(checkpoint, tmp_path / "d", format="tflite")
    with pytest.raises(ExportError, match=re.escape(f"{tmp_path}: no model.json found; pass a folder written by "
                                                    "scripts/export_main_branch.py")):
        load_exported(tmp_path)


@pytest.mark.parametrize("val_ratio", [0, 0.2])
def test_no_best_pt_is_named_only_where_the_run_validates(val_ratio: float, tmp_path: Path) -> None:
    """Was: every evaluate, export and predict of a run without a validation part (dataset.val_ratio=0, the
    documented default: last.pt is the run's model) said "it has no best.pt"; now only a run that validates does."""
    from rsnet.model_loading import load_model

    run = tmp_path / "run"
    last = write_checkpoint(run / "checkpoints" / "last.pt", config={"dataset": {"val_ratio": val_ratio}})
    sources = [load_model(run).source, export_checkpoint(run, tmp_path / "export", format="state_dict").source]
    plain = f"checkpoint {last} (the last checkpoint of {run})"
    missing = f"{plain[:-1]}: it has no best.pt, though the run validates (dataset.val_ratio=0.2): no validation " \
              "has chosen an epoch yet)"
    assert [str(source) for source in sources] == [missing if val_ratio else plain] * 2


def test_model_paths_resolve_to_the_file_meant(checkpoint: Path, tmp_path: Path) -> None:
    """A path resolves to the file meant: a checkpoint is the checkpoint even beside an export's model.json, an
    export folder is the export."""
    from rsnet.model_loading import resolve_model_path

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
    assert (source.path, source.note) == (last, f"the last checkpoint of {run}")
    assert resolve_model_path(tmp_path / "sd") == resolve_model_path(tmp_path / "sd" / "model.json")
    with pytest.raises(FileNotFoundError, match="model=.*nope does not exist"):
        resolve_model_path(tmp_path / "nope", "model")
    with pytest.raises(FileNotFoundError, match="holds no model"):
        resolve_model_path(tmp_path)


def test_export_reads_a_run_folder(checkpoint: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    best = write_checkpoint(run / "checkpoints" / "best.pt")
    result = export_checkpoint(run, tmp_path / "export", format="state_dict")
    assert result.source.path == best and load_exported(tmp_path / "export").class_names == EXPORT_CLASSES
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
        load_export_script().main(compose_command("export", f"checkpoint={checkpoint}", "format=state_dict",
                                                  f"out={out}", "progress_bar=false"))
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.startswith(f"error: no space left on device while writing {out / 'model.pt'}")
    assert len(err.strip().splitlines()) == 1
    assert (out / "model.pt").read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["model.json",
                                                                                                    "model.pt"]


def test_export_reports_its_stages(checkpoint: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The stages are reported as each begins; the command's bar shows them once the export has taken its half-second
    delay (tqdm's clock, injected: the reload takes 0.6 s of it), not before; progress_bar=false shows none."""
    import tqdm.std

    stages: list[str] = []
    export_checkpoint(checkpoint, tmp_path / "a", format="state_dict", on_stage=stages.append)
    assert stages == ["loading the checkpoint", "writing state_dict", "reloading the export", "comparing logits"]
    assert len(stages) == rsnet.export.EXPORT_STAGES
    now = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])  # the bar's clock: it moves only where the test says
    reload = rsnet.export.load_exported

    def slow_reload(*args, **kwargs):  # an export that takes longer than the bar's half-second delay
        now[0] += 0.6
        return reload(*args, **kwargs)

    monkeypatch.setattr(rsnet.export, "load_exported", slow_reload)
    load_export_script().main(compose_command("export", f"checkpoint={checkpoint}", "format=state_dict",
                                              f"out={tmp_path / 'b'}"))
    shown = capsys.readouterr().err.replace("\r", "\n")  # the progress bar, on stderr
    assert "export: comparing logits: 3/4 stages done" in shown, shown  # after the delay...
    assert "reloading the export" not in shown and "writing" not in shown, shown  # ...not before
    load_export_script().main(compose_command("export", f"checkpoint={checkpoint}", f"out={tmp_path / 'c'}",
                                              "format=state_dict", "progress_bar=false"))
    shown = capsys.readouterr()
    assert "max abs logit difference" in shown.out and "stages done" not in shown.err


def test_export_script_numbers_are_checked(checkpoint: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        load_export_script().main(compose_command("export", f"checkpoint={checkpoint}", "batch_size=abc",
                                              f"out={tmp_path}"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err == "error: batch_size='abc': must be a whole number >= 1\n"
