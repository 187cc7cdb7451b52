"""Layers that need no controller: the dendritic layer (one class per bank kind: Linear, Conv,
generic modules) and its kernels, attention routing, wrapping a model's layers
(:func:`perforate`) and exporting a grown model as plain PyTorch."""

from .conv import ConvDendriticLayer
from .export import export
from .generic import GenericDendriticLayer
from .layers import DendriticLayer, dendritic_layers, unwrap_model
from .linear import LinearDendriticLayer
from .perforation import ConversionReport, describe, perforate

__all__ = ["ConversionReport", "ConvDendriticLayer", "DendriticLayer", "GenericDendriticLayer",
           "LinearDendriticLayer", "dendritic_layers", "describe", "export", "perforate",
           "unwrap_model"]
