"""The interface between the growth controller and a learning rule."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checkpoint.schema import check_dict, check_optional, check_str
from ..nn.layers import DendriticLayer


@dataclass
class RuleStep:
    """What a rule did with one epoch's report.

    ``handled``: the epoch belonged to a phase of the rule's own (e.g. a dendrite-only phase),
    so the controller must not count it toward its own patience or best score.
    ``trainables_changed``: the set of trainable parameters changed, so the optimizer (and
    any data-parallel wrapper) must be rebuilt.
    """

    handled: bool = False
    trainables_changed: bool = False
    reason: str = ""


class LearningRule:
    """Base class of learning rules. Subclasses set trainable groups per phase."""

    name = "base"
    neuron_phase = "neuron"

    def __init__(self, config: Any) -> None:
        self.config = config
        self.phase = self.neuron_phase

    def bind_model(self, model: Any) -> None:
        """Give the rule the whole model (for parameters outside the wrapped layers)."""

    def apply(self, layers: Mapping[str, DendriticLayer]) -> None:
        """Set requires_grad on every layer for the current phase."""
        raise NotImplementedError

    def after_growth(self, layers: Mapping[str, DendriticLayer]) -> None:
        """Called once right after a dendrite set was added to every layer."""
        self.phase = self.neuron_phase
        self.apply(layers)

    def end_epoch(self, score: float, layers: Mapping[str, DendriticLayer]) -> RuleStep:
        """Called first at every epoch's report; rules with phases of their own act here."""
        return RuleStep()

    def metrics(self) -> dict[str, float]:
        """Per-epoch numbers the rule wants in metrics.csv (e.g. correlation scores)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state, saved in checkpoints."""
        return {"phase": self.phase}

    @classmethod
    def validate_state(cls, data: Any, where: str = "rule",
                       structure: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A saved state of this rule, checked before it is loaded: CheckpointError naming the
        field (``rule.phase``) otherwise. ``structure``: the model's, for per-layer entries.
        Subclasses check their own fields and call this."""
        data = check_dict(data, where)
        check_optional(data, "phase", where, check_str, max_len=64)
        return data

    def load_state_dict(self, state: Mapping[str, Any],
                        layers: Mapping[str, DendriticLayer]) -> None:
        """Restore the state and the trainable flags it implies."""
        self.phase = state.get("phase", self.neuron_phase)
        self.apply(layers)
