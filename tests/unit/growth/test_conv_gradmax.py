"""GradMax for convolutions (``conv_gradmax=True``): the recorded matrix M gives, for any new
incoming kernel w, the loss gradient on the reader's new zero weights (M @ w), for a conv
reader and for a Linear after a flatten; the controller grows conv layers along M's top
directions, and by default (off) with random rows, recording nothing for them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora
from perfora.growth.conv_signal import conv_pair
from perfora.nn.widening import gradmax_rows, plan_widening, widen

X = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def _new_column_grad(model: nn.Module, reader: str, weights: torch.Tensor, repeat: int
                     ) -> torch.Tensor:
    """The gradient of sum(output * weights) on the reader's newest input columns, as rows."""
    model.zero_grad()
    (model(X) * weights).sum().backward()
    grad = model.get_submodule(reader).weight.grad
    if isinstance(model.get_submodule(reader), nn.Linear):
        return grad[:, -repeat:].reshape(-1)
    return grad[:, -1:].reshape(-1)


@pytest.mark.parametrize("between, reader, tail, repeat", [
    (nn.Identity(), nn.Conv2d(5, 4, 3, padding=1), None, 1),
    (nn.AvgPool2d(2), nn.Conv2d(5, 4, 3, stride=2, padding="valid"), None, 1),
    (nn.BatchNorm2d(5).eval(), nn.Conv2d(5, 4, 1), None, 1),
    (nn.Identity(), nn.Linear(5 * 8 * 8, 4), nn.Flatten(), 64),
    (nn.AdaptiveAvgPool2d(2), nn.Linear(5 * 4, 4), nn.Flatten(), 4),
], ids=["conv", "avgpool-strided-conv", "batchnorm-1x1", "flatten-linear", "pool-flatten-linear"])
def test_the_matrix_gives_the_gradient_on_the_new_zero_weights(between, reader, tail, repeat):
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 5, 3, padding=1, dilation=1), between]
    layers += [tail, reader] if tail is not None else [reader]
    model = nn.Sequential(*layers)
    path, reader_path = "0", str(len(layers) - 1)
    entry = plan_widening(model).layers[path]
    pair = conv_pair(model, entry)
    rows = 4 * (repeat if tail is not None else reader.weight[0, 0].numel())
    assert pair is not None and pair.shape() == (rows, 27)
    with torch.no_grad():
        out = model(X)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    matrix, samples = pair.matrix(X, weights)  # g = weights: the loss is sum(out * weights)
    assert samples == X.shape[0]
    w = torch.randn(1, 27, generator=torch.Generator().manual_seed(2))
    widen(model, path, 1, init=w)
    with torch.no_grad():
        assert torch.equal(model(X), out)  # still exact
    got = _new_column_grad(model, reader_path, weights, repeat)
    assert torch.allclose(got, matrix @ w[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layers", [
    [nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(),
     nn.Conv2d(5, 4, 3, padding=1, padding_mode="reflect")],
    [nn.Conv2d(3, 5, 3, padding=1, padding_mode="circular"), nn.ReLU(), nn.Conv2d(5, 4, 1)],
    [nn.Conv2d(3, 5, 2, padding="same"), nn.ReLU(), nn.Conv2d(5, 4, 1)],
    [nn.Conv2d(3, 5, 3, padding=1), nn.MaxPool2d(2, dilation=2), nn.Conv2d(5, 4, 1)],
], ids=["reflect-reader", "circular-producer", "same-even-kernel", "dilated-maxpool"])
def test_a_conv_the_estimate_cannot_follow_grows_random_rows(layers):
    model = nn.Sequential(*layers)
    entry = plan_widening(model).layers["0"]
    assert entry.widenable and conv_pair(model, entry) is None


@pytest.mark.parametrize("x, g", [
    (X[0], torch.zeros(4, 8, 8)),  # an unbatched input
    (X, torch.zeros(5, 4, 8, 8)),  # the gradient of another batch
    (torch.zeros(6, 2, 8, 8), torch.zeros(6, 4, 8, 8)),  # a producer since changed
    (X, torch.zeros(6, 3, 8, 8)),  # a reader since changed
], ids=["unbatched", "other-batch", "producer-changed", "reader-changed"])
def test_a_pass_whose_shapes_do_not_fit_gives_no_matrix(x, g):
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(), nn.Conv2d(5, 4, 3, padding=1))
    pair = conv_pair(model, plan_widening(model).layers["0"])
    assert pair is not None and pair.matrix(x, g) is None


def test_a_linear_reader_whose_flattened_size_changed_gives_no_matrix():
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.Flatten(), nn.Linear(5 * 64, 4))
    pair = conv_pair(model, plan_widening(model).layers["0"])
    assert pair is not None and pair.matrix(X, torch.zeros(6, 4)) is not None
    small = X[:, :, :4, :4]  # 16 positions, where the reader was planned for 64
    assert pair.matrix(small, torch.zeros(6, 4)) is None
    assert pair.matrix(X, torch.zeros(6, 4, 1)) is None  # not one row per sample


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 16, 3)))


def test_the_controller_grows_conv_layers_along_the_recorded_error():
    model = _cnn()
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, write_files=False, conv_gradmax=True)
    ctl.set_optimizer(torch.optim.SGD, lr=0.0)  # the recorded pass's model is the grown one
    opt, _ = ctl.build_optimizer()
    pair = conv_pair(model, plan_widening(model).layers["3"])
    kept = {}
    handle = model[3].register_forward_hook(lambda m, a, out: kept.update(x=a[0].detach()))
    out = model(X)
    handle.remove()
    out.retain_grad()
    nn.functional.cross_entropy(out, y).backward()
    want, _ = pair.matrix(kept["x"], out.grad)
    opt.step()
    model.eval()
    with torch.no_grad():
        before = model(X)
    decision = ctl.step(0.5)
    assert "0: +4 gradmax" in decision.reason and "3: +4 gradmax" in decision.reason
    with torch.no_grad():
        assert torch.equal(decision.model(X), before)
    new_kernels = decision.model[3].source.weight[4:].detach()
    assert not new_kernels[:, 4:].any()  # layer 0's new channels: zero columns, read later
    new_rows = new_kernels[:, :4].reshape(4, -1).double()
    expected = gradmax_rows(want.double(), 4, 1.0)
    cosines = (new_rows * expected).sum(1) / (new_rows.norm(dim=1) * expected.norm(dim=1))
    assert torch.allclose(cosines.abs(), torch.ones(4, dtype=torch.float64), atol=1e-4)


def test_by_default_conv_layers_grow_random_rows_and_record_nothing():
    model = _cnn()
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, write_files=False)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    opt, _ = ctl.build_optimizer()
    assert ctl._signal is not None and not ctl._signal.paths  # armed, but no conv recorded
    nn.functional.cross_entropy(model(X), torch.tensor([0, 1, 2, 0, 1, 2])).backward()
    opt.step()
    decision = ctl.step(0.5)
    assert "0: +4 random" in decision.reason and "3: +4 random" in decision.reason
