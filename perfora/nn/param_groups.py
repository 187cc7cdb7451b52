"""Which of a dendritic layer's parameters train: five groups, and the base the user froze.

``base`` (the wrapped layer), ``bank`` (the dendrites' own weights), ``cascade`` (``w``),
``out`` (``v``) and ``candidate`` (a dendrite trained apart). Learning rules switch groups on
and off per phase, and a parameter created later (by growth, a resize or a split) starts as
its group is. A base parameter the user froze stays frozen through every phase, growth and
load: that is how dendrites serve as an adapter on a frozen model.
"""

from __future__ import annotations

import torch
from torch import nn

PARAM_GROUPS = ("base", "bank", "cascade", "out", "candidate")


class ParameterGroups:
    """requires_grad per parameter group (mixed into DendriticLayer)."""

    # held by the layer this is mixed into
    base: nn.Module
    cascade: nn.Parameter | None
    out_weight: nn.Parameter | None
    _trainable: dict[str, bool]  # per group: do its parameters train
    frozen_base_names: set[str]  # base parameters the user froze

    def base_frozen(self) -> bool:
        """True when every base parameter was frozen by the user (the adapter use)."""
        names = [n for n, _ in self.base.named_parameters()]
        return bool(names) and all(n in self.frozen_base_names for n in names)

    def remember_frozen_base(self) -> None:
        """Record the base parameters the user has frozen now (skipped while a perfora phase
        freezes the base): read again at every report, so a layer frozen or unfrozen during
        training stays so through growth."""
        if self._trainable["base"]:
            self.frozen_base_names = {n for n, p in self.base.named_parameters()
                                      if not p.requires_grad}

    def set_trainable(self, **groups: bool) -> None:
        """Set requires_grad per group: base, bank, cascade, out (v), candidate."""
        for group, flag in groups.items():
            if group not in PARAM_GROUPS:
                raise ValueError(f"unknown parameter group {group!r}; use {PARAM_GROUPS}")
            self._trainable[group] = bool(flag)
            if group == "base":
                for name, p in self.base.named_parameters():
                    p.requires_grad_(bool(flag) and name not in self.frozen_base_names)
                continue
            for p in self.group_parameters(group):
                p.requires_grad_(bool(flag))

    def group_parameters(self, group: str) -> list[nn.Parameter]:
        """The parameters of one group (base, bank, cascade, out, candidate)."""
        if group == "base":
            return list(self.base.parameters())
        if group == "bank":
            return self._bank_parameters()
        if group == "cascade":
            return [self.cascade] if self.cascade is not None else []
        if group == "out":
            return [self.out_weight] if self.out_weight is not None else []
        if group == "candidate":
            return self._candidate_parameters()
        raise ValueError(f"unknown parameter group {group!r}; use {PARAM_GROUPS}")

    def _new_param(self, data: torch.Tensor, group: str) -> nn.Parameter:
        """A parameter of ``group``, trainable as that group is now, in the memory layout of
        the base weight (a conv model moved to channels_last keeps it for its dendrites)."""
        return nn.Parameter(self._in_base_layout(data), requires_grad=self._trainable[group])

    def _in_base_layout(self, data: torch.Tensor) -> torch.Tensor:
        """``data`` in channels_last(_3d) where the base weight of its rank is."""
        weight = getattr(getattr(self, "source", None), "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() not in (4, 5) \
                or data.dim() != weight.dim() or weight.is_contiguous():
            return data
        layout = torch.channels_last if weight.dim() == 4 else torch.channels_last_3d
        return data.contiguous(memory_format=layout) \
            if weight.is_contiguous(memory_format=layout) else data

    # what each bank kind implements
    def _bank_parameters(self) -> list[nn.Parameter]:
        """The bank group: the dendrites' own weights."""
        raise NotImplementedError

    def _candidate_parameters(self) -> list[nn.Parameter]:
        """The candidate group: the candidate's parameters while it is apart."""
        raise NotImplementedError
