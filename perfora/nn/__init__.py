"""Layers that need no controller: the dendritic layer (one class per bank kind: Linear, Conv,
generic modules) and its kernels, attention routing, wrapping a model's layers
(:func:`perforate`), growing neurons (:func:`plan_widening`, :func:`widen`, computed block by
block in :mod:`perfora.nn.blocks`) and exporting a grown model as plain PyTorch."""

from .consumers import LayerPlan, WideningPlan, plan_widening
from .conv import ConvDendriticLayer
from .export import export
from .generic import GenericDendriticLayer
from .layers import DendriticLayer, dendritic_layers, unwrap_model
from .linear import LinearDendriticLayer
from .perforation import ConversionReport, describe, perforate
from .widening import gradmax_init, widen

__all__ = ["ConversionReport", "ConvDendriticLayer", "DendriticLayer", "GenericDendriticLayer",
           "LinearDendriticLayer", "dendritic_layers", "describe", "export", "perforate",
           "unwrap_model", "LayerPlan", "WideningPlan", "plan_widening", "widen",
           "gradmax_init"]
