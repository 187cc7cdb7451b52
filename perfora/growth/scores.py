"""One epoch's report: the scores checked and agreed over ranks, and the per-architecture best.

Every rank must take the same decision, so the scores are averaged over ranks (weighted)
before the policy sees them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import PerforaConfig
from ..distributed.collectives import agree_on_scores
from ..errors import ScoreError
from .state import ControllerState, as_score


def read_scores(score: Any, test_score: Any, extra: Mapping[str, Any] | None, weight: Any
                ) -> tuple[float, float | None, dict[str, float]]:
    """(validation, test, extras) as finite floats, averaged over ranks by ``weight``."""
    value = as_score(score)
    test = None if test_score is None else as_score(test_score, "test score")
    extras = {k: as_score(v, f"extra score {k!r}") for k, v in (extra or {}).items()}
    weight = as_score(weight, "weight")
    if weight <= 0:
        raise ScoreError(f"weight must be > 0 (e.g. the size of this rank's validation "
                         f"shard), got {weight}")
    value, test, *extra_values = agree_on_scores([value, test, *extras.values()],
                                                 weight=float(weight))
    return value, test, dict(zip(extras, extra_values))


def update_arch(state: ControllerState, config: PerforaConfig, running: float,
                test: float | None, params: int) -> None:
    """Record the running score in best_arch_scores when it is this architecture's best
    (architectures keyed by their growth steps: dendrite sets, or neuron steps)."""
    key = str(state.growth_steps(config.growth))
    entry = state.arch.get(key)
    better = entry is None or (running > entry["best_val_score"] if config.maximize
                               else running < entry["best_val_score"])
    if better:
        state.arch[key] = {"dendrites": state.num_dendrites, "params": params,
                           **({"widenings": state.num_widenings}
                              if config.growth != "dendrites" else {}),
                           "best_val_score": running, "test_score": test,
                           "epoch": state.epoch}
