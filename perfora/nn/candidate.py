"""The newest dendrite trained apart from the bank: the correlation rule's *candidate*.

:meth:`CandidateApart.split_candidate` moves it out of the bank into parameters of its own,
so it can train while the bank stays frozen, and :meth:`CandidateApart.merge_candidate` puts
it back, bit for bit. The state dict always holds the merged form (:func:`merged_state_hook`),
so checkpoints do not depend on the split. Each bank kind says how its bank rows are cut and
joined again (``_split_bank``, ``_merged_bank``, ``_take_merged_bank``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..errors import PerforationError

CANDIDATE_NAMES = ("candidate_weight", "candidate_bias", "candidate_cascade")
"""The candidate's own parameters besides ``candidate_params`` (a generic bank's)."""


class CandidateApart:
    """Split the newest dendrite off the bank and merge it back (mixed into DendriticLayer)."""

    # held by the layer this is mixed into
    num_dendrites: int
    has_candidate: bool
    dendrite_mask: torch.Tensor | None
    cascade: nn.Parameter | None
    out_weight: nn.Parameter | None
    candidate_cascade: nn.Parameter | None
    candidate_params: nn.ParameterDict
    _new_param: Callable[[torch.Tensor, str], nn.Parameter]  # a parameter of a group

    @property
    def banked(self) -> int:
        """Dendrites in the bank (all of them, less a candidate trained apart)."""
        return self.num_dendrites - int(self.has_candidate)

    def split_candidate(self) -> None:
        """Move the newest dendrite out of the bank into candidate parameters of its own.

        Its ``v`` row must still be zero: it stays in ``out_weight`` (unused while apart, so
        the parameter count does not change). :meth:`merge_candidate` undoes this exactly.
        """
        if self.has_candidate:
            return
        k = self.num_dendrites
        if k == 0:
            raise PerforationError("split_candidate() on a layer without dendrites; grow one "
                                   "first")
        if self.dendrite_mask is not None:
            raise PerforationError("split_candidate(): the correlation rule trains full "
                                   "dendrite sets; it cannot be combined with selective growth "
                                   "(grow_fraction < 1)")
        if bool(self.out_weight[k - 1].detach().ne(0).any()):
            raise PerforationError("split_candidate(): the newest dendrite already feeds the "
                                   "output (nonzero v row); a candidate must be split right "
                                   "after grow(), before v trains")
        with torch.no_grad():
            self._split_bank(k)
            if k >= 2:
                rows, old_pairs = self.cascade.detach(), (k - 1) * (k - 2) // 2
                self.candidate_cascade = self._new_param(rows[old_pairs:].clone(), "candidate")
                self.cascade = (self._new_param(rows[:old_pairs].clone(), "cascade")
                                if old_pairs else None)
        self.has_candidate = True

    def merge_candidate(self) -> None:
        """Put the candidate back into the bank as the newest dendrite (exact)."""
        if not self.has_candidate:
            return
        merged = self._merged_tensors()
        self._take_merged_bank(merged)
        if "cascade" in merged:
            self.cascade = self._new_param(merged["cascade"], "cascade")
        self._drop_candidate()

    def _drop_candidate(self) -> None:
        for name in CANDIDATE_NAMES:
            setattr(self, name, None)
        self.candidate_params = nn.ParameterDict()
        self.has_candidate = False

    def _merged_tensors(self) -> dict[str, torch.Tensor]:
        """Bank and cascade with the candidate merged back (new tensors, by local name)."""
        k = self.banked
        with torch.no_grad():
            out = self._merged_bank(k)
            if k >= 1:
                rows = self.candidate_cascade.detach()
                out["cascade"] = (rows.clone() if self.cascade is None
                                  else torch.cat([self.cascade.detach(), rows]))
        return out

    # what each bank kind implements
    def _split_bank(self, k: int) -> None:
        """Cut the newest of k dendrites out of the bank into the candidate's parameters."""
        raise NotImplementedError

    def _merged_bank(self, k: int) -> dict[str, torch.Tensor]:
        """The bank of k dendrites with the candidate appended (new tensors, by local name)."""
        raise NotImplementedError

    def _take_merged_bank(self, merged: dict[str, torch.Tensor]) -> None:
        """Make the bank tensors of ``merged`` (from :meth:`_merged_bank`) the bank again."""
        raise NotImplementedError


def merged_state_hook(module: CandidateApart, state_dict: dict, prefix: str,
                      local_metadata: dict) -> None:
    """state_dict post-hook: a layer with a candidate apart saves the merged bank."""
    if not module.has_candidate:
        return
    apart = (*CANDIDATE_NAMES, "candidate_params")
    for key in [k for k in state_dict if k.startswith(prefix)]:
        if key[len(prefix):].split(".", 1)[0] in apart:
            del state_dict[key]
    for name, tensor in module._merged_tensors().items():
        state_dict[prefix + name] = tensor
