"""Rule 'gd': after each addition, dendrites and neurons train together by backprop."""

from __future__ import annotations

from collections.abc import Mapping

from ..nn.layers import DendriticLayer
from .base import LearningRule


class GradientDescentRule(LearningRule):
    """Everything trains in every epoch: base weights, dendrite bank, cascade w and v."""

    name = "gd"

    def apply(self, layers: Mapping[str, DendriticLayer]) -> None:
        for layer in layers.values():
            layer.set_trainable(base=True, bank=True, cascade=True, out=True)
