"""The error-signal recorders record through a torch.compile'd model whose code was compiled
before their hooks went on (dynamo does not guard on empty hook dicts, so that code would run
on without the hooks: no rows, and a neuron step with random rows)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import perfora
from perfora.growth.signal import ErrorSignalProbe


class MLP(nn.Module):
    """A model whose own forward dynamo compiles (a Sequential's is skipped: its frame is a
    wrapper's, and ``Sequential.compile()`` compiles each layer's call apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.act, self.b = nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.act(self.a(x)))


def _compiled(module_compile: bool = False) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = perfora.perforate(
        MLP() if module_compile else
        nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)))
    torch._dynamo.reset()
    if module_compile:  # compiled in place: the frame is MLP.forward
        model.compile(backend="eager")
        return model, model
    return model, torch.compile(model, backend="eager")


def _train_step(run: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    run.train()
    out = run(x)
    F.cross_entropy(out, y).backward()
    return out.detach()


def test_the_probe_records_rows_in_code_compiled_before_it_was_armed():
    model, run = _compiled()
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    _train_step(run, x, y)  # compiled with no hooks on the layers
    probe = ErrorSignalProbe()
    probe.arm(perfora.dendritic_layers(model))
    out = _train_step(run, x, y)
    assert probe.row_count("0") == 16 and probe.row_count("2") == 16
    assert torch.equal(out, model(x).detach())  # the hooks change no output
    probe.disarm()
    probe.clear()
    _train_step(run, x, y)  # the hooks are off again
    assert probe.row_count("0") == 0
    torch._dynamo.reset()


def test_rearming_after_an_epoch_compiled_with_the_hooks_drops_no_code(monkeypatch):
    model, run = _compiled()
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    _train_step(run, x, y)
    resets = []
    real_reset = torch._dynamo.reset_code
    monkeypatch.setattr(torch._dynamo, "reset_code", lambda code: (resets.append(code),
                                                                   real_reset(code)))
    probe = ErrorSignalProbe()
    layers = perfora.dendritic_layers(model)
    probe.arm(layers)
    assert resets  # code made without the hooks goes
    _train_step(run, x, y)
    count = len(resets)
    probe.disarm()
    probe.arm(layers)  # the controller re-arms each epoch a growth step may follow
    assert len(resets) == count
    _train_step(run, x, y)
    assert probe.row_count("0") == 32
    torch._dynamo.reset()


def _neuron_step_reason(module_compile: bool) -> str:
    model, run = _compiled(module_compile)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    _train_step(run, x, y)  # e.g. a first batch, or a sanity check, before the controller
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, write_files=False)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    optimizer, _ = ctl.build_optimizer()
    optimizer.zero_grad()
    _train_step(run, x, y)
    optimizer.step()
    decision = ctl.step(0.5)
    assert decision.restructured
    torch._dynamo.reset()
    return decision.reason


def test_a_compiled_model_widens_with_gradmax_rows():
    assert "gradmax" in _neuron_step_reason(module_compile=False)


def test_a_module_compiled_in_place_widens_with_gradmax_rows():
    assert "gradmax" in _neuron_step_reason(module_compile=True)


def test_arming_under_a_compiled_function_that_runs_the_model_warns_once(monkeypatch):
    # a compiled training step keeps its code (perfora drops only module frames' code); with
    # dynamo's hook guards on, dynamo recompiles it by itself and there is nothing to say
    from perfora.growth import compile_room
    monkeypatch.setattr(compile_room, "_warned", set())
    model, _ = _compiled()
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))

    @torch.compile(backend="eager")
    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        F.cross_entropy(model(x), y).backward()

    train_step(x, y)
    probe = ErrorSignalProbe()
    with pytest.warns(RuntimeWarning, match=r"compiled functions \(train_step\).*"
                                            r"skip_nnmodule_hook_guards = False"):
        probe.arm(perfora.dendritic_layers(model))
    probe.disarm()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probe.arm(perfora.dendritic_layers(model))  # once
    probe.disarm()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
        train_step(x, y)
        probe.arm(perfora.dendritic_layers(model))
        train_step(x, y)
    assert probe.row_count("0") == 16
    torch._dynamo.reset()
