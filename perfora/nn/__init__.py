"""Layers that need no controller: the dendritic layer and its kernels, attention routing,
wrapping a model's layers (:func:`perforate`) and exporting a grown model as plain PyTorch."""

from .export import export
from .layers import DendriticLayer, dendritic_layers, unwrap_model
from .perforation import ConversionReport, describe, perforate

__all__ = ["ConversionReport", "DendriticLayer", "dendritic_layers", "describe", "export",
           "perforate", "unwrap_model"]
