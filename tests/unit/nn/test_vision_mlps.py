"""Neuron growth in two Hugging Face vision models that do not trace: LeViT's MLP (a Linear and
a BatchNorm each side of the activation) and PoolFormer's channel MLP (1x1 convs around an
activation and a drop path). The hidden layer widens exactly in eval and training mode (the
drop path active), narrows back, exports, and reloads from ``save_pretrained``; the parts that
write the residual stream or attention's heads are refused with the reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora
from perfora.integrations.transformers import load_grown_pretrained
from perfora.nn.narrowing import narrow_widenings

T = pytest.importorskip("transformers", reason="transformers not installed")

PIXELS = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _build(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "levit":
        model = T.LevitForImageClassification(T.LevitConfig(
            image_size=32, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3],
            depths=[1, 1, 1], key_dim=[8, 8, 8], patch_size=16, num_labels=3))
    else:
        model = T.PoolFormerForImageClassification(T.PoolFormerConfig(
            hidden_sizes=[16, 32, 32, 32], depths=[1, 1, 1, 1], drop_path_rate=0.3,
            num_labels=3))
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return model


def _run(model: nn.Module) -> torch.Tensor:
    torch.manual_seed(7)  # the same drop-path draws on every call
    return model(pixel_values=PIXELS).logits


HIDDEN = {"levit": ("linear_up.linear", "LeViT MLP", 5),
          "poolformer": ("output.conv1", "PoolFormer MLP", 4)}


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", ["levit", "poolformer"])
def test_the_mlp_widens_exactly_narrows_back_and_exports(name, mode):
    model = perfora.perforate(_build(name))
    getattr(model, mode)()
    plan = perfora.plan_widening(model)
    suffix, found_by, count = HIDDEN[name]
    hidden = [p for p in plan.widenable if p.endswith(suffix)]
    assert len(hidden) == count and plan.widenable == hidden
    assert all(plan.layers[p].found_by == found_by for p in hidden)
    reader = plan.layers[hidden[0]].consumers[0][0]
    assert "residual" in plan.refused[reader]
    if name == "levit":  # the attention projections are named as such
        assert "attention projection" in plan.refused[
            "levit.encoder.stages.0.layers.0.module.queries_keys_values.linear"]
    with torch.no_grad():
        before = _run(model)
        for path in hidden:
            perfora.widen(model, path, 5)
        widened = _run(model)
        assert torch.equal(widened, before)
        if mode == "eval":  # the config names no MLP width: the export says so
            with pytest.warns(UserWarning, match="cannot be written into"):
                exported = perfora.export(model).eval()
            assert torch.equal(exported(pixel_values=PIXELS).logits, widened)
        for path in hidden:
            narrow_widenings(model, path, 0)
        assert torch.equal(_run(model), before)
    if name == "levit":
        mlp = model.levit.encoder.stages[0].layers[1].module
        assert mlp.linear_up.batch_norm.num_features == 32  # narrowed back with its layer
    else:
        drop = model.poolformer.encoder.block[0][0].output.drop
        assert type(drop).__name__ == "PoolFormerDropPath"  # left as it was, not split


def test_a_widened_model_reloads_from_save_pretrained(tmp_path):
    for name in ("levit", "poolformer"):
        model = perfora.perforate(_build(name)).eval()
        for path in perfora.plan_widening(model).widenable:
            perfora.widen(model, path, 3)
        with torch.no_grad():  # the new neurons' outgoing weights become live
            for p in model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
            before = _run(model)
        model.save_pretrained(tmp_path / name)
        loaded = load_grown_pretrained(_build(name), tmp_path / name).eval()
        with torch.no_grad():
            assert torch.equal(_run(loaded), before)


def test_a_levit_mlp_that_differs_from_the_pattern_is_refused_with_the_reason():
    model = _build("levit")
    mlp = model.levit.encoder.stages[0].layers[1].module
    mlp.activation = nn.PReLU()
    reason = perfora.plan_widening(model).refused[
        "levit.encoder.stages.0.layers.1.module.linear_up.linear"]
    assert "activation (PReLU) holds parameters" in reason
    mlp = model.levit.encoder.stages[1].layers[1].module
    mlp.linear_up.batch_norm = nn.LayerNorm(64)
    reason = perfora.plan_widening(model).refused[
        "levit.encoder.stages.1.layers.1.module.linear_up.linear"]
    assert "not the LeViT MLP's parts" in reason


def test_the_controller_grows_poolformer_neurons_and_trains_on():
    model = perfora.perforate(_build("poolformer"))
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, neuron_init="random",
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    ctl.build_optimizer()
    labels = torch.tensor([0, 2])
    nn.functional.cross_entropy(model(pixel_values=PIXELS).logits, labels).backward()
    ctl.optimizer.step()
    with torch.no_grad():
        before = _run(model.eval())
    decision = ctl.step(0.5)
    assert decision.restructured and "output.conv1: +" in decision.reason, decision.reason
    grown = decision.model
    with torch.no_grad():
        assert torch.equal(_run(grown.eval()), before)
    grown.train()
    loss = nn.functional.cross_entropy(grown(pixel_values=PIXELS).logits, labels)
    loss.backward()
    decision.optimizer.step()
    conv1 = grown.poolformer.encoder.block[0][0].output.conv1
    assert conv1.source.out_channels == 2 * 64 and torch.isfinite(loss)  # +1 start width
