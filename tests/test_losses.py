"""Losses: terms, ramp-up, detached teachers, baseline CE only."""

from __future__ import annotations

import re
import math

import pytest
import torch
import torch.nn.functional as F

from rsnet.losses import MultiBranchLoss, distillation_kl, sigmoid_rampup
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


def hand_output() -> MultiBranchOutput:
    """One image, two classes: main logits (2 ln 3, 0), softmax (9/10, 1/10), and at T = 2 (3/4, 1/4); ensemble
    logits (0, 0), softmax (1/2, 1/2) at any T. Student map: channels (2, 0) and (0, 0), so the mean of squares is
    (2, 0), normalised (1, 0); teacher map: channels (1, 2) and (1, 0), mean of squares (1, 2), normalised
    (1/sqrt 5, 2/sqrt 5)."""
    logits = {"main": torch.tensor([[2 * math.log(3.0), 0.0]]), "ensemble": torch.tensor([[0.0, 0.0]])}
    features = {"stage4": torch.tensor([[[[2.0, 0.0]], [[0.0, 0.0]]]]),
                "feature_ensemble": torch.tensor([[[[1.0, 2.0]], [[1.0, 0.0]]]])}
    return MultiBranchOutput(logits=logits, features=features, ensemble="ensemble")


def test_terms_and_total() -> None:
    """Every term against numbers worked out by hand for :func:`hand_output`, target class 0."""
    loss = MultiBranchLoss(temperature=2.0, alpha=1.0, beta=2.0, rampup_epochs=4, label_smoothing=0.1)
    result = loss(hand_output(), torch.tensor([0]), epoch=2.0)
    # label smoothing 0.1 over 2 classes: the target is (0.95, 0.05)
    ce_main = 0.95 * math.log(10 / 9) + 0.05 * math.log(10)  # 0.215222 (0.105361 without smoothing)
    ce_ensemble = math.log(2)  # uniform softmax: the same with or without smoothing
    kd = 4 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25))  # T^2 KL(teacher || student) = 2 ln 4/3
    attention = ((1 - 1 / math.sqrt(5)) ** 2 + (0 - 2 / math.sqrt(5)) ** 2) / 2  # 1 - 1/sqrt 5
    weight = math.exp(-5 * (1 - 2 / 4) ** 2)  # exp(-1.25), half way through the ramp-up
    expected = {"ce/main": ce_main, "ce/ensemble": ce_ensemble, "ce": ce_main + ce_ensemble, "sd_logits": kd,
                "sd_features": attention, "sd_weight": weight,
                "total": ce_main + ce_ensemble + weight * (1.0 * kd + 2.0 * attention)}
    assert {name: value.item() for name, value in result.terms.items()} == pytest.approx(expected, rel=1e-5)
    assert expected["total"] == pytest.approx(1.389965, abs=1e-6)  # the arithmetic above, written out
    assert result.total.item() == pytest.approx(expected["total"], rel=1e-5)
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
                                   ("label_smoothing", 1.0, "in [0, 1)"),
                                   ("rampup_epochs", "5", "a finite number >= 0")]:
        with pytest.raises(ValueError, match=re.escape(f"{setting}={value!r}: must be {wanted}")):
            MultiBranchLoss(**{setting: value})
    with pytest.raises(KeyError, match="teacher"):
        MultiBranchLoss(teacher="nope")(output(), torch.tensor([0, 1, 2, 0]))
