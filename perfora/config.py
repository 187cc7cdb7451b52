"""One typed, validated settings object for a growth run; one name per setting."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config_values import (
    check_bool,
    check_int,
    in_range,
    neuron_pairs,
    nonneg_float,
    plain_scalars,
)
from .errors import ConfigError

SWITCH_MODES = ("patience", "fixed", "every_epoch", "never")
ACTIVATIONS = ("sigmoid", "tanh", "relu")
DENDRITE_INITS = ("default", "normal", "error")
CHECKPOINT_FORMATS = ("auto", "file", "dcp")
GROWTH_KINDS = ("dendrites", "neurons", "auto")
NEURON_INITS = ("gradmax", "random")
DENDRITE_OPTIMIZERS = ("carry", "restart", "auto")
MAX_INIT_SCALE = 1e4


@dataclass
class PerforaConfig:
    """Settings of a growth run. Invalid values raise :class:`ConfigError` at construction.

    The defaults are a sensible starting point for a real run; ``capacity_test`` is off.
    """

    maximize: bool = True
    """True when a higher validation score is better (accuracy); False for a loss."""
    switch_mode: str = "patience"
    """When to add dendrites: 'patience' (on a plateau), 'fixed' (every ``fixed_switch_num``
    epochs), 'every_epoch', or 'never' (plain early stopping: the baseline arm)."""
    n_epochs_to_switch: int = 10
    """Patience: epochs without improvement before a switch (or, with 'never', the stop)."""
    improvement_threshold: float | tuple[float, ...] = 1e-4
    """Relative margin a score must beat the best by (fraction of |best|). A sequence is
    indexed by the current dendrite count (its last value is used beyond its end)."""
    improvement_threshold_raw: float = 1e-5
    """Absolute margin a score must beat the best by. Both margins must be exceeded."""
    history_lookback: int = 1
    """Smooth the validation score with a mean over this many epochs of the current cycle."""
    fixed_switch_num: int = 10
    """Epochs per cycle in 'fixed' mode."""
    max_dendrites: int = 5
    """Cap on dendrite sets per layer; 0 means no dendrites: with 'dendrites' no growth at
    all (the early-stopping baseline), with 'auto' neuron steps only."""
    max_dendrite_tries: int = 2
    """Attempts (fresh random weights) for a dendrite set that fails to beat the best score;
    2 means one retry."""
    growth: str = "auto"
    """What a growth step adds: 'dendrites' (a dendrite set on every wrapped layer, up to
    ``max_dendrites``) or 'neurons' (every wrapped layer whose outputs perfora can follow to
    their readers gains ``neurons_per_step`` of its starting width in new neurons, up to
    ``max_neuron_steps`` times; the readers gain zero input columns, so the output is
    unchanged) or 'auto', the default (both kinds, chosen by the validation score: steps of
    one kind, dendrites first, while they beat the best score; a step that does not is undone
    and the other kind tried instead; growth ends when both fail in a row or both caps are
    reached: ``max_dendrites`` sets, ``max_neuron_steps`` neuron steps). 'auto' is the default
    because it measured best in ``benchmarks/quality.py``. Neuron growth runs in one process,
    under DataParallel, DDP, FSDP2 and DeepSpeed ZeRO-3 (one layer pair gathered at a time),
    FSDP1 (the whole model gathered for the step) and DeepSpeed ZeRO 0-2, with either
    ``neuron_init``. Where neurons cannot grow (no wrapped layer whose readers perfora
    finds, ``rule='correlation'``), 'auto' grows dendrites only (where no layer can gain
    neurons it warns, with each layer's reason) and 'neurons' is refused.
    The compatibility shell keeps 'dendrites' (PerforatedAI's growth). See docs/neurons.md."""
    neuron_init: str = "gradmax"
    """Incoming weights of new neurons: 'gradmax' (the directions that give their zero
    outgoing weights the largest gradient, from the error recorded in the epoch before the
    step; Linear layers read by a Linear, and convolutions with ``conv_gradmax``; elsewhere,
    and without a recorded signal, 'random')
    or 'random' (the layer's own initialisation). The outgoing weights start at zero either
    way. 'gradmax' is the default: under ``growth='auto'`` it measured better in
    ``benchmarks/quality.py`` (two spirals +1.0 points, MNIST-1D +1.2, digits +0.5 at more
    parameters; with ``growth='neurons'`` the two split the tasks)."""
    dendrite_optimizer: str = "restart"
    """The optimizer after a dendrite set: 'restart' (a fresh optimizer and schedule from the
    recipe, PerforatedAI's way), 'carry' (each old parameter's moments and the learning rates
    go on, the new dendrites' start at zero, as after a neuron step) or 'auto' (restart while
    the best score is within half of the first, relatively: a network still near its start;
    carry on after). 'restart' is the default: 'auto' met more targets of ``quality.py`` (by
    one test sample each) but grew larger models for the same accuracy on two spirals and in
    ``perfora demo``; 'carry' measured 6 points worse on two spirals."""
    conv_gradmax: bool = False
    """With ``neuron_init='gradmax'``: GradMax rows for convolutions too (a conv read by a
    conv of its kind, or by a Linear after a flatten; see docs/neurons.md), not random ones.
    Off by default: on the digits CNN of ``benchmarks/quality.py`` it measured no better
    (median 97.5% either way, mean 97.3 against 97.5, at larger sizes), and the epoch that
    records it computes each such conv's input patches."""
    neurons_per_step: float = 1.0
    """Neurons a growth step adds to a layer, as a fraction of its starting width (at least
    one): 1.0 adds as many as it started with, so widths go 1x, 2x, 3x, ..."""
    max_neuron_steps: int = 5
    """Cap on neuron growth steps (``growth='neurons'`` or ``'auto'``); with 'neurons', 0
    means none (early stopping)."""
    neuron_pairs: dict[str, list[Any]] | None = None
    """The readers of layers whose consumers perfora cannot find by itself (a model that
    neither is an ``nn.Sequential`` chain nor traces with ``torch.fx``), for neuron growth:
    ``{producer path: [consumer path, ...]}``, a consumer after a flatten as ``[path,
    repeat]``, paths as in the perforated model (``plan_widening``'s ``pairs=``). None: only
    the readers found automatically."""
    target_score: float | None = None
    """Stop growing once the (smoothed) score reaches this value, e.g. 1.0 for a training
    accuracy: "grow until the training set is learned" (report the training score to
    ``step()`` for that). None: no target."""
    retain_all_dendrites: bool = True
    """With ``growth='dendrites'`` (or 'neurons'): keep a set (or neuron step) even when its
    cycle did not beat the global best, and grow the next one on top, up to the cap;
    completion still returns the best model seen. ('auto' ignores it: it undoes a step that
    did not pay and tries the other kind, and grows each step from the best model.)
    False: a set that fails is discarded and retried (``max_dendrite_tries``), and growth ends
    when the tries are spent (PerforatedAI's behaviour; shorter runs). True is the default
    because it measured better in ``benchmarks/quality.py`` (``benchmarks/README.md``)."""
    capacity_test: bool = False
    """Quick smoke test: switch every epoch, keep every set, stop after 3 additions."""
    activation: str | None = None
    """Dendrite nonlinearity: 'sigmoid', 'tanh' or 'relu'. None keeps the one given to
    ``perforate()`` (sigmoid unless told). When set, the controller applies it to every
    wrapped layer (a layer that already holds dendrites of another kind is an error)."""
    dendrite_init: str = "error"
    """'default': the wrapped layer's own default init (uniform, 1/sqrt(fan_in)) times
    ``dendrite_init_scale``; 'normal': N(0, 1) times ``dendrite_init_scale``; 'error': from the
    error signal, Cascade-Correlation style: a pool of ``candidate_pool`` default-init
    candidates per neuron is trained for ``candidate_steps`` steps on rows of the layer's
    input and output gradient recorded in the epoch before growth, to maximise the
    covariance with the neuron's error, and the best is kept (``v`` still starts at zero, so
    the output is unchanged). Linear and ungrouped Conv1d/Conv2d layers; others, and a growth
    step with no recorded signal, use 'default'. 'error' is the default: it measured best."""
    grow_fraction: float = 1.0
    """Selective growth: the share of each layer's neurons that get a dendrite at a growth
    step, those with the most error a dendrite can explain (with ``dendrite_init='error'``:
    the best candidate's |correlation| times the error's spread; otherwise the spread of the
    error alone). 1.0: every neuron. Linear and ungrouped Conv layers; others grow full sets."""
    candidate_pool: int = 8
    """Candidates trained per neuron with ``dendrite_init='error'`` (smaller for big layers)."""
    candidate_steps: int = 100
    """Adam steps of candidate training with ``dendrite_init='error'`` (0: pick the best
    random draw)."""
    candidate_lr: float = 0.05
    """Learning rate of candidate training."""
    signal_rows: int = 2048
    """Rows of (input, output gradient) kept per layer for error-driven growth."""
    dendrite_init_scale: float = 1.0
    """Multiplier on the initial dendrite weights."""
    rule: str = "gd"
    """Learning rule: 'gd' (dendrites and neurons co-train by backprop) or 'correlation'
    (after each addition a dendrite phase trains only the new dendrites, to correlate with
    their neuron's error; then neurons and ``v`` train with the dendrites frozen)."""
    correlation_patience: int = 3
    """Correlation rule: dendrite-phase epochs without a gain of ``correlation_threshold`` in
    the mean correlation score before the new dendrites are frozen."""
    correlation_threshold: float = 0.01
    """Correlation rule: relative gain of the mean correlation score that counts as progress."""
    correlation_max_epochs_ratio: float = 1.0
    """Correlation rule: cap on a dendrite phase, as a fraction of the neuron phase before it
    (at least 1 epoch)."""
    seed: int = 0
    """Seed of the generator that draws new dendrite weights (identical on every rank)."""
    save_checkpoints: bool = True
    """Write best/latest/switch_N checkpoints to the run folder (when one is given)."""
    latest_every: int = 1
    """Write the ``latest`` checkpoint every this many epochs (1 = every epoch)."""
    checkpoint_time_budget: float | None = 0.05
    """Most of the run time that plain-epoch checkpoint writes may take: with tiny, fast
    epochs ``latest`` is then written every few epochs instead of every one. Restructures and
    the end are always written at once. None writes every ``latest_every`` epochs."""
    checkpoint_format: str = "auto"
    """How checkpoints (best/latest/switch_N, and ``save()`` to a name without a suffix) are
    written in a distributed run. 'file': one ``<name>.safetensors`` written by rank 0; a
    sharded model's full state is gathered on every rank first. 'dcp': a ``<name>.dcp``
    folder through ``torch.distributed.checkpoint``: every rank writes its own shards of the
    model and optimizer state (nothing is gathered), and rank 0 writes the structure and
    controller state beside them in ``perfora.json``; it resumes on any number of ranks.
    'auto': 'dcp' for a sharded model (FSDP1/FSDP2) on more than one rank, 'file' otherwise
    (DDP included). A single process (or a one-rank group) always writes the file: 'dcp'
    then falls back to it with a warning. Loading reads either format whatever this says.
    With 'dcp' every rank writes: give every rank the same ``run_dir``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form settings for learning rules and integrations (JSON-serializable)."""

    def __new__(cls, *args: Any, **settings: Any) -> PerforaConfig:
        # the generated __init__ would raise a bare TypeError for an unknown name
        check_setting_names(settings.keys())
        config = super().__new__(cls)
        positional = [f.name for f in dataclasses.fields(cls)][:len(args)]
        config._explicit = frozenset([*positional, *settings])
        return config

    @property
    def explicit_settings(self) -> frozenset[str]:
        """The settings given by name when this config was built (or changed by
        :meth:`replace`); the others hold their defaults. A callback takes its own defaults
        only for settings not given here."""
        return getattr(self, "_explicit", frozenset(setting_names()))

    def __post_init__(self) -> None:
        self.validate()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name: str, value: Any) -> None:
        """After construction, a setting assigned is checked as at construction (see
        :func:`_assign_checked`)."""
        if (name.startswith("_") or not getattr(self, "_ready", False)
                or getattr(self, "_validating", False)):  # validate() stores what it normalises
            object.__setattr__(self, name, value)
        else:
            _assign_checked(self, name, value)

    # ----------------------------------------------------------------- validation
    def validate(self) -> None:
        """Check every setting; raise ConfigError naming the setting and the fix."""
        plain_scalars(self)
        check_bool(self, "maximize")
        check_choice(self, "switch_mode", SWITCH_MODES)
        check_int(self, "n_epochs_to_switch", minimum=1)
        thr = self.improvement_threshold
        if isinstance(thr, str | bytes | bytearray):
            raise ConfigError(f"improvement_threshold must be a number or a sequence of "
                              f"numbers, got {thr!r}")
        if isinstance(thr, Sequence):
            if len(thr) == 0:
                raise ConfigError("improvement_threshold: an empty sequence; give a float "
                                  "or at least one value, e.g. 1e-4")
            self.improvement_threshold = tuple(
                nonneg_float("improvement_threshold", v) for v in thr)
        else:
            self.improvement_threshold = nonneg_float("improvement_threshold", thr)
        self.improvement_threshold_raw = nonneg_float(
            "improvement_threshold_raw", self.improvement_threshold_raw)
        check_int(self, "history_lookback", minimum=1)
        check_int(self, "fixed_switch_num", minimum=1)
        check_int(self, "max_dendrites", minimum=0)
        check_int(self, "max_dendrite_tries", minimum=1)
        check_bool(self, "retain_all_dendrites")
        check_bool(self, "conv_gradmax")
        check_choice(self, "growth", GROWTH_KINDS)
        check_choice(self, "neuron_init", NEURON_INITS)
        check_choice(self, "dendrite_optimizer", DENDRITE_OPTIMIZERS)
        self.neurons_per_step = in_range(
            "neurons_per_step", self.neurons_per_step, 16, "a fraction of each layer's "
            "starting width in (0, 16] (e.g. 0.5 adds half as many neurons as it started with)")
        check_int(self, "max_neuron_steps", minimum=0)
        self.neuron_pairs = neuron_pairs(self.neuron_pairs)
        if self.growth == "neurons" and self.rule != "gd":
            raise ConfigError(f"growth={self.growth!r} trains new neurons by backprop: it "
                              f"needs rule='gd', got rule={self.rule!r}")
        target = self.target_score
        if target is not None:
            if isinstance(target, bool) or not isinstance(target, int | float) \
                    or not math.isfinite(target):
                raise ConfigError(f"target_score must be a finite number or None, got "
                                  f"{target!r}")
            self.target_score = float(target)
        check_bool(self, "capacity_test")
        if self.activation is not None:
            check_choice(self, "activation", ACTIVATIONS)
        check_choice(self, "dendrite_init", DENDRITE_INITS)
        self.grow_fraction = in_range(
            "grow_fraction", self.grow_fraction, 1, "a fraction in (0, 1] (e.g. 0.5: half of "
            "each layer's neurons get a dendrite per growth step)")
        check_int(self, "candidate_pool", minimum=1)
        check_int(self, "candidate_steps", minimum=0)
        lr = self.candidate_lr
        if isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) \
                or lr <= 0:
            raise ConfigError(f"candidate_lr must be a positive number, got {lr!r}")
        self.candidate_lr = float(lr)
        check_int(self, "signal_rows", minimum=16)
        self.dendrite_init_scale = in_range(
            "dendrite_init_scale", self.dendrite_init_scale, MAX_INIT_SCALE,
            f"a positive number up to {MAX_INIT_SCALE:g} (larger initial weights overflow)")
        from .rules import available_rules

        check_choice(self, "rule", available_rules())
        if self.rule == "correlation" and self.grow_fraction < 1:
            raise ConfigError("grow_fraction < 1 (selective growth) cannot be combined with "
                              "rule='correlation', which trains full dendrite sets; use "
                              "rule='gd' (dendrite_init='error' gives Cascade-Correlation's "
                              "candidate training) or grow_fraction=1.0")
        check_int(self, "correlation_patience", minimum=1)
        self.correlation_threshold = nonneg_float("correlation_threshold",
                                                   self.correlation_threshold)
        ratio = self.correlation_max_epochs_ratio
        if (isinstance(ratio, bool) or not isinstance(ratio, int | float)
                or not math.isfinite(ratio) or ratio <= 0):
            raise ConfigError(f"correlation_max_epochs_ratio must be a positive finite number "
                              f"(e.g. 1.0: a dendrite phase at most as long as the neuron "
                              f"phase before it), got {ratio!r}")
        self.correlation_max_epochs_ratio = float(ratio)
        check_int(self, "seed", minimum=0)
        check_bool(self, "save_checkpoints")
        check_int(self, "latest_every", minimum=1)
        budget = self.checkpoint_time_budget
        if budget is not None:
            if (isinstance(budget, bool) or not isinstance(budget, int | float)
                    or not 0 < budget <= 1):
                raise ConfigError(f"checkpoint_time_budget must be a fraction in (0, 1] or "
                                  f"None, got {budget!r}")
            self.checkpoint_time_budget = float(budget)
        check_choice(self, "checkpoint_format", CHECKPOINT_FORMATS)
        if not isinstance(self.extra, dict):
            raise ConfigError(f"extra must be a dict, got {type(self.extra).__name__}")
        try:  # it is saved in run.json and every checkpoint
            json.dumps(self.extra)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"extra must hold JSON values (numbers, strings, lists, dicts), "
                              f"as run files and checkpoints save it: {exc}") from exc

    def uses_error_signal(self) -> bool:
        """True when growth steps are planned from recorded error signals."""
        return self.growth in ("dendrites", "auto") and (
            self.dendrite_init == "error" or self.grow_fraction < 1)

    def growth_cap(self) -> int:
        """Growth steps allowed of the configured kind (0: plain early stopping); with
        'auto', of both kinds together, or none with ``max_dendrites=0`` (the baseline)."""
        if self.growth == "auto":
            return self.max_dendrites + self.max_neuron_steps if self.max_dendrites else 0
        return self.max_neuron_steps if self.growth == "neurons" else self.max_dendrites

    def threshold_for(self, num_dendrites: int) -> float:
        """The relative improvement margin in force with ``num_dendrites`` sets."""
        thr = self.improvement_threshold
        if isinstance(thr, tuple):
            return thr[min(num_dendrites, len(thr) - 1)]
        return float(thr)

    # ------------------------------------------------------------ (de)serialising
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict of every setting."""
        out = dataclasses.asdict(self)
        if isinstance(out["improvement_threshold"], tuple):
            out["improvement_threshold"] = list(out["improvement_threshold"])
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PerforaConfig:
        """Build from a mapping; an unknown key is an error naming the nearest known one."""
        check_setting_names(values.keys())
        return cls(**dict(values))

    @classmethod
    def coerce(cls, config: PerforaConfig | Mapping[str, Any] | None) -> PerforaConfig:
        """``config`` as a PerforaConfig: itself, built from a mapping (a YAML or JSON
        section), or the defaults for None; anything else is a ConfigError."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping):
            return cls.from_dict(config)
        raise ConfigError(f"config must be a perfora.PerforaConfig or a mapping of settings, "
                          f"got {type(config).__name__}")

    def replace(self, **changes: Any) -> PerforaConfig:
        """A validated copy with some settings changed."""
        check_setting_names(changes.keys())
        changed = dataclasses.replace(self, **changes)
        changed._explicit = self.explicit_settings | set(changes)
        return changed


