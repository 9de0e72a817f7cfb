"""Losses: terms, ramp-up, detached teachers, baseline CE only."""

from __future__ import annotations

import re
import math

import pytest
import torch
import torch.nn.functional as F

from rsnet.losses import MultiBranchLoss, attention_map, distillation_kl, sigmoid_rampup
from rsnet.models.output import MultiBranchOutput


def output(requires_grad: bool = True) -> MultiBranchOutput:
    g = torch.Generator().manual_seed(0)
    logits = {k: torch.randn(4, 3, generator=g, requires_grad=requires_grad) for k in ("main", "aux1", "ensemble")}
    features = {k: torch.randn(4, 8, 5, 5, generator=g, requires_grad=requires_grad)
                for k in ("stage4", "feature_ensemble")}
    return MultiBranchOutput(logits=logits, features=features, ensemble="ensemble")


def test_rampup() -> None:
    assert sigmoid_rampup(0, 5) == pytest.approx(math.exp(-5))
    assert sigmoid_rampup(2.5, 5) == pytest.approx(math.exp(-1.25))
    assert sigmoid_rampup(5, 5) == 1.0 and sigmoid_rampup(9, 5) == 1.0 and sigmoid_rampup(0, 0) == 1.0


def test_terms_and_total() -> None:
    out = output()
    target = torch.tensor([0, 1, 2, 0])
    loss = MultiBranchLoss(temperature=3.0, alpha=1.0, beta=2.0, rampup_epochs=4, label_smoothing=0.0)
    result = loss(out, target, epoch=2.0)
    ce = sum(F.cross_entropy(out.logits[k], target) for k in out.logits)
    kd = 9.0 * F.kl_div(F.log_softmax(out.logits["main"] / 3, 1), F.softmax(out.logits["ensemble"] / 3, 1),
                        reduction="batchmean")
    at = (attention_map(out.features["stage4"]) - attention_map(out.features["feature_ensemble"])).pow(2).mean()
    w = sigmoid_rampup(2.0, 4)
    assert result.total.item() == pytest.approx((ce + w * (kd + 2.0 * at)).item(), rel=1e-5)
    assert set(result.terms) == {"ce/main", "ce/aux1", "ce/ensemble", "ce", "sd_logits", "sd_features",
                                 "sd_weight", "total"}
    assert result.terms["sd_logits"].item() == pytest.approx(kd.item(), rel=1e-5)
    assert not result.terms["total"].requires_grad


def test_teachers_are_detached() -> None:
    out = output()
    loss = MultiBranchLoss(alpha=1.0, beta=1.0, rampup_epochs=0, ce_heads=[])
    loss(out, torch.tensor([0, 1, 2, 0]), epoch=0).total.backward()
    assert out.logits["ensemble"].grad is None and out.features["feature_ensemble"].grad is None
    assert out.logits["main"].grad.abs().sum() > 0 and out.features["stage4"].grad.abs().sum() > 0


def test_kl_zero_for_identical_logits_and_mse_option() -> None:
    z = torch.randn(3, 4)
    assert distillation_kl(z, z.clone(), 3.0).abs().item() < 1e-6
    out = output()
    mse = MultiBranchLoss(feature_loss="mse", rampup_epochs=0)(out, torch.tensor([0, 1, 2, 0]))
    expected = F.mse_loss(out.features["stage4"], out.features["feature_ensemble"])
    assert mse.terms["sd_features"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_single_head_is_cross_entropy_only() -> None:
    z = torch.randn(4, 3, requires_grad=True)
    result = MultiBranchLoss(label_smoothing=0.0)(MultiBranchOutput(logits={"main": z}), torch.tensor([0, 1, 2, 0]))
    assert set(result.terms) == {"ce/main", "ce", "total"}
    assert result.total.item() == pytest.approx(F.cross_entropy(z, torch.tensor([0, 1, 2, 0])).item())


def test_bad_options() -> None:
    with pytest.raises(ValueError, match=r"^feature_loss='cosine': must be one of attention, mse, none$"):
        MultiBranchLoss(feature_loss="cosine")
    for setting, value, wanted in [("temperature", 0.0, "a finite number > 0"), ("alpha", -1.0, "a finite number >= 0"),
                                   ("beta", float("inf"), "a finite number >= 0"),
                                   ("label_smoothing", 1.0, "in [0, 1)"), ("rampup_epochs", "5", "a finite number >= 0")]:
        with pytest.raises(ValueError, match=re.escape(f"{setting}={value!r}: must be {wanted}")):
            MultiBranchLoss(**{setting: value})
    with pytest.raises(KeyError, match="teacher"):
        MultiBranchLoss(teacher="nope")(output(), torch.tensor([0, 1, 2, 0]))
