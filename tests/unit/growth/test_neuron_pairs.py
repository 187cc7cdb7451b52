"""``PerforaConfig(neuron_pairs=...)``: neuron growth for a model whose readers perfora cannot
find by itself (not an nn.Sequential chain, and torch.fx cannot trace it), named by the user
as ``plan_widening``'s ``pairs=`` would be, through the controller, a checkpoint and a
resumed run."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import perfora
from perfora.errors import ConfigError, PerforationError

X = torch.randn(32, 6, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 3, (32,), generator=torch.Generator().manual_seed(2))


class Untraceable(nn.Module):
    """fc1 -> tanh -> fc2, with a data-dependent branch that stops torch.fx."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 4)
        self.fc2 = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        if h.sum() > 1e9:  # never true; fx cannot trace a branch on a tensor's value
            h = h * 2
        return self.fc2(h)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(Untraceable())


def _controller(model: nn.Module, **settings) -> perfora.GrowthController:
    ctl = perfora.GrowthController(model, **{"growth": "neurons", "switch_mode": "every_epoch",
                                             "write_files": False, **settings})
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.build_optimizer()
    return ctl


def _train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(X), Y).backward()
        optimizer.step()


def test_without_pairs_the_refusal_names_the_setting():
    with pytest.raises(PerforationError, match=r"fc1: .*neuron_pairs=\{path: \[reader paths\]\}"):
        _controller(_model())


def test_named_readers_let_the_controller_widen_exactly():
    model = _model()
    ctl = _controller(model, neuron_pairs={"fc1": ["fc2"]})
    _train(model, ctl.optimizer)
    with torch.no_grad():
        before = model(X)
    decision = ctl.step(0.5)
    assert decision.restructured and "neuron step 1" in decision.reason
    model = decision.model
    with torch.no_grad():
        assert torch.equal(model(X), before)  # the output is unchanged, bit for bit
    assert (model.fc1.num_neurons, model.fc2.base.in_features) == (8, 8)
    assert model.fc2.num_neurons == 3  # the model's output layer does not widen
    _train(model, decision.optimizer)  # and the new neurons train
    assert model.fc2.base.weight[:, 4:].abs().sum() > 0


def test_a_checkpoint_of_a_run_with_pairs_resumes_to_the_same_model(tmp_path):
    model = _model()
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   neuron_pairs={"fc1": ["fc2"]}, run_dir=tmp_path)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    optimizer, _ = ctl.build_optimizer()
    _train(model, optimizer)
    decision = ctl.step(0.5)  # a new best: widened
    _train(decision.model, decision.optimizer)
    ctl.step(0.4)  # every epoch grows: the checkpoint holds a model widened twice
    resumed = perfora.resume(_model(), tmp_path / "latest.safetensors")
    assert resumed.config.neuron_pairs == {"fc1": ["fc2"]}
    assert resumed.model.fc1.num_neurons == ctl.model.fc1.num_neurons == 12
    a, b = ctl.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pairs_are_checked_and_kept_json_able():
    config = perfora.PerforaConfig(neuron_pairs={"enc": ("norm", ["out", 16])})
    assert config.neuron_pairs == {"enc": ["norm", ["out", 16]]}
    again = perfora.PerforaConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again.neuron_pairs == config.neuron_pairs
    assert perfora.PerforaConfig(neuron_pairs={"fc1": "fc2"}).neuron_pairs == {"fc1": ["fc2"]}
    for bad, words in [(["fc1", "fc2"], "must map each producer"),
                       ({"": ["fc2"]}, "a producer must be a module path"),
                       ({"fc1": []}, "list its readers"),
                       ({"fc1": [["out", 0]]}, "at least 1"),
                       ({"fc1": [3]}, "a reader is a module path")]:
        with pytest.raises(ConfigError, match=words):
            perfora.PerforaConfig(neuron_pairs=bad)


def test_a_pair_naming_a_missing_module_is_refused_before_training():
    with pytest.raises(PerforationError, match="'fc3' is not a submodule"):
        _controller(_model(), neuron_pairs={"fc1": ["fc3"]})


def test_a_path_with_the_ddp_prefix_is_refused_with_the_path_to_use():
    # paths are the unwrapped model's: DDP's 'module.' prefix is not part of them
    with pytest.raises(PerforationError, match=r"'module.fc1' is not a submodule.*did you mean "
                                               r"'fc1'\?"):
        _controller(_model(), neuron_pairs={"module.fc1": ["module.fc2"]})


@pytest.mark.parametrize(("pairs", "words"), [
    ({"fc1": ["fc2", "fc2"]}, "'fc2' is listed twice"),  # once crashed halfway through a step
    ({"fc1": ["fc1"]}, "cannot read its own outputs"),
])
def test_readers_listed_twice_or_the_producer_itself_are_refused_before_training(pairs, words):
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(PerforationError, match=words):
        _controller(model, neuron_pairs=pairs)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("growth", ["neurons", "auto"])
def test_pairs_for_a_layer_perforate_did_not_wrap_are_refused_not_ignored(growth):
    torch.manual_seed(0)
    model = perfora.perforate(Untraceable(), paths=["fc2"])
    with pytest.raises(PerforationError, match=r"names 'fc1', which perforate did not wrap.*"
                                               r"paths=\[\.\.\., 'fc1'\]"):
        _controller(model, growth=growth, neuron_pairs={"fc1": ["fc2"]})
