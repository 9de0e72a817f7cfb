"""model.options.main_heads: MGML-FENet's main branch averages its own classifier with FC-FG heads (default auto: the
S2 head on a 4 x 4 grid where it costs at most 2 % of the classifier's parameters). The pruned main branch stays one
forward (trunk -> S4 -> classifier, plus a pool and a linear layer per head on its level's map) with the full model's
main logits; exports round-trip; attention maps draw it; an older checkpoint means no heads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import EXPORT_CLASSES, EXPORT_SIZE, full_logits, run_train, save_model_checkpoint, training_config

from rsnet.engine.config_checks import ConfigError, check_resume_identity
from rsnet.export import attention_model, export_checkpoint
from rsnet.exported_model import METADATA_FILE, ExportError, load_exported
from rsnet.losses import MultiBranchLoss, distillation_kl
from rsnet.model_loading import load_model, model_from_training_checkpoint
from rsnet.models import build_model
from rsnet.models.main_branch import MainBranchHeads, extract_main_branch
from rsnet.viz.attention import class_activation_maps

CLASSES = len(EXPORT_CLASSES)


def batch(n: int = 2, size: int = EXPORT_SIZE) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def model_with_heads(heads: list[str], size: int = EXPORT_SIZE, **options: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mgml_fenet", "test_resnet", CLASSES, image_size=size, main_heads=heads, **options)


def test_the_default_is_auto_and_a_tiny_backbone_gets_no_heads() -> None:
    """main_heads: auto; test_resnet at 30 classes: s2_g4 would cost 9 % of its parameters, so no heads and the main
    branch is the backbone's own; an explicit [] is none on any backbone."""
    assert training_config("model=mgml_fenet")["model"]["options"]["main_heads"] == "auto"
    model = build_model("mgml_fenet", "test_resnet", 30, main_heads="auto").eval()
    out = model(batch())
    assert model.model_config["main_heads"] == [] and "main_s4" not in out.logits and out.student is None
    assert type(extract_main_branch(model)) is not MainBranchHeads
    with torch.device("meta"):
        assert build_model("mgml_fenet", "resnet50", 30, main_heads=[]).main_heads == []


@pytest.mark.parametrize(("backbone", "classes", "heads"), [
    ("resnet18", 45, ["s2_g4"]), ("resnet50", 45, ["s2_g4"]), ("vgg16", 45, ["s2_g4"]),
    ("densenet121", 45, []), ("densenet121", 16, ["s2_g4"]), ("densenet121", 17, ["s2_g4"]), ("densenet121", 18, [])])
def test_auto_takes_the_s2_head_where_the_export_stays_within_two_percent(backbone: str, classes: int,
                                                                         heads: list[str]) -> None:
    """densenet121's S2 has 512 channels: its 4 x 4 head fits 2 % of the classifier up to 17 classes."""
    with torch.device("meta"):  # shapes only
        model = build_model("mgml_fenet", backbone, classes, image_size=224, main_heads="auto")
        pruned = sum(p.numel() for p in extract_main_branch(model).parameters())
        bare = sum(p.numel() for p in build_model("baseline", backbone, classes).parameters())
    assert model.main_heads == model.model_config["main_heads"] == heads
    assert 1.0 < pruned / bare <= 1.02 if heads else pruned == bare
    assert build_model(**{**model.model_config, "pretrained": False}).main_heads == heads  # the config rebuilds it


@pytest.mark.parametrize("backbone", ["resnet50", "vgg16", "densenet121"])
def test_the_default_main_branch_of_the_papers_backbones_exports_and_loads(tmp_path: Path, backbone: str) -> None:
    """MGML-FENet as shipped (main_heads: auto, 3 classes: s2_g4 on all three) through rsnet-export's default format
    (state_dict) and back: the loaded model gives the checkpoint's main logits."""
    torch.manual_seed(0)
    model = build_model("mgml_fenet", backbone, CLASSES, image_size=EXPORT_SIZE, main_heads="auto")
    assert model.main_heads == ["s2_g4"]
    checkpoint = save_model_checkpoint(tmp_path / "best.pt", model)
    del model
    result = export_checkpoint(checkpoint, tmp_path / "out")
    meta = json.loads((tmp_path / "out" / METADATA_FILE).read_text())
    assert meta["format"] == "state_dict" and meta["model_config"]["main_heads"] == ["s2_g4"]
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    x = batch(2)
    with torch.no_grad():
        exported = load_model(tmp_path / "out", setting="model").model(x)
    assert (exported - full_logits(checkpoint, x, "main")).abs().max() <= 1e-4


