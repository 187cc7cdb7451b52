"""perfora.export: a plain PyTorch copy of a grown model, equal in outputs, loadable without
perfora, and accepted by torch.export and ONNX."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import perfora


class _StandardizedConv(nn.Conv2d):
    """A Conv2d whose forward standardizes its weight first (BiT's): the class's forward is
    the base's computation; its dendrites run the plain conv, live and exported alike."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True)
                                                          + 1e-5)
        return self._conv_forward(x, w, self.bias)


class _ScaledLinear(nn.Linear):
    """A Linear subclass whose forward does more than the linear map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


KINDS = {
    "subclasses": (lambda: nn.Sequential(_StandardizedConv(3, 4, 3), nn.ReLU(), nn.Flatten(),
                                         _ScaledLinear(64, 3)),
                   lambda: torch.randn(2, 3, 6, 6), {}),
    "linear": (lambda: nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)),
               lambda: torch.randn(4, 2, 5), {}),
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(3, 6, 3, padding=1), nn.Conv1d(6, 2, 3)),
               lambda: torch.randn(2, 3, 9), {}),
    "conv2d-grouped": (lambda: nn.Sequential(nn.Conv2d(4, 6, 3, groups=2, padding=1,
                                                       padding_mode="reflect")),
                       lambda: torch.randn(2, 4, 6, 6), {}),
    "conv3d": (lambda: nn.Sequential(nn.Conv3d(2, 4, 2)), lambda: torch.randn(1, 2, 4, 4, 4), {}),
    "conv+norm": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
                  lambda: torch.randn(2, 3, 6, 6), {"group_norms": True}),
    "generic-last-axis": (lambda: nn.Sequential(nn.LayerNorm(6)), lambda: torch.randn(3, 6),
                          {"types": (nn.LayerNorm,), "neuron_axes": {"LayerNorm": -1},
                           "num_neurons": {"0": 6}}),
    "generic-axis-1": (lambda: nn.Sequential(nn.BatchNorm1d(4)), lambda: torch.randn(3, 4, 5),
                       {"types": (nn.BatchNorm1d,), "neuron_axes": {"BatchNorm1d": 1}}),
}


def _grown(kind: str, k: int, selective: bool, activation: str = "sigmoid"):
    build, data, options = KINDS[kind]
    torch.manual_seed(1)
    model = perfora.perforate(build(), activation=activation, **options)
    generator = torch.Generator().manual_seed(0)
    for _ in range(k):
        for layer in perfora.dendritic_layers(model).values():
            neurons = None
            if selective and layer.supports_partial_sets():
                chosen = torch.randperm(layer.num_neurons, generator=generator)
                neurons = sorted(chosen[:max(1, layer.num_neurons // 2)].tolist())
            layer.grow(generator, neurons=neurons)
    with torch.no_grad():  # trained-looking v and w rows, so every dendrite counts
        for layer in perfora.dendritic_layers(model).values():
            for p in layer.group_parameters("out") + layer.group_parameters("cascade"):
                p.normal_(generator=generator)
    return model.eval(), data()


def _needed_parameters(model: nn.Module) -> int:
    """What the computation uses: base layers, bank rows, and per set only the fed v/w."""
    total = 0
    for name, p in model.named_parameters():
        if name.split(".")[-1] not in ("out_weight", "cascade"):
            total += p.numel()
    for layer in perfora.dendritic_layers(model).values():
        sets = layer.set_neurons() or [range(layer.num_neurons)] * layer.num_dendrites
        total += sum(len(s) for s in sets)  # v: one entry per fed neuron
        total += sum(len(sets[i]) for i in range(len(sets)) for _ in range(i))  # w rows
    return total


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_export_equals_the_perforated_model_for_every_kind_and_k(kind):
    for k in range(4):
        for selective in (False, True):
            model, x = _grown(kind, k, selective)
            exported = perfora.export(model)
            with torch.no_grad():
                expected, got = model(x), exported(x)
            assert torch.allclose(got, expected, atol=1e-6, rtol=0), (kind, k, selective)
            classes = {type(m).__module__ for m in exported.modules()}
            assert not any(c.startswith("perfora") for c in classes), classes
            assert sum(p.numel() for p in exported.parameters()) == _needed_parameters(model)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_export_keeps_the_activation(activation):
    model, x = _grown("linear", 2, False, activation)
    with torch.no_grad():
        assert torch.allclose(perfora.export(model)(x), model(x), atol=1e-6, rtol=0)


def test_export_leaves_the_model_unchanged_and_its_state_dict_is_portable():
    model, x = _grown("conv+norm", 2, True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first, second = perfora.export(model), perfora.export(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert perfora.dendritic_layers(model)  # still perforated
    with torch.no_grad():
        for p in second.parameters():
            p.zero_()
    second.load_state_dict(first.state_dict())
    with torch.no_grad():
        assert torch.equal(second(x), first(x))


def test_exported_model_loads_and_runs_without_perfora(tmp_path):
    model, x = _grown("linear", 3, True)
    exported = perfora.export(model)
    with torch.no_grad():
        expected = exported(x)
    (tmp_path / "model.pkl").write_bytes(pickle.dumps(exported))
    torch.save(x, tmp_path / "x.pt")
    script = (
        "import sys, pickle, torch\n"
        "sys.modules['perfora'] = None  # any import of perfora now fails\n"
        f"m = pickle.loads(open({str(tmp_path / 'model.pkl')!r}, 'rb').read())\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        "with torch.no_grad():\n"
        f"    torch.save(m(x), {str(tmp_path / 'y.pt')!r})\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert torch.equal(torch.load(tmp_path / "y.pt"), expected)


def test_torch_export_works_on_the_exported_and_the_live_model():
    model, x = _grown("conv+norm", 2, True)
    with torch.no_grad():
        expected = model(x)
        for target in (perfora.export(model), model):
            program = torch.export.export(target, (x,))
            assert torch.allclose(program.module()(x), expected, atol=1e-6, rtol=0)


def test_onnx_export_agrees_with_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    model, x = _grown("linear", 2, True)
    exported = perfora.export(model)
    torch.onnx.export(exported, (x,), str(tmp_path / "m.onnx"), dynamo=True, verbose=False)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(got), model(x), atol=1e-5, rtol=0)


def test_export_refuses_a_routed_attention_projection_with_dendrites():
    model = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True))
    perfora.perforate(model, paths=["0.self_attn.out_proj"])
    exported = perfora.export(model)  # no dendrites yet: a plain MultiheadAttention again
    assert type(exported[0].self_attn) is nn.MultiheadAttention
    perfora.dendritic_layers(model)["0.self_attn.out_proj"].grow(torch.Generator())
    with pytest.raises(perfora.ConversionError, match="out_proj.weight"):
        perfora.export(model)


def test_exported_transformer_runs_in_eval_without_the_fused_path_reading_weights():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = perfora.perforate(nn.Sequential(nn.TransformerEncoder(layer, 2)))
    for dendritic in perfora.dendritic_layers(model).values():
        dendritic.grow(torch.Generator().manual_seed(0))
        with torch.no_grad():
            dendritic.out_weight.fill_(0.3)
    model.eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert torch.allclose(perfora.export(model)(x), model(x), atol=1e-6)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_exported_model_runs_under_autocast_like_the_live_model(kind):
    # selective sets add their d with index_add, which refuses a bf16 output and float32 v
    # rows: the exported code promotes as the live layer does
    for selective in (False, True):
        model, x = _grown(kind, 2, selective)
        exported = perfora.export(model)
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            expected, got = model(x), exported(x)
        assert got.dtype == expected.dtype, (kind, selective)
        assert torch.allclose(got.float(), expected.float(), atol=2e-2, rtol=2e-2), \
            (kind, selective, (got.float() - expected.float()).abs().max())
        with torch.no_grad():  # and float32 outside autocast, as before
            assert torch.allclose(exported(x), model(x), atol=1e-6, rtol=0), (kind, selective)


def test_safetensors_state_dict_loads_into_a_fresh_export_of_the_same_structure(tmp_path):
    # the route docs/export.md recommends for files from others: weights as data only,
    # loaded into a module built from your own code with perfora.export
    model, x = _grown("linear", 3, True)
    exported = perfora.export(model)
    save_file(exported.state_dict(), str(tmp_path / "model.safetensors"))
    rebuilt, _ = _grown("linear", 3, True)  # the same structure (seeded set choices) ...
    with torch.no_grad():
        for p in rebuilt.parameters():  # ... with other weights
            p.add_(1.0)
    fresh = perfora.export(rebuilt)
    with torch.no_grad():
        assert not torch.equal(fresh(x), exported(x))
    fresh.load_state_dict(load_file(str(tmp_path / "model.safetensors")))
    with torch.no_grad():
        assert torch.equal(fresh(x), exported(x))
        assert torch.allclose(fresh(x), model(x), atol=1e-6, rtol=0)


def test_torch_export_program_saves_and_loads_as_pt2(tmp_path):
    model, x = _grown("conv+norm", 2, True)
    exported = perfora.export(model)
    with torch.no_grad():
        expected = exported(x)
        torch.export.save(torch.export.export(exported, (x,)), str(tmp_path / "model.pt2"))
        loaded = torch.export.load(str(tmp_path / "model.pt2")).module()
        assert torch.allclose(loaded(x), expected, atol=1e-6, rtol=0)
        assert torch.allclose(loaded(x), model(x), atol=1e-6, rtol=0)


def test_export_of_a_widened_model_is_plain_torch_and_equal():
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                                            nn.Flatten(), nn.Linear(4 * 4 * 4, 5), nn.GELU(),
                                            nn.Linear(5, 2)))
    g = torch.Generator().manual_seed(0)
    for layer in perfora.dendritic_layers(model).values():
        layer.grow(g)
    perfora.widen(model, "0", 2)
    perfora.widen(model, "4", 3)
    plain = perfora.export(nn.Sequential(nn.Linear(3, 5), nn.SiLU(), nn.Linear(5, 2)))
    perfora.widen(plain, "0", 2)
    for exported, live, x in ((perfora.export(model), model.eval(), torch.randn(2, 3, 6, 6)),
                              (perfora.export(plain), plain.eval(), torch.randn(4, 3))):
        assert torch.allclose(exported(x), live(x), atol=1e-6)
        names = {type(m).__module__ for m in exported.modules()}
        assert not any(n.startswith("perfora") for n in names), names
    assert type(perfora.export(plain)[0]) is nn.Linear
    assert perfora.export(plain)[0].weight.shape == (7, 3)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_growth_under_autocast_keeps_the_outputs_dtype_and_bits(kind):
    build, data, options = KINDS[kind]
    torch.manual_seed(1)
    model = perfora.perforate(build(), **options)
    x = data()
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        before = model(x)
        for layer in perfora.dendritic_layers(model).values():
            layer.grow(torch.Generator().manual_seed(0))
        after = model(x)
    assert after.dtype == before.dtype  # it used to turn float32 from the first set on
    assert torch.equal(after, before)


class _CachingBias(nn.Module):
    """Caches a tensor computed from its parameter in eval mode, as LeViT's attention does."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)
        self.bias = nn.Parameter(torch.randn(5))
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.fc(x) + self.bias * 2
        if "bias" not in self.cache:
            self.cache["bias"] = self.bias * 2  # keeps its autograd history
        return self.fc(x) + self.cache["bias"]


def test_export_copies_a_model_whose_forward_cached_a_tensor_with_gradient_history():
    # deepcopy raised "Only Tensors created explicitly by the user (graph leaves) support the
    # deepcopy protocol", so a LeViT evaluated with gradients on could not be exported
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(_CachingBias(), nn.Tanh(), nn.Linear(5, 2))).eval()
    perfora.dendritic_layers(model)["0.fc"].grow(torch.Generator().manual_seed(0))
    x = torch.randn(3, 5)
    live = model(x)
    assert model[0].cache["bias"].grad_fn is not None
    exported = perfora.export(model)
    assert torch.allclose(exported(x), live, atol=1e-6)
    assert exported[0].cache["bias"].grad_fn is None
    assert model[0].cache["bias"].grad_fn is not None  # the live model is left as it was
