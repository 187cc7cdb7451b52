"""Readers found in the blocks around a layer where the whole model does not trace with
``torch.fx`` (most Hugging Face models branch on their arguments): a feed-forward block whose
own forward traces shows its hidden layer's reader. The layer widens exactly, narrows back and
exports; a layer whose output leaves the traced block, or meets a residual add in it, is
refused with that reason; a dropout the block calls twice stays as it is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora
from perfora.nn.narrowing import narrow_widenings

X = torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(0))


class _MLP(nn.Module):
    """fc1 -> GELU -> dropout -> fc2 -> the same dropout, as many Transformer MLPs run."""

    def __init__(self, width: int = 12, hidden: int = 24) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class _Layer(nn.Module):
    """A residual layer around the MLP: its forward traces."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(12)
        self.mlp = _MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class _Model(nn.Module):
    """Two layers and a head; its forward branches on an argument, so it does not trace."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer(), _Layer()])
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor, keep_all: bool = False) -> torch.Tensor:
        outs = []
        for layer in self.layers:
            x = layer(x)
            outs.append(x)
        if keep_all:
            return torch.stack(outs)
        return self.head(x)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(_Model())


def test_the_mlp_blocks_own_graph_finds_its_reader():
    plan = perfora.plan_widening(_model())
    entry = plan.layers["layers.0.mlp.fc1"]
    assert entry.widenable and entry.found_by == "torch.fx (_MLP)"
    assert entry.consumers == [("layers.0.mlp.fc2", 1)]
    assert entry.through == [("layers.0.mlp.act", -1)]  # the twice-called dropout is left
    # fc2's output leaves the MLP and meets the residual add in the layer around it
    assert "residual connection" in plan.refused["layers.1.mlp.fc2"]
    assert "cannot trace the model" in plan.refused["head"]


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_a_layer_found_in_its_block_widens_exactly_narrows_back_and_exports(mode):
    model = _model()
    getattr(model, mode)()
    for layer in model.layers:
        layer.mlp.drop.p = 0.0 if mode == "train" else 0.1  # no random mask to compare
    with torch.no_grad():
        before = model(X)
        for path in ("layers.0.mlp.fc1", "layers.1.mlp.fc1"):
            perfora.widen(model, path, 5)
        assert torch.equal(model(X), before)
        assert isinstance(model.layers[0].mlp.drop, nn.Dropout)  # not split by neuron
        assert model.layers[0].mlp.fc2.source.in_features == 29
        if mode == "eval":
            assert torch.equal(perfora.export(model).eval()(X), before)
        for path in ("layers.0.mlp.fc1", "layers.1.mlp.fc1"):
            narrow_widenings(model, path, 0)
        assert torch.equal(model(X), before)
    assert model.layers[0].mlp.fc2.source.in_features == 24


def test_pairs_that_leave_out_the_reader_the_blocks_graph_finds_are_refused():
    model = _model()
    plan = perfora.plan_widening(model, pairs={"layers.1.mlp.fc1": ["layers.1.mlp.fc2"]})
    assert plan.layers["layers.1.mlp.fc1"].widenable  # what the block's graph finds too
    # another layer of the right width, not the one that reads fc1's output
    plan = perfora.plan_widening(model, pairs={"layers.1.mlp.fc1": ["layers.0.mlp.fc2"]})
    reason = plan.refused["layers.1.mlp.fc1"]
    assert "leaves out layers.1.mlp.fc2" in reason and "torch.fx (_MLP)" in reason


class _Opaque(nn.Module):
    """A layer whose forward does not trace (it branches on a tensor's value)."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = _MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) if x.sum() > 0 else -self.mlp(x)


def test_an_output_that_leaves_every_traced_block_is_refused_naming_the_block():
    torch.manual_seed(0)
    model = perfora.perforate(nn.ModuleDict({"layer": _Opaque()}))
    plan = perfora.plan_widening(model)
    assert plan.layers["layer.mlp.fc1"].widenable
    reason = plan.refused["layer.mlp.fc2"]
    assert "leaves layer.mlp (_MLP), whose forward traces" in reason and "pairs=" in reason


class _Masked(nn.Module):
    """An MLP with an optional argument that changes what runs: called without it, a
    LayerNorm over the hidden width comes between the layers. A trace gives the argument a
    placeholder (not None), so its graph has no norm: fc1 -> fc2 would look widenable."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(12, 24), nn.LayerNorm(24), nn.Linear(24, 12)

    def forward(self, x: torch.Tensor, skip_norm: bool | None = None) -> torch.Tensor:
        h = self.fc1(x)
        if skip_norm is None:
            h = self.norm(h)
        return self.fc2(h)


def test_a_block_whose_forward_takes_more_than_one_input_is_not_traced():
    torch.manual_seed(0)
    model = perfora.perforate(nn.ModuleDict({"layer": _Opaque()}))
    model["layer"].mlp = perfora.perforate(_Masked())
    reason = perfora.plan_widening(model).refused["layer.mlp.fc1"]
    assert "cannot trace the model" in reason


def test_a_hugging_face_activation_is_followed_in_a_chain_and_applied_by_blocks():
    activations = pytest.importorskip("transformers.activations")
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(12, 16), activations.NewGELUActivation(),
                                            nn.Linear(16, 3)))
    entry = perfora.plan_widening(model).layers["0"]
    assert entry.widenable and entry.consumers == [("2", 1)]
    with torch.no_grad():
        before = model(X)
        perfora.widen(model, "0", 4)
        assert torch.equal(model(X), before)
    assert type(model[1]).__name__ == "Blockwise"


T = pytest.importorskip("transformers", reason="transformers not installed")


def _hf(name: str) -> tuple[nn.Module, dict]:
    torch.manual_seed(0)
    layers = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                  intermediate_size=64)
    ids = {"input_ids": torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    pixels = {"pixel_values": torch.randn(2, 3, 32, 32,
                                          generator=torch.Generator().manual_seed(1))}
    if name == "xlnet":
        return T.XLNetModel(T.XLNetConfig(d_model=32, n_layer=2, n_head=2, d_inner=64,
                                          vocab_size=64)), ids
    if name == "funnel":
        return T.FunnelModel(T.FunnelConfig(d_model=32, n_head=2, d_head=16, d_inner=64,
                                            block_sizes=[1, 1], vocab_size=64)), ids
    if name == "pvt":
        return T.PvtModel(T.PvtConfig(image_size=32, hidden_sizes=[16, 32, 32, 32],
                                      depths=[1, 1, 1, 1],
                                      num_attention_heads=[1, 1, 1, 1])), pixels
    return T.VitDetModel(T.VitDetConfig(image_size=32, pretrain_image_size=32, patch_size=8,
                                        **layers)), pixels


@pytest.mark.parametrize("name, hidden, count", [
    ("xlnet", "layer.0.ff.layer_1", 2),
    ("funnel", "encoder.blocks.0.0.ffn.linear_1", 4), ("pvt", "encoder.block.0.0.mlp.dense1", 4),
    ("vitdet", "encoder.layer.0.mlp.fc1", 2)])
def test_hugging_face_models_that_do_not_trace_gain_neurons_in_their_mlps(name, hidden, count):
    model, inputs = _hf(name)
    model = perfora.perforate(model.eval())
    plan = perfora.plan_widening(model)
    assert hidden in plan.widenable and len(plan.widenable) == count
    assert plan.layers[hidden].found_by.startswith("torch.fx (")
    reader = plan.layers[hidden].consumers[0][0]
    assert not plan.layers[reader].widenable  # it writes the block's output
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        for path in plan.widenable:
            perfora.widen(model, path, 3)
        assert torch.equal(model(**inputs).last_hidden_state, before)
