"""Single-process parts of the distributed layer: DataParallel re-wrap, sampler epochs, DDP args."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import perfora
from perfora.distributed import set_epoch, structure_fingerprint
from perfora.parallel import wrapper_spec
from tests.support.paths import ROOT


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


def test_dataparallel_is_rewrapped_with_its_arguments_and_output_is_unchanged():
    dp = nn.DataParallel(make_model(), dim=0)
    ctl = perfora.GrowthController(dp, switch_mode="every_epoch", max_dendrites=2)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    ctl.build_optimizer()
    x = torch.randn(5, 4)
    before = dp(x).detach()
    decision = ctl.step(1.0, model=dp)
    assert decision.restructured
    new = decision.model
    assert isinstance(new, nn.DataParallel) and new is not dp
    assert new.module is dp.module
    assert getattr(new, "dim", 0) == getattr(dp, "dim", 0) and new.device_ids == dp.device_ids
    assert torch.equal(new(x), before)  # growth is function-preserving
    trainable = {id(p) for p in new.module.parameters() if p.requires_grad}
    in_opt = {id(p) for g in decision.optimizer.param_groups for p in g["params"]}
    assert in_opt == trainable  # the optimizer covers the new dendrites of the inner module


def test_bare_module_stays_bare():
    model = make_model()
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=2)
    decision = ctl.step(1.0, model=model)
    assert decision.restructured and decision.model is model
    assert wrapper_spec(model) is None


def test_step_with_a_wrapper_adopts_it():
    """A controller made for the bare module returns a wrapper once it is given one."""
    model = make_model()
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=2)
    dp = nn.DataParallel(model)
    decision = ctl.step(1.0, model=dp)
    assert isinstance(decision.model, nn.DataParallel) and decision.model is not dp


def test_fingerprint_tracks_dendrites_and_trainable_flags():
    model = make_model()
    fp0 = structure_fingerprint(model)
    perfora.dendritic_layers(model)["0"].grow(torch.Generator().manual_seed(0))
    fp1 = structure_fingerprint(model)
    assert fp0["dendrites"] == {"0": 0, "2": 0} and fp1["dendrites"] == {"0": 1, "2": 0}
    perfora.dendritic_layers(model)["2"].set_trainable(base=False)
    assert structure_fingerprint(model) != fp1


def test_set_epoch_reshuffles_distributed_sampler():
    data = TensorDataset(torch.arange(40))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    assert set_epoch(loader, 0) == 1
    first = [int(v) for (b,) in loader for v in b]
    set_epoch([loader], 1)
    second = [int(v) for (b,) in loader for v in b]
    assert first != second  # without set_epoch every epoch repeats the same order
    set_epoch(sampler, 0)
    assert [int(v) for (b,) in loader for v in b] == first


def test_init_from_env_without_torchrun_is_single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    assert perfora.distributed.init_from_env() == (0, 1, 0)


def test_wrap_ddp_refuses_init_sync_false():
    with pytest.raises(perfora.PerforaError, match="init_sync"):
        perfora.parallel.wrap_ddp(make_model(), init_sync=False)


def test_readme_ddp_example_compiles_and_uses_public_names():
    """The DDP loop in the docs (run by hand under torchrun) uses only existing names."""
    import ast
    import re

    page = (ROOT / "docs" / "distributed.md").read_text()
    section = page.split("## DDP, in-process", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    tree = ast.parse(block)
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "perfora"}
    assert used and all(hasattr(perfora, name) for name in used)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "perfora.distributed" for alias in node.names}
    assert imported and all(hasattr(perfora.distributed, name) for name in imported)
