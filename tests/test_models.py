"""Models: heads and shapes, CAM consistency, gradients, main-branch extraction (weights: test_weights.py)."""

from __future__ import annotations

import pytest
import timm
import torch

from rsnet.losses import MultiBranchLoss
from rsnet.models import MODELS, BackboneError, build_model, validate_image_size
from rsnet.models.main_branch import extract_main_branch

NUM_CLASSES = 5
SIZE = 64
HEADS = {
    "baseline": {"main"},
    "esd_mbenet": {"main", "aux1", "aux2", "gate_ensemble", "feature_ensemble", "ensemble"},
    "mgml_fenet": {"main", "ffb", "fem", "ensemble"} | {f"fem_s{l}_g{g}" for l in (2, 3, 4) for g in (1, 2, 4)},
}
# every arch on the tiny test model and on resnet50; the other papers' backbones on ESD-MBENet
CASES = [(arch, "test_resnet") for arch in MODELS] + [(arch, "resnet50") for arch in MODELS] + [
    ("esd_mbenet", "densenet121"), ("esd_mbenet", "vgg16")]


def batch(n: int = 2, size: int = SIZE) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("arch", "backbone"), CASES)
def test_model(arch: str, backbone: str) -> None:
    """Heads and shapes, finite differentiable losses, CAM contract, pruned main branch == main logits."""
    torch.manual_seed(0)
    model = build_model(arch, backbone, NUM_CLASSES).train()
    x = batch()
    out = model(x)
    assert set(out.logits) == HEADS[arch]
    assert all(z.shape == (2, NUM_CLASSES) and torch.isfinite(z).all() for z in out.logits.values())
    assert out.ensemble == (None if arch == "baseline" else "ensemble")
    terms = MultiBranchLoss(rampup_epochs=2)(out, torch.tensor([0, 3]), epoch=1.0)
    assert {f"ce/{h}" for h in HEADS[arch]} <= set(terms.terms)
    assert torch.isfinite(terms.total) and all(torch.isfinite(v) for v in terms.terms.values())
    terms.total.backward()
    assert [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None] == []

    model.eval()
    with torch.no_grad():
        out = model(x)
    heads = model.cam_classifiers()  # CAM contract: logits[k] == linear(GAP(features[k]))
    assert "main" in heads
    for head, linear in heads.items():
        assert torch.allclose(linear(out.features[head].mean(dim=(2, 3))), out.logits[head], atol=1e-5)
    plain = extract_main_branch(model)  # a plain timm classifier giving the main logits
    with torch.no_grad():
        assert (plain(x) - out.main_logits).abs().max() <= 1e-5
    if backbone == "test_resnet":  # cheap enough to also check the strict reload and the config round trip
        assert type(plain) is type(timm.create_model(backbone))
        timm.create_model(backbone, num_classes=NUM_CLASSES).load_state_dict(plain.state_dict())
        build_model(**model.model_config).load_state_dict(model.state_dict())


@pytest.mark.parametrize("main_pool", ["gem", "avgmax", "grid2"])
@pytest.mark.parametrize("arch", sorted(MODELS))
def test_pruned_main_branch_of_every_main_pool(arch: str, main_pool: str) -> None:
    """As test_model's last check, for the main pools other than avg (tests/test_main_pool.py: the rest)."""
    torch.manual_seed(0)
    model = build_model(arch, "test_resnet", NUM_CLASSES, main_pool=main_pool).eval()
    x = batch()
    with torch.no_grad():
        out = model(x)
        plain = extract_main_branch(model)
        assert (plain(x) - out.main_logits).abs().max() <= 1e-5
        linear = model.cam_classifiers()["main"]  # CAM contract of a wider classifier: through cam_inputs
        terms = model.cam_inputs("main", out.features["main"])
        assert torch.allclose(linear(terms.mean(dim=(2, 3))), out.main_logits, atol=1e-5)
    assert type(plain) is type(timm.create_model("test_resnet"))
    build_model(**model.model_config).load_state_dict(model.state_dict())


def test_copy_branches_and_options() -> None:
    model = build_model("esd_mbenet", "test_resnet", 3, aux_branch="copy", num_branches=4)
    out = model(batch())
    assert list(out.logits) == ["main", "aux1", "aux2", "aux3", "gate_ensemble", "feature_ensemble", "ensemble"]
    assert out.features["aux1"].shape == out.features["stage4"].shape
    assert model.model_config["dilations"] == [2, 3, 4]
    with pytest.raises(ValueError, match=r"^aux_branch must be one of \('dilated', 'copy'\), got 'nope'$"):
        build_model("esd_mbenet", "test_resnet", 3, aux_branch="nope")
    with pytest.raises(ValueError, match=r"^unknown option\(s\) \['grids'\] for arch 'baseline'; "
                                         r"valid: \['drop_rate', 'main_pool'\]$"):
        build_model("baseline", "test_resnet", 3, grids=[1])
    with pytest.raises(ValueError, match=r"model.arch=.resnet. is not known; valid: baseline, esd_mbenet, mgml_fenet"):
        build_model("resnet", "test_resnet", 3)


def test_unknown_backbone_suggests_names() -> None:
    with pytest.raises(BackboneError, match="backbone.name='resnet5O'.*did you mean.*resnet50"):
        build_model("baseline", "resnet5O", 3)


def test_validate_image_size() -> None:
    validate_image_size("resnet50", 224)
    validate_image_size("vgg16", 32)
    with pytest.raises(ValueError, match=r"^image_size 16 is too small for backbone 'densenet121': it downsamples 32x, "
                                         r"so inputs need at least 32 px"):
        validate_image_size("densenet121", 16)
