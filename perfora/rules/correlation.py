"""Rule 'correlation': open Perforated Backpropagation, in the manner of Cascade-Correlation.

After every addition a *dendrite phase* trains only the new dendrite of each layer (its
weights and its cascade row to the older dendrites). Everything else is frozen, the new
dendrite is not in the output (its ``v`` row is zero) and it sees detached inputs, so the
network's function does not change and no error flows through it. Its gradient comes from a
tap on the layer output: the identity in forward; in backward it receives the neuron error
``E = dL/dy`` and gives the candidate ``d`` the gradient of ``-sum_o |cov(d_o, E_o / std(E_o))|``
(per neuron, over the batch and every non-neuron axis). The user's own ``loss.backward()``
and ``optimizer.step()`` thus maximise the correlation. The phase ends on a plateau of the
mean correlation score (``correlation_patience``, ``correlation_threshold``) or at a cap
relative to the neuron phase before it (``correlation_max_epochs_ratio``); the candidates are
then merged into the bank and frozen, and the *neuron phase* trains the neurons and ``v``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..checkpoint.schema import (
    MAX_COUNT,
    check_dict,
    check_int,
    check_list,
    check_number,
    check_optional,
    check_str,
    fail,
)
from ..distributed.collectives import all_reduce_values, is_distributed
from ..nn.layers import DendriticLayer
from .base import LearningRule, RuleStep
from .moments import abs_correlation

DENDRITE = "dendrite"


def _batch_terms(d: torch.Tensor, err: torch.Tensor, axis: int):
    """Per-neuron flattened d and E, the standardized centred error E^, and cov(d, E^)."""
    n = d.shape[axis]
    dtype = torch.promote_types(d.dtype, torch.float32)  # statistics in fp32 at least
    dm = d.movedim(axis, -1).reshape(-1, n).to(dtype)
    em = err.movedim(axis, -1).reshape(-1, n).to(dtype)
    ec = em - em.mean(0)
    e_std = ec.square().mean(0).sqrt()
    positive = e_std > 0
    inv_e = torch.where(positive, 1.0 / torch.where(positive, e_std, 1.0), 0.0)
    e_hat = ec * inv_e
    cov = ((dm - dm.mean(0)) * e_hat).mean(0)
    return dm, em, e_hat, cov


def _to_shape(grad: torch.Tensor, like: torch.Tensor, axis: int) -> torch.Tensor:
    moved = like.movedim(axis, -1).shape
    return grad.reshape(moved).movedim(-1, axis).to(like.dtype)


def _pearson(moments: torch.Tensor) -> torch.Tensor:
    """|corr| per neuron from summed moments [count, Sd, Se, Sdd, See, Sde]."""
    return abs_correlation(moments)


def _moments(dm: torch.Tensor, em: torch.Tensor) -> torch.Tensor:
    dm, em = dm.double(), em.double()
    count = torch.full_like(dm[0], dm.shape[0])
    return torch.stack([count, dm.sum(0), em.sum(0), dm.square().sum(0), em.square().sum(0),
                        (dm * em).sum(0)])


def correlation_gradient(d: torch.Tensor, err: torch.Tensor,
                         axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of ``-sum_o |cov(d_o, E_o / std E_o)|`` w.r.t. ``d``, and |corr(d_o, E_o)|.

    ``axis`` indexes neurons; statistics run over every other axis (batch, positions).
    """
    dm, em, e_hat, cov = _batch_terms(d, err, axis)
    grad = -torch.sign(cov) * e_hat / dm.shape[0]
    return _to_shape(grad, d, axis), _pearson(_moments(dm, em)).to(dm.dtype)