@pytest.mark.parametrize("heads", [["s2_g4"], ["s2_g4", "s3_g2"], ["s4_g1"]])
@pytest.mark.parametrize("pool", ["avg", "grid2"])
def test_the_main_branch_averages_its_classifier_with_the_heads(heads: list[str], pool: str) -> None:
    model = model_with_heads(heads, main_pool=pool).train()
    x = batch()
    out = model(x)
    assert all(z.shape == (2, CLASSES) and torch.isfinite(z).all() for z in out.logits.values())
    expected = torch.stack([out.logits["main_s4"], *(out.logits[f"fem_{head}"] for head in heads)]).mean(dim=0)
    assert torch.allclose(out.main_logits, expected)
    assert torch.allclose(out.logits["ensemble"], (out.main_logits + out.logits["ffb"] + out.logits["fem"]) / 3)
    # the distillation trains the main branch's own classifier, as without heads; every head has its cross-entropy
    loss = MultiBranchLoss(rampup_epochs=2)(out, torch.tensor([0, 2]), epoch=1.0)
    assert out.student == "main_s4" and torch.allclose(
        loss.terms["sd_logits"], distillation_kl(out.logits["main_s4"], out.logits["ensemble"], 3.0))
    assert {"ce/main", "ce/main_s4", "ce/fem_s2_g4"} <= set(loss.terms)
    loss.total.backward()
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []

    model.eval()
    with torch.no_grad():
        out = model(x)
        pruned = extract_main_branch(model)
        assert (pruned(x) - out.main_logits).abs().max() <= 1e-5
    # the pruned branch: the backbone's classifier and the heads' linear layers, nothing of the other branches
    keys = set(pruned.state_dict())
    assert keys <= set(model.state_dict())
    assert {key.split(".")[1] for key in keys if key.startswith("fem.")} == set(heads)
    bare = build_model("baseline", "test_resnet", CLASSES, main_pool=pool)
    extra = sum(p.numel() for head in heads for p in model.fem[head].parameters())
    assert sum(p.numel() for p in pruned.parameters()) == sum(p.numel() for p in bare.parameters()) + extra
    build_model(**model.model_config).load_state_dict(model.state_dict())  # the config rebuilds the model


@pytest.mark.parametrize("backbone", ["test_efficientnet", "test_byobnet", "vgg11"])
def test_the_pruned_branch_of_other_heads_of_timm(backbone: str) -> None:
    """global_pool -> classifier (efficientnet), a ClassifierHead (byobnet) and VGG's pre-logits ConvMlp, whose
    weights the backbone also holds under a name of its own: the pruned branch takes them all (strict load)."""
    torch.manual_seed(0)
    model = build_model("mgml_fenet", backbone, CLASSES, image_size=32, main_heads=["s2_g4"]).eval()
    x = batch(size=32)
    with torch.no_grad():
        assert (extract_main_branch(model)(x) - model(x).main_logits).abs().max() <= 1e-5


def test_a_lone_head_name_is_that_head_not_its_letters() -> None:
    """model.options.main_heads=s2_g4 (no brackets) reaches the model as a string: one head, as [s2_g4]."""
    assert model_with_heads("s2_g4", size=32).main_heads == model_with_heads(["s2_g4"], size=32).main_heads == ["s2_g4"]


def test_a_grid_finer_than_its_map_is_fitted_as_the_heads_are() -> None:
    model = model_with_heads(["s4_g4", "s2_g4"], size=32)  # test_resnet at 32 px: S4 is 1 x 1
    assert model.model_config["main_heads"] == model.main_heads == ["s4_g1", "s2_g4"]
    assert build_model(**model.model_config).main_heads == ["s4_g1", "s2_g4"]
    twice = model_with_heads(["s4_g4", "s4_g2", "s4_g1"], size=32)  # all three are s4_g1 there: averaged once
    assert twice.main_heads == ["s4_g1"]
    x = batch(size=32)
    with torch.no_grad():
        assert (extract_main_branch(twice.eval())(x) - twice(x).main_logits).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["s5_g4", "s2_g3", "fem_s2_g4", "main"])
def test_a_head_the_model_lacks_is_one_line_naming_the_setting(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^model.options.main_heads: '{name}' is not one of this model's FC-FG "
                                         r"heads \(s2_g1, s2_g2, .*, s4_g4: s<level>_g<grid> of model.options.levels "
                                         r"and grids\)$"):
        model_with_heads([name])


