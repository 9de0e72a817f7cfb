"""The one output structure every rsnet model returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class MultiBranchOutput:
    """Logits of every head and the feature maps the losses and attention maps need. ``logits`` always holds
    ``main`` (the branch that survives pruning); ``ensemble`` names the scored head (None: ``main``);
    ``features[k]`` of a GAP -> Linear head ``k`` is the (B, C, h, w) map it pools (for CAM)."""

    logits: dict[str, Tensor]
    features: dict[str, Tensor] = field(default_factory=dict)
    main: str = "main"
    ensemble: str | None = None

    @property
    def main_logits(self) -> Tensor:
        """Logits of the main branch."""
        return self.logits[self.main]

    @property
    def prediction_logits(self) -> Tensor:
        """Logits the model is scored by: the ensemble when it has one, else the main branch."""
        return self.logits[self.ensemble or self.main]
