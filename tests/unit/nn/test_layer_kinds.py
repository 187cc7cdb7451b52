"""The three bank kinds (Linear, Conv, generic modules): ``DendriticLayer(module, ...)`` builds
the class of the module's kind, and the kinds keep what checkpoints rely on: the state dict's
keys, their order and shapes, the parameter order optimizers see, the module tree and the
per-layer specs saved with a checkpoint, recorded here for one small model that holds every
kind, partial sets, a grouped conv, a norm group and candidates trained apart."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import perfora
from perfora import ConversionError, DendriticLayer
from perfora.nn import ConvDendriticLayer, GenericDendriticLayer, LinearDendriticLayer
from perfora.nn.layers import bank_kind
from perfora.nn.perforation import layer_specs


class EveryKind(nn.Module):
    """One layer of each kind perfora wraps (no forward: only the structure is checked)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.c1 = nn.Conv1d(2, 3, 3)
        self.c2 = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3))
        self.c3 = nn.Conv3d(2, 4, 3, groups=2, bias=False)
        self.norm = nn.LayerNorm(3)
        self.emb = nn.Embedding(5, 3)


def grown_model() -> nn.Module:
    torch.manual_seed(0)
    model = EveryKind()
    perfora.perforate(model, types=(nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.LayerNorm,
                                    nn.Embedding),
                      neuron_axes={"LayerNorm": -1, "Embedding": -1}, num_neurons={"norm": 3},
                      groups=[("c2.0", "c2.1")])
    layers = perfora.dendritic_layers(model)
    gen = torch.Generator().manual_seed(1)
    layers["fc"].grow(gen)
    layers["fc"].grow(gen, neurons=[0, 2])
    layers["c1"].grow(gen)
    layers["c1"].grow(gen)
    layers["c1"].split_candidate()
    for _ in range(3):
        layers["c2.0"].grow(gen)
    for _ in range(2):
        layers["c3"].grow(gen)
        layers["norm"].grow(gen)
    layers["emb"].grow(gen)
    layers["emb"].split_candidate()
    return model


STATE = [
    ("fc.bank_weight", (5, 4)), ("fc.bank_bias", (5,)), ("fc.cascade", (1, 3)),
    ("fc.out_weight", (2, 3)), ("fc.dendrite_mask", (2, 3)), ("fc.base.weight", (3, 4)),
    ("fc.base.bias", (3,)),
    ("c1.bank_weight", (6, 2, 3)), ("c1.bank_bias", (6,)), ("c1.out_weight", (2, 3)),
    ("c1.base.weight", (3, 2, 3)), ("c1.base.bias", (3,)), ("c1.cascade", (1, 3)),
    ("c2.0.bank_weight", (9, 2, 3, 3)), ("c2.0.bank_bias", (9,)), ("c2.0.cascade", (3, 3)),
    ("c2.0.out_weight", (3, 3)), ("c2.0.base.0.weight", (3, 2, 3, 3)),
    ("c2.0.base.0.bias", (3,)), ("c2.0.base.1.weight", (3,)), ("c2.0.base.1.bias", (3,)),
    ("c2.0.base.1.running_mean", (3,)), ("c2.0.base.1.running_var", (3,)),
    ("c2.0.base.1.num_batches_tracked", ()),
    ("c3.bank_weight", (8, 1, 3, 3, 3)), ("c3.cascade", (1, 4)), ("c3.out_weight", (2, 4)),
    ("c3.base.weight", (4, 1, 3, 3, 3)),
    ("norm.cascade", (1, 3)), ("norm.out_weight", (2, 3)), ("norm.base.weight", (3,)),
    ("norm.base.bias", (3,)), ("norm.bank_params.bias", (2, 3)),
    ("norm.bank_params.weight", (2, 3)),
    ("emb.out_weight", (1, 3)), ("emb.base.weight", (5, 3)),
    ("emb.bank_params.weight", (1, 5, 3)),
]
PARAMETERS = [
    "fc.bank_weight", "fc.bank_bias", "fc.cascade", "fc.out_weight", "fc.base.weight",
    "fc.base.bias",
    "c1.bank_weight", "c1.bank_bias", "c1.out_weight", "c1.candidate_weight",
    "c1.candidate_bias", "c1.candidate_cascade", "c1.base.weight", "c1.base.bias",
    "c2.0.bank_weight", "c2.0.bank_bias", "c2.0.cascade", "c2.0.out_weight",
    "c2.0.base.0.weight", "c2.0.base.0.bias", "c2.0.base.1.weight", "c2.0.base.1.bias",
    "c3.bank_weight", "c3.cascade", "c3.out_weight", "c3.base.weight",
    "norm.cascade", "norm.out_weight", "norm.base.weight", "norm.base.bias",
    "norm.bank_params.bias", "norm.bank_params.weight",
    "emb.out_weight", "emb.base.weight", "emb.candidate_params.weight",
]
MODULES = [
    "", "fc", "fc.base", "fc.bank_params", "fc.candidate_params",
    "c1", "c1.base", "c1.bank_params", "c1.candidate_params",
    "c2", "c2.0", "c2.0.base", "c2.0.base.0", "c2.0.base.1", "c2.0.bank_params",
    "c2.0.candidate_params", "c2.1",
    "c3", "c3.base", "c3.bank_params", "c3.candidate_params",
    "norm", "norm.base", "norm.bank_params", "norm.candidate_params",
    "emb", "emb.base", "emb.bank_params", "emb.candidate_params",
]


