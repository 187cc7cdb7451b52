"""Dendrites of any other module (norms, embeddings, your own blocks): each parameter of the
module stacked on a new first axis, the K dendrites evaluated by one ``torch.func.vmap`` call
of the module with those parameters. Sets always feed every neuron; no fused node."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .layers import DendriticLayer


def _key(name: str) -> str:
    """A parameter's dotted name as a key of the bank's ParameterDict (no dots allowed)."""
    return name.replace(".", "__")


class GenericDendriticLayer(DendriticLayer):
    """A wrapped module of any other type (its neuron axis given) with its dendrite bank."""

    kind = "generic"

    def _param_names(self) -> list[str]:
        """The source's parameter names, in the order functional_call takes them."""
        return [n for n, _ in self.source.named_parameters()]

    # ------------------------------------------------------------------ the bank
    def _bank_key(self, name: str) -> str | None:
        return _key(name)

    def _new_bank(self, k: int, kw: dict[str, Any]) -> None:
        self.bank_params = nn.ParameterDict({
            _key(name): self._new_param(torch.zeros(k, *p.shape, **kw), "bank")
            for name, p in self.source.named_parameters()})

    def _append_bank(self, new: dict[str, torch.Tensor], k: int) -> None:
        old = dict(self.bank_params.items())
        self.bank_params = nn.ParameterDict({
            key: self._new_param(
                torch.cat([old[key].detach(), t.unsqueeze(0)]) if key in old
                else t.unsqueeze(0), "bank")
            for key, t in new.items()})

    def _bank_parameters(self) -> list[nn.Parameter]:
        return list(self.bank_params.values())

    # ------------------------------------------------------------------ candidate
    def _split_bank(self, k: int) -> None:
        old = {key: p.detach() for key, p in self.bank_params.items()}
        self.bank_params = nn.ParameterDict(
            {key: self._new_param(t[:k - 1].clone(), "bank") for key, t in old.items()}
            if k > 1 else {})
        self.candidate_params = nn.ParameterDict(
            {key: self._new_param(t[k - 1].clone(), "candidate") for key, t in old.items()})

    def _merged_bank(self, k: int) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for key, c in self.candidate_params.items():
            row = c.detach().unsqueeze(0)
            out[f"bank_params.{key}"] = (torch.cat([self.bank_params[key].detach(), row])
                                         if key in self.bank_params else row.clone())
        return out

    def _take_merged_bank(self, merged: dict[str, torch.Tensor]) -> None:
        cut = len("bank_params.")
        self.bank_params = nn.ParameterDict(
            {name[cut:]: self._new_param(t, "bank") for name, t in merged.items()
             if name.startswith("bank_params.")})

    def _candidate_parameters(self) -> list[nn.Parameter]:
        return list(self.candidate_params.values())

    def _candidate_pre(self, x: torch.Tensor) -> torch.Tensor:
        params = {name: self.candidate_params[_key(name)] for name in self._param_names()}
        return torch.func.functional_call(self.source, params, (x,))

    # ------------------------------------------------------------------ forward
    def _bank_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """D_k(x) for every k: one vmap over the stacked parameters."""
        params = {name: self.bank_params[_key(name)] for name in self._param_names()}

        def call(p: dict[str, torch.Tensor], inp: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(self.source, p, (inp,))

        # "different": a Dropout inside draws its own mask per dendrite, as K calls would
        stacked = torch.func.vmap(call, in_dims=(0, None), randomness="different")(params, x)
        return list(stacked.unbind(0))
