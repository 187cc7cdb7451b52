"""Learning rules: how dendrites learn after they are added. The controller only talks to
the :class:`LearningRule` interface, so a new rule plugs in without touching it."""

from __future__ import annotations

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


__all__ = ["LearningRule", "RuleStep", "GradientDescentRule", "CorrelationRule", "register_rule",
           "available_rules", "make_rule"]
