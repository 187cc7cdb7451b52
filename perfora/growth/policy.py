"""The plateau policy: a score in, a verdict out (continue, grow, rewind and grow, complete).

Side-effect free: :func:`observe` returns the next state and what to do; the controller
acts on the verdict (rewinds, grows, re-wraps). Everything here is a function of the
state, the config and the score, so every rank reaches the same verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..config import PerforaConfig
from .state import COMPLETE, CONTINUE, RESTRUCTURE, Action, ControllerState

NEW_SET = "{dendrites}"  # in a reason: the dendrite count after the growth it announces
NEW_STEP = "{neuron_steps}"  # ... and the neuron step count


@dataclass(frozen=True)
class Verdict:
    """What to do after one score: the action, its reason, and the state to adopt."""

    action: Action
    reason: str
    state: ControllerState
    running: float
    improved_best: bool = False
    rewind: bool = False  # restore the best snapshot first
    grow: bool = False  # then add a dendrite set

    def describe(self, num_dendrites: int, num_widenings: int = 0) -> str:
        """The reason, naming the dendrite (and neuron step) count the verdict's growth
        reached."""
        return self.reason.replace(NEW_SET, str(num_dendrites)).replace(
            NEW_STEP, str(num_widenings))


def beats(config: PerforaConfig, num_dendrites: int, new: float, old: float | None) -> bool:
    """True when ``new`` improves on ``old`` by more than the configured threshold."""
    if old is None:
        return True
    rel = config.threshold_for(num_dendrites)
    margin = max(rel * abs(old), config.improvement_threshold_raw)
    gain = new - old if config.maximize else old - new
    return gain > margin


NEAR_START = 0.5
"""``dendrite_optimizer='auto'`` restarts the optimizer while the best score differs from the
first by less than this fraction of it."""


def carries_optimizer(config: PerforaConfig, state: ControllerState, kind: str | None
                      ) -> bool:
    """True when the optimizer's state goes on through a growth step of ``kind``: always
    after neurons; after dendrites per ``dendrite_optimizer``. Under 'auto' a set restarts
    it while the network is still near its start (the best score within ``NEAR_START`` of
    the first, relatively: on a plateau a fresh optimizer's full-size steps help it off)
    and carries it on once the network fits (the moments refine what it learned)."""
    if kind == "neurons":
        return True
    if kind != "dendrites" or config.dendrite_optimizer == "restart":
        return False
    if config.dendrite_optimizer == "carry":
        return True
    first, best = state.first_score, state.global_best
    if first is None or best is None:  # a run saved before 'first_score' was kept
        return False
    return best != first and abs(best - first) >= NEAR_START * abs(first)


def _reached_target(state: ControllerState, config: PerforaConfig) -> bool:
    target, best = config.target_score, state.global_best
    if target is None or best is None:
        return False
    return best >= target if config.maximize else best <= target


def _switch_due(state: ControllerState, config: PerforaConfig, ahead: int = 0) -> bool:
    """True when the plateau (or the fixed/every-epoch schedule) calls for a switch now
    (``ahead=1``: at the next report, if it does not improve)."""
    if config.capacity_test or config.switch_mode == "every_epoch":
        return True
    epoch = state.epoch + ahead
    if config.switch_mode == "fixed":
        return epoch - state.cycle_start_epoch >= config.fixed_switch_num
    return epoch - state.last_improved_epoch >= config.n_epochs_to_switch


def growth_may_come_next(state: ControllerState, config: PerforaConfig,
                         neuron_phase: bool) -> bool:
    """True when the next epoch's report may add dendrites (if it does not improve)."""
    if state.completed or config.growth_cap() == 0 or config.switch_mode == "never" \
            or not neuron_phase:
        return False
    return _switch_due(state, config, ahead=1)


def observe(state: ControllerState, config: PerforaConfig, score: float,
            test: float | None) -> Verdict:
    """Fold one epoch's (already counted) score into a copy of ``state`` and decide."""
    st = dataclasses.replace(state, cycle_scores=[*state.cycle_scores, score])
    window = st.cycle_scores[-config.history_lookback:]
    st.cycle_scores = window
    running = sum(window) / len(window)
    if st.first_score is None:
        st.first_score = running
    improved_best = False
    steps = st.growth_steps(config.growth)
    if beats(config, steps, running, st.cycle_best):
        st.cycle_best = running
        st.last_improved_epoch = st.epoch
        if beats(config, steps, running, st.global_best):
            st.global_best, st.best_epoch, st.best_test = running, st.epoch, test
            st.cycle_set_global_best = True
            improved_best = True
    return _decide(st, config, running, improved_best)


def _decide(st: ControllerState, config: PerforaConfig, running: float,
            improved_best: bool) -> Verdict:
    """The verdict for the updated state ``st`` (which it may still change: tries, done)."""
    cfg = config

    def verdict(action: Action, reason: str, rewind: bool = False, grow: bool = False
                ) -> Verdict:
        return Verdict(action, reason, st, running, improved_best, rewind, grow)

    def complete(reason: str, rewind: bool = True) -> Verdict:
        st.completed = True
        return verdict(COMPLETE, reason, rewind=rewind)

    if _reached_target(st, cfg):
        return complete(f"reached target_score={cfg.target_score}")
    if not _switch_due(st, cfg):
        return verdict(CONTINUE, "training")
    if cfg.capacity_test:
        if st.additions >= 3:
            return complete("capacity test: 3 dendrite sets added", rewind=False)
        return verdict(RESTRUCTURE, "capacity test: dendrites added every epoch", grow=True)
    if cfg.switch_mode == "never" or cfg.growth_cap() == 0:
        return complete(f"early stopping: no improvement for {cfg.n_epochs_to_switch} epochs")
    if cfg.growth == "auto":
        return _decide_auto(st, cfg, verdict, complete)
    what, cap = {"neurons": ("neuron step", "max_neuron_steps")}.get(
        cfg.growth, ("dendrite set", "max_dendrites"))
    steps = st.growth_steps(cfg.growth)
    if steps > 0 and not st.cycle_set_global_best and not cfg.retain_all_dendrites:
        if st.tries + 1 < cfg.max_dendrite_tries:
            st.tries += 1
            return verdict(RESTRUCTURE, f"{what} did not beat the best score; retry "
                                        f"{st.tries} of {cfg.max_dendrite_tries - 1} with fresh "
                                        "weights", rewind=True, grow=True)
        return complete(f"{what} failed {cfg.max_dendrite_tries} time(s) to beat the "
                        "best score")
    if steps >= cfg.growth_cap():
        return complete(f"reached {cap}={cfg.growth_cap()}")
    st.tries = 0
    added = f"added dendrite set {NEW_SET}" if cfg.growth == "dendrites" \
        else f"added {what} {st.num_widenings + 1}"
    return verdict(RESTRUCTURE, f"plateau: {added}",
                   rewind=not cfg.retain_all_dendrites, grow=True)


_OTHER = {"dendrites": "neurons", "neurons": "dendrites"}
_STEP_NAME = {"dendrites": "dendrite set", "neurons": "neuron step"}


def _named(st: ControllerState, kind: str, new: bool = False) -> str:
    """e.g. 'dendrite set 2' (the model's newest), or 'neuron step {neuron_steps}' (the one
    about to be added, numbered once it is)."""
    if new:
        return f"{_STEP_NAME[kind]} {NEW_SET if kind == 'dendrites' else NEW_STEP}"
    return f"{_STEP_NAME[kind]} {st.num_dendrites if kind == 'dendrites' else st.num_widenings}"


def _room(st: ControllerState, config: PerforaConfig, kind: str) -> bool:
    """True when the model may still gain a step of ``kind`` under its cap."""
    if kind == "dendrites":
        return st.num_dendrites < config.max_dendrites
    return st.num_widenings < config.max_neuron_steps


def _decide_auto(st: ControllerState, config: PerforaConfig,
                 verdict: Callable[..., Verdict], complete: Callable[..., Verdict]) -> Verdict:
    """growth='auto' at a plateau: keep growing the kind whose last step beat the best score
    (dendrites first), each step from the best model; undo a step that did not and try the
    other kind from the best model; complete when both failed in a row or both kinds reached
    their caps."""
    kind, other = st.auto_kind, _OTHER[st.auto_kind]
    if st.num_steps > 0 and not st.cycle_set_global_best:
        if st.auto_failed or not _room(st, config, other):
            also = f", nor did the {_STEP_NAME[other]} before it" if st.auto_failed else ""
            return complete(f"{_named(st, kind)} did not beat the best score{also}: growth "
                            "stops here")
        failed = _named(st, kind)
        st.auto_kind, st.auto_failed = other, True
        st.tries = 0
        return verdict(RESTRUCTURE, f"{failed} did not beat the best score: undone; added "
                                    f"{_named(st, other, new=True)} instead",
                       rewind=True, grow=True)
    if st.num_steps > 0:
        st.auto_failed = False  # the last step paid
    if not _room(st, config, kind):
        if not _room(st, config, other):
            return complete(f"reached max_dendrites={config.max_dendrites} and "
                            f"max_neuron_steps={config.max_neuron_steps}")
        kind = st.auto_kind = other
    # each step grows from the best model, not from the epochs of plateau after it
    # (measured better than growing on top: benchmarks/README.md, "auto grows from the best")
    return verdict(RESTRUCTURE, f"plateau: added {_named(st, kind, new=True)}",
                   rewind=True, grow=True)