class _Tap(torch.autograd.Function):
    """Identity on the layer output; in backward, the correlation gradient for the candidate."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, d: torch.Tensor, tap: CorrelationTap) -> torch.Tensor:
        ctx.save_for_backward(d)
        ctx.tap = tap
        # a copy, not a view: autograd forbids in-place changes to a custom Function's view
        # output, and a ReLU(inplace=True) after the layer is common
        return out.clone()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (d,) = ctx.saved_tensors
        return grad_out, ctx.tap.gradient(d, grad_out), None


class CorrelationTap:
    """One layer's tap: gives its candidate the correlation gradient and sums statistics.

    The sign of each neuron's covariance comes from a running mean over batches (``trend``),
    as Cascade-Correlation takes it over the whole epoch: a per-batch sign would reward
    fitting each batch's noise. The epoch score is the correlation from summed moments.
    """

    momentum = 0.9

    def __init__(self, axis: int) -> None:
        self.axis = axis
        self.trend: torch.Tensor | None = None
        self.moments: torch.Tensor | None = None

    def __call__(self, out: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return _Tap.apply(out, d, self)

    def gradient(self, d: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
        """The candidate's gradient for one backward pass; updates trend and moments."""
        if d.numel() == 0:  # an empty batch: its mean would put NaN into the trend for good
            return torch.zeros_like(d)
        dm, em, e_hat, cov = _batch_terms(d, err, self.axis)
        if self.trend is None or self.trend.shape != cov.shape:
            self.trend = cov.detach().clone()
        else:
            self.trend = self.momentum * self.trend.to(cov) + (1 - self.momentum) * cov
        grad = -torch.sign(self.trend) * e_hat / dm.shape[0]
        batch = _moments(dm.detach(), em)
        self.moments = batch if self.moments is None else self.moments + batch
        return _to_shape(grad, d, self.axis)

    def take(self) -> float:
        """Mean |corr| over neurons since the last take (nan if none); resets the sums."""
        moments, self.moments = self.moments, None
        return score_of(moments)

    def state(self) -> list[float] | None:
        """The running covariance trend, JSON-able (exact for float32 values)."""
        return None if self.trend is None else [float(v) for v in self.trend.float()]

    def load(self, trend: list[float] | None, device: torch.device | None) -> None:
        self.trend = None if trend is None else torch.tensor(trend, dtype=torch.float32,
                                                             device=device)
        self.moments = None


def score_of(moments: torch.Tensor | None) -> float:
    """Mean |corr| over neurons from summed moments (nan when nothing was summed)."""
    if moments is None or float(moments[0].sum()) == 0:
        return math.nan
    return float(_pearson(moments).mean())


