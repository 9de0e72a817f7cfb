"""The one output structure every rsnet model returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class MultiBranchOutput:
    """Logits of every head and the feature maps the losses and attention maps need.

    ``logits`` always holds ``main`` (the branch that survives pruning). ``ensemble`` names the
    head a model is scored by (``None``: the model has a single head and is scored by ``main``).
    ``features`` holds (B, C, h, w) maps; ``features[k]`` for a head ``k`` of the form
    GAP -> Linear is the map that head pools (used for CAM and Grad-CAM).
    """

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
