"""Losses: cross-entropy on every head plus self-distillation from the ensemble into the main branch; a term whose heads
or maps the output lacks is 0 (docs/models.md, Losses)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rsnet.models.output import MultiBranchOutput

FEATURE_LOSSES = ("attention", "mse", "none")
FEATURE_STUDENT = "stage4"
FEATURE_TEACHER = "feature_ensemble"


@dataclass
class LossTerms:
    """The total loss (with graph) and every term separately (detached, for logging)."""

    total: Tensor
    terms: dict[str, Tensor]


def sigmoid_rampup(epoch: float, rampup_epochs: float) -> float:
    """exp(-5 (1 - t/R)^2) for t < R, else 1 (Laine & Aila; used by ONE for its distillation weight)."""
    if rampup_epochs <= 0 or epoch >= rampup_epochs:
        return 1.0
    phase = 1.0 - max(epoch, 0.0) / rampup_epochs
    return float(math.exp(-5.0 * phase * phase))


def attention_map(features: Tensor) -> Tensor:
    """Spatial attention of (B, C, h, w) maps: mean over channels of x^2, flattened and L2-normalised."""
    return F.normalize(features.pow(2).mean(dim=1).flatten(1), dim=1)


def distillation_kl(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """T^2 * KL(softmax(teacher/T) || softmax(student/T)), batch mean; the teacher is detached."""
    t = temperature
    return F.kl_div(F.log_softmax(student / t, dim=1), F.log_softmax(teacher.detach() / t, dim=1),
                    reduction="batchmean", log_target=True) * (t * t)


def feature_distance(student: Tensor, teacher: Tensor, kind: str) -> Tensor:
    teacher = teacher.detach()
    if kind == "attention":
        return (attention_map(student) - attention_map(teacher)).pow(2).mean()
    return F.mse_loss(student, teacher)


def check_loss_heads(loss: MultiBranchLoss, heads: Sequence[str]) -> None:
    """The loss's teacher and cross-entropy heads must be among the model's ``heads`` (ValueError naming the
    setting)."""
    if loss.teacher is not None and loss.teacher not in heads:
        raise ValueError(f"teacher={loss.teacher!r}: not a head; the heads are {', '.join(heads)}")
    missing = [head for head in loss.ce_heads or () if head not in heads]
    if missing:
        raise ValueError(f"ce_heads={loss.ce_heads!r}: {', '.join(missing)} not a head; the heads are "
                         f"{', '.join(heads)}")


class MultiBranchLoss(nn.Module):
    """Cross-entropy on every head + logit and feature-map self-distillation with a ramp-up weight. The defaults
    are ESD-MBENet's recipe (conf/model/esd_mbenet.yaml; a test keeps the two equal)."""

    def __init__(self, temperature: float = 3.0, alpha: float = 4.0, beta: float = 50.0, rampup_epochs: float = 5.0,
                 feature_loss: str = "attention", teacher: str | None = None, ce_heads: Sequence[str] | None = None,
                 label_smoothing: float = 0.1) -> None:
        super().__init__()
        if feature_loss not in FEATURE_LOSSES:
            raise ValueError(f"feature_loss={feature_loss!r}: must be one of {', '.join(FEATURE_LOSSES)}")
        checks = (("temperature", temperature, "a finite number > 0", lambda v: 0 < v < math.inf),
                  ("alpha", alpha, "a finite number >= 0", lambda v: 0 <= v < math.inf),
                  ("beta", beta, "a finite number >= 0", lambda v: 0 <= v < math.inf),
                  ("rampup_epochs", rampup_epochs, "a finite number >= 0", lambda v: 0 <= v < math.inf),
                  ("label_smoothing", label_smoothing, "in [0, 1)", lambda v: 0 <= v < 1))
        for name, value, wanted, in_range in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not in_range(value):
                raise ValueError(f"{name}={value!r}: must be {wanted}")
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.rampup_epochs = float(rampup_epochs)
        self.feature_loss = feature_loss
        self.teacher = teacher
        self.ce_heads = list(ce_heads) if ce_heads is not None else None
        self.label_smoothing = float(label_smoothing)

    def forward(self, output: MultiBranchOutput, target: Tensor, epoch: float = 0.0) -> LossTerms:
        heads = self.ce_heads if self.ce_heads is not None else list(output.logits)
        missing = [head for head in heads if head not in output.logits]
        if missing:
            raise KeyError(f"ce_heads {missing} are not heads of this model ({sorted(output.logits)})")
        terms: dict[str, Tensor] = {}
        ce_total = output.main_logits.new_zeros(())
        for head in heads:
            ce = F.cross_entropy(output.logits[head], target, label_smoothing=self.label_smoothing)
            terms[f"ce/{head}"] = ce.detach()
            ce_total = ce_total + ce
        terms["ce"] = ce_total.detach()
        total = ce_total
        teacher = self.teacher or output.ensemble
        if teacher is not None and len(output.logits) > 1:
            if teacher not in output.logits:
                raise KeyError(f"teacher head {teacher!r} is not a head of this model ({sorted(output.logits)})")
            weight = sigmoid_rampup(epoch, self.rampup_epochs)
            zero = ce_total.new_zeros(())
            kd = zero
            if self.alpha:
                kd = distillation_kl(output.student_logits, output.logits[teacher], self.temperature)
            has_maps = FEATURE_STUDENT in output.features and FEATURE_TEACHER in output.features
            fd = zero
            if self.beta and self.feature_loss != "none" and has_maps:
                fd = feature_distance(output.features[FEATURE_STUDENT], output.features[FEATURE_TEACHER],
                                      self.feature_loss)
            total = total + weight * (self.alpha * kd + self.beta * fd)
            terms["sd_logits"] = kd.detach()
            terms["sd_features"] = fd.detach()
            terms["sd_weight"] = torch.tensor(weight)
        terms["total"] = total.detach()
        return LossTerms(total=total, terms=terms)