def _assign_checked(config: PerforaConfig, name: str, value: Any) -> None:
    """Set one setting of a built config and validate it all; on a ConfigError the old
    values stay. An unknown name is refused: ``cfg.max_dendrite = 1`` would otherwise add an
    attribute nothing reads."""
    check_setting_names([name])
    before = dict(config.__dict__)
    object.__setattr__(config, name, value)
    object.__setattr__(config, "_validating", True)
    try:
        config.validate()
    except ConfigError:
        config.__dict__.update(before)
        raise
    finally:
        object.__setattr__(config, "_validating", False)
    object.__setattr__(config, "_explicit", config.explicit_settings | {name})


def setting_names() -> list[str]:
    """Every valid setting name."""
    return [f.name for f in dataclasses.fields(PerforaConfig)]


def check_setting_names(names: Any) -> None:
    """Raise ConfigError for the first unknown name, suggesting the nearest known one."""
    known = setting_names()
    for name in names:
        if name not in known:
            raise ConfigError(unknown_name_message(name, known, "setting"))


def nearest_name(name: object, known: Sequence[str], cutoff: float = 0.5) -> str | None:
    """The known name closest to ``name`` (for 'did you mean' hints), or None."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=cutoff)
    return close[0] if close else None


ALIASES = {"patience": "n_epochs_to_switch", "max_tries": "max_dendrite_tries",
           "retain": "retain_all_dendrites"}
"""Names users reach for that mean a setting of another name."""

_OPTIMIZER_HINT = ("the optimizer's arguments go to controller.set_optimizer(torch.optim.Adam, "
                   "lr=...) (perfora.resume: optimizer_args={'lr': ...})")
HINTS = {
    "mode": "for a loss (lower is better) give maximize=False; for an accuracy maximize=True "
            "(the default)",
    "lr": _OPTIMIZER_HINT,
    "learning_rate": _OPTIMIZER_HINT,
    "monitor": "the controller takes the score itself: controller.step(val_score)",
    "optimizer": "register it with controller.set_optimizer(torch.optim.Adam, lr=...), or "
                 "one you built with controller.set_optimizer_instance(optimizer)",
    "scheduler": "register it with controller.set_scheduler(StepLR, step_size=...)",
    "verbose": "the controller prints nothing itself: controller.step(score) returns a "
               "decision whose reason says what it did; print(decision.reason)",
    **{name: "the folder of the run files is an argument of the controller (or callback): "
             "GrowthController(model, run_dir=...)"
       for name in ("rundir", "run_directory", "output_dir", "save_dir", "log_dir")},
}
"""Names from other libraries that mean no setting here, with what to do instead."""


def unknown_name_message(name: str, known: Sequence[str], what: str) -> str:
    """'unknown setting X; did you mean Y?' with the closest match."""
    if str(name) in HINTS and what == "setting":
        return f"unknown {what} {name!r}: {HINTS[str(name)]}"
    alias = ALIASES.get(str(name))
    close = alias if alias in known else nearest_name(name, known)
    hint = f"; did you mean {close!r}?" if close else f"; known: {', '.join(sorted(known))}"
    return f"unknown {what} {name!r}{hint}"


def check_choice(cfg: PerforaConfig, name: str, choices: Sequence[str]) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ConfigError(unknown_name_message(value, choices, f"value for {name}:"))
