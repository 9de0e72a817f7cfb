"""The one output structure every rsnet model returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class MultiBranchOutput:
    """Logits of every head (always ``main``; ``ensemble`` names the scored head) and the feature maps the losses and
    CAM need (``features[k]``: the (B, C, h, w) map head ``k`` pools)."""

    logits: dict[str, Tensor]
    features: dict[str, Tensor] = field(default_factory=dict)
    main: str = "main"
    ensemble: str | None = None
    student: str | None = None  # the head self-distillation trains (None: the main branch)

    @property
    def main_logits(self) -> Tensor:
        """Logits of the main branch."""
        return self.logits[self.main]

    @property
    def student_logits(self) -> Tensor:
        """Logits of the head the self-distillation trains: the main branch's, or ``student``'s where it is set."""
        return self.logits[self.student or self.main]

    @property
    def prediction_logits(self) -> Tensor:
        """Logits the model is scored by: the ensemble when it has one, else the main branch."""
        return self.logits[self.ensemble or self.main]