def test_attention_maps_of_the_main_branch_are_drawn_by_grad_cam() -> None:
    model = model_with_heads(["s2_g4"])
    assert model.cam_classifiers()["main"] is None
    maps = class_activation_maps(model, batch(size=96), size=(96, 96))
    assert set(maps) == {"main", "fem_s2_g1", "fem_s3_g1", "fem_s4_g1"}
    assert float(maps["main"].amax(dim=(1, 2)).min()) == pytest.approx(1.0) and torch.isfinite(maps["main"]).all()


def write_heads_checkpoint(path: Path, heads: list[str] | None) -> Path:
    """A checkpoint of a seeded MGML-FENet with ``main_heads=heads`` (None: a model_config without the key, as rsnet
    wrote before the setting)."""
    return save_model_checkpoint(path, model_with_heads(heads or []), without="main_heads" if heads is None else None)


def test_export_round_trip(tmp_path: Path) -> None:
    checkpoint = write_heads_checkpoint(tmp_path / "best.pt", ["s2_g4", "s3_g2"])
    x = batch(3)
    reference = full_logits(checkpoint, x, "main")
    for fmt in ("auto", "state_dict", "torchscript"):
        out = tmp_path / fmt
        result = export_checkpoint(checkpoint, out, format=fmt)
        meta = json.loads((out / METADATA_FILE).read_text())
        assert meta["format"] == ("state_dict" if fmt == "auto" else fmt)
        assert meta["model_config"]["main_heads"] == ["s2_g4", "s3_g2"]
        assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5
        with torch.no_grad():
            assert (load_model(out, setting="model").model(x) - reference).abs().max() <= 1e-5, fmt
        maps = class_activation_maps(attention_model(load_exported(out)), x)
        assert list(maps) == ["main"] and maps["main"].shape == (3, EXPORT_SIZE, EXPORT_SIZE)
    with pytest.raises(ExportError, match=r"^format=timm writes a plain timm classifier, and this main branch also "
                                          r"averages the heads model.options.main_heads=\['s2_g4', 's3_g2'\]: use "
                                          r"format=state_dict \(rsnet loads it\), torchscript or onnx$"):
        export_checkpoint(checkpoint, tmp_path / "timm", format="timm")
    assert not (tmp_path / "timm").exists()


def test_onnx_export(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    checkpoint = write_heads_checkpoint(tmp_path / "best.pt", ["s2_g4"])
    result = export_checkpoint(checkpoint, tmp_path / "out", format="onnx")
    x = batch(3)
    with torch.no_grad():
        assert (load_exported(tmp_path / "out")(x) - full_logits(checkpoint, x, "main")).abs().max() <= 1e-5
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5


def test_a_checkpoint_without_the_setting_has_no_heads(tmp_path: Path) -> None:
    old = write_heads_checkpoint(tmp_path / "old.pt", None)
    model, _ = model_from_training_checkpoint(old)
    assert model.main_heads == [] and type(extract_main_branch(model)) is not MainBranchHeads
    export_checkpoint(old, tmp_path / "out", format="auto")
    assert json.loads((tmp_path / "out" / METADATA_FILE).read_text())["format"] == "timm"


def test_resuming_a_run_from_before_the_setting_keeps_no_heads() -> None:
    """A run started without heads (before the setting, or before its default became auto) resumes with
    main_heads=[]; under the default (auto) or with heads it is refused in one line naming the setting."""
    config = training_config("model=mgml_fenet", "model.options.main_heads=[]")
    saved = json.loads(json.dumps(config))
    del saved["model"]["options"]["main_heads"]  # a run started before main_heads
    check_resume_identity(config, saved, Path("last.pt"))
    for heads in ("auto", ["s2_g4"]):
        config["model"]["options"]["main_heads"] = heads
        with pytest.raises(ConfigError, match=rf"^resume=true: model.options=.*'main_heads': {re.escape(repr(heads))}"
                                              r".* but the run"):
            check_resume_identity(config, saved, Path("last.pt"))


def test_training_with_heads_and_exporting_the_main_branch(tmp_path: Path) -> None:
    """scripts/train.py with main_heads=[s2_g4] on the bundled sample: the run's metrics score the main branch and
    its own classifier (main_s4); the export gives the checkpoint's main logits."""
    run = tmp_path / "run"
    assert run_train(run, "backbone=test_resnet", "dataset.image_size=32", "epochs=1", "log.progress_bar=false",
                     "trainer.devices=[cpu]", "model=mgml_fenet", "model.options.main_heads=[s2_g4]") == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"main", "main_s4", "fem_s2_g4", "ensemble"} <= set(metrics["oa"])
    result = export_checkpoint(run, tmp_path / "export")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5
    assert json.loads((tmp_path / "export" / METADATA_FILE).read_text())["model_config"]["main_heads"] == ["s2_g4"]
