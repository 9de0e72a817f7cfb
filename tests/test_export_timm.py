"""format=timm: the main branch written with timm's save_for_hf, reloaded by timm ("local-dir:") and by rsnet."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import timm
import torch
from helpers import (EXPORT_CLASSES, EXPORT_SIZE, compose_command, deprecations_from_rsnet, export_recording,
                     full_logits, load_export_script, write_checkpoint)

from rsnet.export import ExportResult, export_checkpoint
from rsnet.exported_model import ExportError, load_exported
from rsnet.model_loading import load_model


@pytest.fixture(scope="module")
def timm_export(checkpoint: Path, tmp_path_factory) -> tuple[ExportResult, list[warnings.WarningMessage]]:
    """The main branch exported once with format=timm, with the warnings the export emitted."""
    return export_recording(checkpoint, tmp_path_factory.mktemp("timm"), format="timm", head="main")


def test_timm_reloads_it_with_identical_logits(timm_export, checkpoint: Path) -> None:
    result, _ = timm_export
    model = timm.create_model(f"local-dir:{result.path.parent}", pretrained=True).eval()
    x = torch.randn(3, 3, EXPORT_SIZE, EXPORT_SIZE, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert (model(x) - full_logits(checkpoint, x, "main")).abs().max() <= 1e-6
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-6


def test_timm_config_carries_labels_and_preprocessing(timm_export) -> None:
    result, _ = timm_export
    out = result.path.parent
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == "test_resnet" and config["num_classes"] == 3
    assert config["label_names"] == EXPORT_CLASSES
    cfg = config["pretrained_cfg"]
    assert cfg["input_size"] == [3, EXPORT_SIZE, EXPORT_SIZE] and cfg["mean"] == [0.4] * 3 and cfg["std"] == [0.2] * 3
    assert (cfg["crop_pct"], cfg["crop_mode"]) == (1.0, "squash")  # rsnet resizes the whole image
    model = timm.create_model(f"local-dir:{out}", pretrained=True)
    data = timm.data.resolve_data_config(model=model)
    assert data["input_size"] == (3, EXPORT_SIZE, EXPORT_SIZE)
    assert list(data["mean"]) == [0.4] * 3 and list(data["std"]) == [0.2] * 3
    assert model.pretrained_cfg["label_names"] == EXPORT_CLASSES
    meta = json.loads((out / "model.json").read_text())
    assert (meta["format"], meta["file"], meta["head"]) == ("timm", "model.safetensors", "main")


@pytest.mark.parametrize("pretrained", [False, "/weights/r18.safetensors", True])
def test_the_weights_tag_is_written_only_where_training_started_from_those_weights(pretrained, tmp_path: Path) -> None:
    """Was: an export of a model trained from scratch carried the published weights' tag (``a1_in1k`` for
    resnet18) and licence in its config.json; now only backbone.pretrained=true keeps them (a weights file of
    your own is not timm's published one); the export still loads."""
    from rsnet.models import build_model

    model_config = {**build_model("esd_mbenet", "test_resnet", 3).model_config, "pretrained": pretrained}
    checkpoint = write_checkpoint(tmp_path / "best.pt", model_config=model_config)
    out = export_checkpoint(checkpoint, tmp_path / "export", format="timm").path.parent
    cfg = json.loads((out / "config.json").read_text())["pretrained_cfg"]
    assert ("tag" in cfg, "license" in cfg) == (pretrained is True,) * 2, cfg
    assert load_model(out, setting="model").metadata["class_names"] == EXPORT_CLASSES


def test_rsnet_loads_a_timm_export(timm_export) -> None:
    result, _ = timm_export
    out = result.path.parent
    loaded = load_model(out, setting="model")
    assert loaded.source.kind == "export" and loaded.metadata["class_names"] == EXPORT_CLASSES
    x = torch.randn(2, 3, EXPORT_SIZE, EXPORT_SIZE)
    with torch.no_grad():
        reference = loaded.model(x)
        for path in (out / "model.safetensors", out / "config.json", out / "model.json"):
            assert load_exported(path).class_names == EXPORT_CLASSES
            assert torch.equal(load_exported(path)(x), reference)


def test_timm_export_emits_no_deprecation_from_rsnet(timm_export) -> None:
    _, caught = timm_export
    assert deprecations_from_rsnet(caught) == []


def test_timm_refuses_the_ensemble(checkpoint: Path, tmp_path: Path, capsys) -> None:
    refused = r"format=timm writes the main branch .*head=ensemble"
    with pytest.raises(ExportError, match=refused):
        export_checkpoint(checkpoint, tmp_path / "a", format="timm", head="ensemble")
    with pytest.raises(SystemExit) as stop:
        load_export_script().main(compose_command("export", f"checkpoint={checkpoint}", "format=timm", "head=ensemble",
                                              f"out={tmp_path / 'b'}"))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: format=timm") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_export_script_prints_the_timm_reload(checkpoint: Path, tmp_path: Path, capsys) -> None:
    load_export_script().main(compose_command("export", f"checkpoint={checkpoint}", "format=timm", f"out={tmp_path}"))
    out = capsys.readouterr().out
    assert f"timm.create_model('local-dir:{tmp_path}', pretrained=True)" in out
    assert "max abs logit difference vs the full model's main logits: 0" in out