def reduce_moments(moments: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sum each layer's moments over ranks (one all-reduce), so every rank decides alike."""
    if not moments or not is_distributed():
        return moments
    flat = torch.cat([m.reshape(-1) for m in moments]).double()
    flat = all_reduce_values(flat, "sum")
    return list(flat.cpu().split([m.numel() for m in moments]))


class CorrelationRule(LearningRule):
    """Dendrite phase (only new dendrites train, on correlation) then neuron phase."""

    name = "correlation"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.neuron_epochs = 0
        self.cap = 1
        self.dendrite_epochs = 0
        self.best: float | None = None
        self.since_best = 0
        self.scores: dict[str, float] = {}
        self.frozen_outside: list[str] = []
        self._taps: dict[str, CorrelationTap] = {}
        self._model: nn.Module | None = None

    # ------------------------------------------------------------------ phases
    def bind_model(self, model: nn.Module) -> None:
        """Let the rule also freeze parameters outside the wrapped layers in a dendrite phase."""
        self._model = model

    def apply(self, layers: Mapping[str, DendriticLayer]) -> None:
        dendrite = self.phase == DENDRITE
        for path, layer in layers.items():
            if dendrite and layer.num_dendrites and not layer.has_candidate:
                layer.split_candidate()
            elif not dendrite and layer.has_candidate:
                layer.merge_candidate()
            layer.set_trainable(base=not dendrite, bank=False, cascade=False,
                                out=not dendrite, candidate=dendrite)
            if dendrite:
                tap = self._taps.get(path)
                if tap is None or tap.axis != layer.neuron_axis:
                    tap = self._taps[path] = CorrelationTap(layer.neuron_axis)
                layer.candidate_tap = tap
            else:
                layer.candidate_tap = None
        self._apply_outside(dendrite)

    def _apply_outside(self, dendrite: bool) -> None:
        """Freeze (dendrite phase) or restore the trainable parameters outside the layers."""
        if self._model is None:
            return
        from ..nn.layers import unwrap_model

        inner = unwrap_model(self._model)
        inside = {id(p) for m in inner.modules() if isinstance(m, DendriticLayer)
                  for p in m.parameters()}
        named = {name: p for name, p in inner.named_parameters() if id(p) not in inside}
        if dendrite:
            for name, p in named.items():
                if p.requires_grad:
                    p.requires_grad_(False)
                    if name not in self.frozen_outside:
                        self.frozen_outside.append(name)
        else:
            for name in self.frozen_outside:
                if name in named:
                    named[name].requires_grad_(True)
            self.frozen_outside = []

    def after_growth(self, layers: Mapping[str, DendriticLayer]) -> None:
        if self.phase != DENDRITE:  # (an addition during a dendrite phase keeps its cap)
            self.cap = max(1, math.ceil(self.config.correlation_max_epochs_ratio *
                                        self.neuron_epochs))
        self.phase = DENDRITE
        self.neuron_epochs = self.dendrite_epochs = self.since_best = 0
        self.best = None
        self.scores = {}
        self._taps = {}
        self.apply(layers)

    def end_epoch(self, score: float, layers: Mapping[str, DendriticLayer]) -> RuleStep:
        if self.phase != DENDRITE:
            self.neuron_epochs += 1
            self.scores = {}
            return RuleStep()
        self.dendrite_epochs += 1
        self.scores = {}
        paths = sorted(layers)
        moments = []
        for path in paths:
            tap, n = self._taps.get(path), layers[path].num_neurons
            summed = tap.moments if tap is not None else None
            moments.append(summed.double().cpu() if summed is not None
                           else torch.zeros(6, n, dtype=torch.float64))
            if tap is not None:
                tap.moments = None
        for path, summed in zip(paths, reduce_moments(moments), strict=True):
            self.scores[path] = score_of(summed.reshape(6, -1))
        finite = [v for v in self.scores.values() if math.isfinite(v)]
        mean = sum(finite) / len(finite) if finite else math.nan
        if math.isfinite(mean) and (self.best is None or
                                    mean > self.best * (1 + self.config.correlation_threshold)):
            self.best, self.since_best = mean, 0
        else:
            self.since_best += 1
        if self.since_best >= self.config.correlation_patience:
            reason = (f"dendrite phase: correlation plateaued at {self.best:.4g}" if self.best
                      is not None else "dendrite phase: no correlation measured")
        elif self.dendrite_epochs >= self.cap:
            reason = f"dendrite phase: reached its cap of {self.cap} epoch(s)"
        else:
            return RuleStep(handled=True, reason="dendrite phase: new dendrites train on "
                            "correlation with the neuron error")
        self.phase = self.neuron_phase
        self.apply(layers)
        return RuleStep(handled=True, trainables_changed=True,
                        reason=f"{reason}; dendrites frozen, neuron phase")

    # ------------------------------------------------------------------ reporting
    def metrics(self) -> dict[str, float]:
        if not self.scores:
            return {}
        finite = [v for v in self.scores.values() if math.isfinite(v)]
        out = {"corr": sum(finite) / len(finite) if finite else math.nan}
        out.update({f"corr/{path}": v for path, v in self.scores.items()})
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "neuron_epochs": self.neuron_epochs, "cap": self.cap,
                "dendrite_epochs": self.dendrite_epochs, "best": self.best,
                "since_best": self.since_best,
                "scores": {k: (v if math.isfinite(v) else None) for k, v in self.scores.items()},
                "frozen_outside": list(self.frozen_outside),
                "trends": {path: tap.state() for path, tap in self._taps.items()}}

    @classmethod
    def validate_state(cls, data: Any, where: str = "rule",
                       structure: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The phase, the phase counters, the scores and one trend per neuron of each layer."""
        data = super().validate_state(data, where, structure)
        for key in ("neuron_epochs", "dendrite_epochs", "since_best"):
            check_optional(data, key, where, check_int)
        check_optional(data, "cap", where, check_int, 1, MAX_COUNT)
        check_optional(data, "best", where, check_number, optional=True)
        for path, score in check_dict(data.get("scores", {}), f"{where}.scores").items():
            check_number(score, f"{where}.scores[{path!r}]", finite=False, optional=True)
        for i, name in enumerate(check_list(data.get("frozen_outside", []),
                                            f"{where}.frozen_outside")):
            check_str(name, f"{where}.frozen_outside[{i}]")
        for path, trend in check_dict(data.get("trends", {}), f"{where}.trends").items():
            at = f"{where}.trends[{path!r}]"
            if trend is None:
                continue
            for i, value in enumerate(check_list(trend, at)):
                check_number(value, f"{at}[{i}]", finite=False)
            if structure is not None:
                spec = structure.get(path)
                if spec is None:
                    raise fail(at, "the trend of a layer in the structure", path)
                if len(trend) != spec["num_neurons"]:
                    raise fail(at, f"one value per neuron ({spec['num_neurons']})", trend)
        return data

    def load_state_dict(self, state: Mapping[str, Any],
                        layers: Mapping[str, DendriticLayer]) -> None:
        self.neuron_epochs = int(state.get("neuron_epochs", 0))
        self.cap = int(state.get("cap", 1))
        self.dendrite_epochs = int(state.get("dendrite_epochs", 0))
        self.best = state.get("best")
        self.since_best = int(state.get("since_best", 0))
        self.scores = {k: (math.nan if v is None else float(v))
                       for k, v in state.get("scores", {}).items()}
        self.frozen_outside = list(state.get("frozen_outside", []))
        self._taps = {}
        super().load_state_dict(state, layers)
        for path, trend in state.get("trends", {}).items():
            if path in self._taps:
                ref = next(iter(layers[path].parameters()), None)
                self._taps[path].load(trend, None if ref is None else ref.device)