def _spec(kind: str, base_type: str, dendrites: int, neurons: int, axis: int,
          sets: list[list[int]] | None = None, grouped_with: str | None = None) -> dict:
    """One layer's spec, its keys in the order checkpoints write them."""
    return {"num_dendrites": dendrites, "num_neurons": neurons, "neuron_axis": axis,
            "activation": "sigmoid", "grouped": grouped_with is not None, "kind": kind,
            "base_type": base_type, **({"neurons": sets} if sets is not None else {}),
            "grouped_with": grouped_with}


SPECS = {
    "fc": _spec("linear", "Linear", 2, 3, -1, sets=[[0, 1, 2], [0, 2]]),
    "c1": _spec("conv", "Conv1d", 2, 3, 1),
    "c2.0": _spec("conv", "Conv2d", 3, 3, 1, grouped_with="c2.1"),
    "c3": _spec("conv", "Conv3d", 2, 4, 1),
    "norm": _spec("generic", "LayerNorm", 2, 3, -1),
    "emb": _spec("generic", "Embedding", 1, 3, -1),
}


def test_state_dict_keys_order_and_shapes_are_unchanged():
    state = grown_model().state_dict()
    assert [(key, tuple(t.shape)) for key, t in state.items()] == STATE


def test_parameter_order_and_module_tree_are_unchanged():
    model = grown_model()
    assert [name for name, _ in model.named_parameters()] == PARAMETERS
    assert [name for name, _ in model.named_modules()] == MODULES


def test_layer_specs_are_unchanged():
    specs = layer_specs(grown_model())
    assert specs == SPECS
    assert [list(spec) for spec in specs.values()] == [list(spec) for spec in SPECS.values()]


# --------------------------------------------------------------------------- one class per kind
@pytest.mark.parametrize(("base", "kind_class", "grouped"), [
    (nn.Linear(4, 3), LinearDendriticLayer, False),
    (nn.modules.linear.NonDynamicallyQuantizableLinear(4, 3), LinearDendriticLayer, False),
    (nn.Conv1d(2, 3, 3), ConvDendriticLayer, False),
    (nn.Conv2d(2, 4, 3, groups=2), ConvDendriticLayer, False),
    (nn.Conv3d(2, 3, 3), ConvDendriticLayer, False),
    (nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)), ConvDendriticLayer, True),
    (nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3)), LinearDendriticLayer, True),
    (nn.LayerNorm(3), GenericDendriticLayer, False),
    (nn.Embedding(5, 3), GenericDendriticLayer, False),
    (nn.ConvTranspose1d(2, 3, 3), GenericDendriticLayer, False),
], ids=lambda v: v if isinstance(v, bool) else type(v).__name__)
def test_dendritic_layer_builds_the_class_of_its_bank_kind(base, kind_class, grouped):
    layer = DendriticLayer(base, num_neurons=3, neuron_axis=1, grouped=grouped)
    assert type(layer) is kind_class and isinstance(layer, DendriticLayer)
    assert layer.kind == kind_class.kind == bank_kind(layer.source)
    assert layer.structure()["kind"] == layer.kind
    assert type(copy.deepcopy(layer)) is kind_class


def test_the_public_names_are_one_class():
    assert perfora.DendriticLayer is perfora.nn.DendriticLayer is DendriticLayer
    assert issubclass(LinearDendriticLayer, DendriticLayer)
    assert {cls.kind for cls in (LinearDendriticLayer, ConvDendriticLayer,
                                 GenericDendriticLayer)} == {"linear", "conv", "generic"}


def test_a_kind_class_refuses_a_module_of_another_kind():
    with pytest.raises(ConversionError, match="LinearDendriticLayer cannot hold a Conv2d"):
        LinearDendriticLayer(nn.Conv2d(2, 3, 3), num_neurons=3, neuron_axis=1)
    layer = ConvDendriticLayer(nn.Conv2d(2, 3, 3), num_neurons=3, neuron_axis=1)
    assert type(layer) is ConvDendriticLayer
