"""Learning rules: how dendrites learn after they are added. The controller only talks to
the :class:`LearningRule` interface, so a new rule plugs in without touching it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import LearningRule, RuleStep
from .correlation import CorrelationRule
from .gradient import GradientDescentRule

_RULES: dict[str, type[LearningRule]] = {"gd": GradientDescentRule,
                                         "correlation": CorrelationRule}


def register_rule(name: str, rule_class: type[LearningRule]) -> None:
    """Make a rule available under ``name`` (the ``rule`` setting)."""
    _RULES[name] = rule_class


def available_rules() -> tuple[str, ...]:
    """Names accepted by the ``rule`` setting."""
    return tuple(_RULES)


def make_rule(name: str, config) -> LearningRule:
    """Instantiate the rule called ``name`` for a run with ``config``."""
    return _RULES[name](config)


def validate_rule_state(data: Any, where: str = "rule",
                        structure: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A saved rule state, checked against the fields of every rule perfora ships (a file may
    come from a run of either rule, whatever rule loads it): CheckpointError naming the field."""
    for rule in (GradientDescentRule, CorrelationRule):
        data = rule.validate_state(data, where, structure)
    return data


__all__ = ["LearningRule", "RuleStep", "GradientDescentRule", "CorrelationRule", "register_rule",
           "available_rules", "make_rule", "validate_rule_state"]
