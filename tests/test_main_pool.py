"""model.options.main_pool: the main branch's pooling (avg | gem | avgmax | grid2). Each candidate's pruned main
branch is a single path (trunk -> pool -> linear) giving the full model's main logits; exports round-trip; a
checkpoint or export without the setting means avg; CAM of a wider classifier; a bad value is one line."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import timm
import torch
from helpers import EXPORT_CLASSES, EXPORT_SIZE, full_logits, save_model_checkpoint, training_config
from timm.layers import SelectAdaptivePool2d

from rsnet.checkpoint import DIGEST_KEY, save_checkpoint
from rsnet.engine.config_checks import ConfigError, check_model_and_loss, check_resume_identity
from rsnet.export import attention_model, export_checkpoint
from rsnet.exported_model import METADATA_FILE, ExportError, load_exported, metadata_digest
from rsnet.losses import MultiBranchLoss
from rsnet.model_loading import load_model, model_from_training_checkpoint
from rsnet.models import BackboneError, build_model
from rsnet.models.main_branch import extract_main_branch
from rsnet.models.pooling import MAIN_POOLS, GeneralizedMeanPool2d, GridAvgPool2d, pool_spatial_terms, set_main_pool
from rsnet.viz.attention import class_activation_maps

CLASSES = 5
SIZE = 64
POOLS = ("avg", "gem", "avgmax", "grid2")
WIDTH = {"avg": 1, "gem": 1, "avgmax": 2, "grid2": 4}  # the classifier's inputs per channel of the pooled map
# tiny timm models of both kinds of head: global_pool -> fc on the model (test_resnet, test_efficientnet: like
# resnet* and densenet*) and timm's ClassifierHead (test_byobnet: like vgg*)
BACKBONES = ("test_resnet", "test_efficientnet", "test_byobnet")
BAD = r"main_pool must be one of \('avg', 'gem', 'avgmax', 'grid2'\), got 'max'"


def batch(n: int = 2, size: int = SIZE) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def test_the_candidates_and_the_default() -> None:
    assert MAIN_POOLS == POOLS
    assert build_model("mgml_fenet", "test_resnet", CLASSES).model_config["main_pool"] == "avg"
    assert build_model("esd_mbenet", "test_resnet", CLASSES).model_config["main_pool"] == "avg"
    options = training_config("model=mgml_fenet")["model"]["options"]
    assert options["main_pool"] == "avg"  # the default stays avg until experiments decide
    for arch in ("esd_mbenet", "baseline"):
        assert training_config(f"model={arch}")["model"]["options"]["main_pool"] == "avg"


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize(("arch", "backbone"), [("mgml_fenet", b) for b in BACKBONES]
                         + [("esd_mbenet", "test_resnet"), ("baseline", "test_resnet")])
def test_pruned_main_branch_is_one_path_with_the_main_logits(arch: str, backbone: str, pool: str) -> None:
    torch.manual_seed(0)
    model = build_model(arch, backbone, CLASSES, main_pool=pool).train()
    x = batch()
    out = model(x)
    assert all(z.shape == (2, CLASSES) and torch.isfinite(z).all() for z in out.logits.values())
    MultiBranchLoss(rampup_epochs=2)(out, torch.tensor([0, 3]), epoch=1.0).total.backward()
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []  # GeM's p too

    model.eval()
    with torch.no_grad():
        out = model(x)
    head_map = out.features["main"]
    classifier = model.cam_classifiers()["main"]
    assert classifier.in_features == head_map.shape[1] * WIDTH[pool]
    assert model.model_config["main_pool"] == pool
    plain = extract_main_branch(model)
    bare = timm.create_model(backbone, num_classes=CLASSES)
    with torch.no_grad():
        assert (plain(x) - out.main_logits).abs().max() <= 1e-5
    # one path: timm's own class with timm's own modules, the pool and the classifier's width aside
    assert type(plain) is type(bare)
    ours, theirs = dict(plain.named_parameters()), dict(bare.named_parameters())
    assert set(ours) - set(theirs) == ({next(n for n in ours if n.endswith("global_pool.p"))} if pool == "gem"
                                       else set())
    grown = [n for n in theirs if ours[n].shape != theirs[n].shape]
    weight = next(n for n, p in plain.named_parameters() if p is plain.get_classifier().weight)
    assert grown == ([] if WIDTH[pool] == 1 else [weight])
    extra = (WIDTH[pool] - 1) * head_map.shape[1] * CLASSES + (pool == "gem")
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in bare.parameters()) + extra
    # the config rebuilds the model; the CAM contract: logits == linear(mean over the map of cam_inputs)
    build_model(**model.model_config).load_state_dict(model.state_dict())
    with torch.no_grad():
        terms = model.cam_inputs("main", head_map)
        assert torch.allclose(classifier(terms.mean(dim=(2, 3))), out.main_logits, atol=1e-5)


@pytest.mark.parametrize("side", [(1, 1), (2, 2), (3, 5), (7, 7)])
@pytest.mark.parametrize("pool", [GeneralizedMeanPool2d(), GridAvgPool2d(2),
                                  SelectAdaptivePool2d(pool_type="catavgmax", flatten=True),
                                  SelectAdaptivePool2d(pool_type="avg", flatten=True)],
                         ids=["gem", "grid2", "avgmax", "avg"])
def test_spatial_terms_average_to_the_pooled_inputs(pool: torch.nn.Module, side: tuple[int, int]) -> None:
    """CAM's decomposition: the mean over the map of the terms is the pool's output, also where grid cells overlap
    (odd sides) or repeat a pixel (a map narrower than the grid)."""
    x = torch.randn(3, 4, *side, generator=torch.Generator().manual_seed(2)).relu()
    terms = pool_spatial_terms(pool, x)
    assert terms.shape[-2:] == x.shape[-2:]
    with torch.no_grad():
        assert torch.allclose(terms.mean(dim=(2, 3)), pool(x), atol=1e-5)


@pytest.mark.parametrize("pool", POOLS)
def test_cam_and_grad_cam_of_the_main_head(pool: str) -> None:
    torch.manual_seed(0)
    model = build_model("mgml_fenet", "test_resnet", CLASSES, main_pool=pool)
    maps = class_activation_maps(model, batch(size=96), size=(96, 96))
    assert maps["main"].shape == (2, 96, 96) and torch.isfinite(maps["main"]).all()
    assert float(maps["main"].min()) >= 0.0 and float(maps["main"].amax(dim=(1, 2)).min()) == pytest.approx(1.0)


def test_a_bad_value_is_one_line_naming_the_setting_and_its_values() -> None:
    for arch in ("mgml_fenet", "esd_mbenet", "baseline"):
        with pytest.raises(ValueError, match=f"^{BAD}$"):
            build_model(arch, "test_resnet", CLASSES, main_pool="max")
    config = training_config("model=mgml_fenet", "backbone=test_resnet", "dataset.image_size=64",
                             "model.options.main_pool=max")
    with pytest.raises(ConfigError, match=rf"^model.options \(mgml_fenet on test_resnet\): {BAD}$"):
        check_model_and_loss(config)


def test_a_head_that_does_not_pool_into_a_linear_layer_is_refused() -> None:
    message = (r"^model.options.main_pool=gem needs a timm classifier that pools its last map straight into a linear "
               r"layer .*backbone.name='test_convnext' has a NormMlpClassifierHead head: use main_pool=avg with it$")
    with pytest.raises(BackboneError, match=message):
        build_model("mgml_fenet", "test_convnext", CLASSES, main_pool="gem")
    net = timm.create_model("test_resnet", num_classes=CLASSES)
    assert set_main_pool(net, "avg", "test_resnet") is None and isinstance(net.global_pool, SelectAdaptivePool2d)


def test_resuming_a_run_from_before_the_setting_keeps_avg() -> None:
    config = training_config("model=mgml_fenet")
    saved = copy.deepcopy(config)
    del saved["model"]["options"]["main_pool"]  # a run started before main_pool
    check_resume_identity(config, saved, Path("last.pt"))
    config["model"]["options"]["main_pool"] = "gem"
    with pytest.raises(ConfigError, match=r"^resume=true: model.options=.*'main_pool': 'gem'.* but the run in last.pt"):
        check_resume_identity(config, saved, Path("last.pt"))


# --------------------------------------------------------------------------------------------- checkpoints, exports


def write_pool_checkpoint(path: Path, pool: str | None, arch: str = "mgml_fenet") -> Path:
    """A training checkpoint of a seeded ``arch`` on test_resnet with ``main_pool=pool`` (None: a model_config
    without the key, as rsnet wrote before the setting)."""
    torch.manual_seed(0)
    model = build_model(arch, "test_resnet", len(EXPORT_CLASSES), main_pool=pool or "avg").eval()
    with torch.no_grad():  # GeM's p away from its start, so that a load that dropped it would show
        for name, parameter in model.named_parameters():
            if name.endswith("global_pool.p"):
                parameter.fill_(2.5)
    return save_model_checkpoint(path, model, without=None if pool else "main_pool")


@pytest.mark.parametrize("pool", POOLS)
def test_export_round_trip(pool: str, tmp_path: Path) -> None:
    checkpoint = write_pool_checkpoint(tmp_path / f"{pool}.pt", pool)
    x = batch(3, EXPORT_SIZE)
    reference = full_logits(checkpoint, x, "main")
    formats = ["auto", "state_dict", "torchscript"] + (["timm"] if pool in ("avg", "avgmax") else [])
    for fmt in formats:
        out = tmp_path / fmt
        result = export_checkpoint(checkpoint, out, format=fmt)
        meta = json.loads((out / METADATA_FILE).read_text())
        assert meta["main_pool"] == meta["model_config"]["main_pool"] == pool
        assert meta["format"] == (fmt if fmt != "auto" else "timm" if pool in ("avg", "avgmax") else "state_dict")
        assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5
        loaded = load_model(out, setting="model").model
        with torch.no_grad():
            assert (loaded(x) - reference).abs().max() <= 1e-5, fmt
        cam_model = attention_model(load_exported(out))  # CAM / Grad-CAM of an export: rebuilt with its pool
        assert cam_model.model_config["main_pool"] == pool
        assert class_activation_maps(cam_model, x)["main"].shape == (3, EXPORT_SIZE, EXPORT_SIZE)
    if pool == "avgmax":  # timm alone rebuilds timm's catavgmax pool from the export's config.json
        plain = timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True).eval()
        with torch.no_grad():
            assert (plain(x) - reference).abs().max() <= 1e-5


@pytest.mark.parametrize("pool", ["gem", "grid2"])
def test_timm_format_refuses_a_pool_timm_cannot_build(pool: str, tmp_path: Path) -> None:
    checkpoint = write_pool_checkpoint(tmp_path / "best.pt", pool)
    message = (rf"^format=timm writes a plain timm classifier, and timm has no pool for the model's "
               rf"model.options.main_pool={pool} \(it builds avg, avgmax only\): use format=state_dict \(rsnet loads "
               r"it\), torchscript or onnx$")
    with pytest.raises(ExportError, match=message):
        export_checkpoint(checkpoint, tmp_path / "out", format="timm")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pool", ["gem", "avgmax", "grid2"])
def test_onnx_export_of_each_pool(pool: str, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    checkpoint = write_pool_checkpoint(tmp_path / "best.pt", pool)
    result = export_checkpoint(checkpoint, tmp_path / "out", format="onnx")
    x = batch(3, EXPORT_SIZE)
    with torch.no_grad():
        assert (load_exported(tmp_path / "out")(x) - full_logits(checkpoint, x, "main")).abs().max() <= 1e-5
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-5


@pytest.mark.parametrize("arch", ["mgml_fenet", "esd_mbenet"])
def test_a_checkpoint_without_the_setting_loads_as_avg(arch: str, tmp_path: Path) -> None:
    old = write_pool_checkpoint(tmp_path / "old.pt", None, arch)
    new = write_pool_checkpoint(tmp_path / "new.pt", "avg", arch)
    assert "main_pool" not in torch.load(old, weights_only=True)["model_config"]
    model, _ = model_from_training_checkpoint(old)
    assert model.model_config["main_pool"] == "avg" and model.backbone.pool is None
    x = batch(3, EXPORT_SIZE)
    assert torch.equal(full_logits(old, x, "main"), full_logits(new, x, "main"))
    plain = extract_main_branch(model)
    assert type(plain.global_pool) is SelectAdaptivePool2d and plain.global_pool.pool_type == "avg"


@pytest.mark.parametrize("fmt", ["state_dict", "timm"])
def test_an_export_without_the_setting_loads_as_avg(fmt: str, tmp_path: Path) -> None:
    """An export of an rsnet before main_pool: no ``main_pool`` in model.json nor in its model_config."""
    checkpoint = write_pool_checkpoint(tmp_path / "old.pt", None)
    out = tmp_path / "out"
    export_checkpoint(checkpoint, out, format=fmt)
    path = out / METADATA_FILE
    meta = json.loads(path.read_text())
    del meta["main_pool"]
    del meta["model_config"]["main_pool"]
    meta[DIGEST_KEY].pop(METADATA_FILE)
    meta[DIGEST_KEY][METADATA_FILE] = metadata_digest(meta)
    path.write_text(json.dumps(meta, indent=2))
    x = batch(3, EXPORT_SIZE)
    with torch.no_grad():
        assert (load_exported(out)(x) - full_logits(checkpoint, x, "main")).abs().max() <= 1e-5
    assert attention_model(load_exported(out)).model_config["main_pool"] == "avg"


def test_a_checkpoint_with_a_bad_value_is_one_line(tmp_path: Path) -> None:
    checkpoint = write_pool_checkpoint(tmp_path / "best.pt", "avg")
    payload = torch.load(checkpoint, weights_only=True)
    payload["model_config"]["main_pool"] = "max"
    payload.pop(DIGEST_KEY, None)
    bad = save_checkpoint(tmp_path / "bad.pt", payload)
    with pytest.raises(ExportError, match=f"^{BAD}$") as caught:
        model_from_training_checkpoint(bad)
    assert len(str(caught.value).splitlines()) == 1 and re.search("main_pool", str(caught.value))


@pytest.mark.parametrize("p", [3.0, 12.0, 40.0])
def test_gem_stays_finite_on_large_maps_and_exponents(p: float) -> None:
    """x ** p overflowed float32 for large activations or a large learned p (NaN losses on 13-band images); the pool
    divides each channel by its maximum first and gives the exact GeM (float64 reference), gradients finite."""
    pool = GeneralizedMeanPool2d(p=p)
    x = (torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(3)) * 5e3).requires_grad_(True)
    out = pool(x)
    reference = x.detach().double().pow(p).mean(dim=(2, 3)).pow(1 / p)
    assert torch.isfinite(out).all() and torch.allclose(out.double(), reference, rtol=1e-4)
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(pool.p.grad).all()


def test_gem_uses_an_exponent_of_at_least_one() -> None:
    """A learned p below 1 pools as the average (p = 1), never as p -> 0 (whose 1 / p overflows)."""
    pool = GeneralizedMeanPool2d(p=0.01)
    x = torch.rand(2, 3, 5, 5, generator=torch.Generator().manual_seed(4)) + 0.1
    assert torch.allclose(pool(x), x.mean(dim=(2, 3)), atol=1e-6)
