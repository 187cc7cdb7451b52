"""In-process restructure under FSDP1 (``FullyShardedDataParallel`` through
``perfora.wrap_fsdp1``): 2 real CPU ranks (gloo, FileStore), compared with DDP."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_ddp import batch, make_model, run_ranks, train_epoch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

import perfora
from perfora.errors import ConversionError
from perfora.parallel import wrap_ddp, wrap_fsdp1
from perfora.parallel.sharded_state import full_state_dict

CPU = torch.device("cpu")


def grow_and_train(rank: int, tmp: Path, kind: str) -> dict:
    """Three growth steps and the completion's rewind; the full state after every epoch."""
    base = make_model(seed=5)
    model = wrap_fsdp1(base, device_id=CPU) if kind == "fsdp1" else wrap_ddp(base)
    ctl = perfora.GrowthController(model, switch_mode="fixed", fixed_switch_num=1,
                                   max_dendrites=3, retain_all_dendrites=True,
                                   run_dir=tmp / kind, growth="dendrites")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    states, kinds = [], []
    for epoch in range(4):
        train_epoch(model, opt, rank, epoch)
        root = model if kind == "fsdp1" else perfora.unwrap_model(model)
        states.append({k: v.tolist() for k, v in full_state_dict(root).items()})
        decision = ctl.step(0.5 + epoch, model=model)
        model, opt = decision.model, decision.optimizer
        kinds.append(type(model).__name__)
    return {"states": states, "wrappers": kinds, "params": ctl.parameter_count(),
            "dendrites": ctl.num_dendrites, "complete": ctl.completed}


@pytest.mark.timeout(200)
def test_fsdp1_restructures_match_ddp_exactly(tmp_path):
    ddp = run_ranks(grow_and_train, tmp_path / "ddp", "ddp")
    fsdp = run_ranks(grow_and_train, tmp_path / "fsdp1", "fsdp1")
    for rank in range(2):
        assert fsdp[rank]["wrappers"] == ["FullyShardedDataParallel"] * 4
        assert fsdp[rank]["dendrites"] == 3 and fsdp[rank]["complete"]
        assert fsdp[rank]["params"] == ddp[rank]["params"]  # the full count, not a shard
        for a, b in zip(ddp[rank]["states"], fsdp[rank]["states"]):
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(torch.tensor(a[key]), torch.tensor(b[key])), key
    # checkpoint_format='auto': a sharded model on 2 ranks writes DCP folders
    assert (tmp_path / "fsdp1" / "fsdp1" / "best.dcp" / "perfora.json").exists()


def restructure_in_eval_mode(rank: int, tmp: Path, growth: str) -> dict:
    """A model with BatchNorm and Dropout, trained on this rank's data, then put in eval mode
    before the controller's step: the step must keep the mode and this rank's statistics."""
    torch.manual_seed(0)
    model = wrap_fsdp1(perfora.perforate(nn.Sequential(
        nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3))),
        device_id=CPU)
    ctl = perfora.GrowthController(model, growth=growth, switch_mode="every_epoch",
                                   write_files=False, neuron_init="random")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    model.train()
    for step in range(3):
        x, y = batch(rank, 0, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    model.eval()
    x_fixed = torch.randn(8, 6, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        before = model(x_fixed)
    stats = full_state_dict(model)["1.running_mean"].clone()
    decision = ctl.step(0.5)
    with torch.no_grad():
        after = decision.model(x_fixed)
    return {"reason": decision.reason, "exact": bool(torch.equal(after, before)),
            "eval": not any(m.training for m in decision.model.modules()),
            "stats_kept": bool(torch.equal(
                full_state_dict(decision.model)["1.running_mean"][:8], stats)),
            "stats": stats.tolist()}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("growth", ["dendrites", "neurons"])
def test_a_restructure_keeps_eval_mode_and_each_rank_s_batchnorm_statistics(tmp_path, growth):
    r0, r1 = run_ranks(restructure_in_eval_mode, tmp_path, growth)
    assert r0["reason"] == r1["reason"] and r0["reason"].startswith("plateau: added")
    for r in (r0, r1):  # each rank's own outputs, unchanged; was: train mode, rank 0's stats
        assert r["eval"] and r["stats_kept"] and r["exact"]
    assert r0["stats"] != r1["stats"]  # the ranks' own data gave them their own statistics


def test_wrap_fsdp1_refuses_what_it_cannot_re_wrap():
    model = make_model(seed=0)
    with pytest.raises(ConversionError, match="auto_wrap_policy"):
        wrap_fsdp1(model, auto_wrap_policy=lambda *a, **k: True)
    with pytest.raises(ConversionError, match="perforate"):
        wrap_fsdp1(torch.nn.Linear(2, 2))
    assert not isinstance(model, FullyShardedDataParallel)


def _adam_run(model: nn.Module, run_dir: Path, fmt: str, write_files: bool = True
              ) -> perfora.GrowthController:
    """A controller with Adam that saves ``latest`` every epoch (as ``fmt``) and does not
    grow."""
    ctl = perfora.GrowthController(model, max_dendrites=0, run_dir=run_dir,
                                   write_files=write_files, growth="dendrites",
                                   checkpoint_format=fmt)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    return ctl


def adam_uninterrupted(rank: int, tmp: Path, fmt: str) -> dict:
    """Four epochs with Adam; ``latest`` is saved after the second."""
    model = wrap_fsdp1(make_model(seed=9), device_id=CPU)
    ctl = _adam_run(model, tmp / "run", fmt)
    opt, _ = ctl.build_optimizer()
    for epoch in range(4):
        train_epoch(model, opt, rank, epoch)
        if epoch == 1:
            decision = ctl.step(0.5, model=model)
            model, opt = decision.model, decision.optimizer
            suffix = ".dcp" if fmt == "dcp" else ".safetensors"
            if rank == 0:
                (tmp / "run" / f"latest{suffix}").rename(tmp / f"mid{suffix}")
    return {k: v.tolist() for k, v in full_state_dict(model).items()}


def adam_resumed(rank: int, tmp: Path, fmt: str, fresh: bool) -> dict:
    """A new process group: resume from ``mid`` and train the last two epochs (with
    ``fresh``, a new optimizer replaces the loaded one: the control)."""
    model = wrap_fsdp1(make_model(seed=123), device_id=CPU)
    ctl = _adam_run(model, tmp / "resumed", fmt, write_files=False)
    decision = ctl.load(tmp / ("mid.dcp" if fmt == "dcp" else "mid.safetensors"))
    model, opt = decision.model, decision.optimizer
    if fresh:
        opt, _ = ctl.build_optimizer()
    for epoch in (2, 3):
        train_epoch(model, opt, rank, epoch)
    return {k: v.tolist() for k, v in full_state_dict(model).items()}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("fmt", ["dcp", "file"])
def test_fsdp1_adam_moments_are_saved_and_a_resumed_run_equals_the_uninterrupted_one(
        tmp_path, fmt):
    first = run_ranks(adam_uninterrupted, tmp_path, fmt)
    assert (tmp_path / ("mid.dcp/perfora.json" if fmt == "dcp" else "mid.safetensors")
            ).is_file()
    resumed = run_ranks(adam_resumed, tmp_path, fmt, False)
    fresh = run_ranks(adam_resumed, tmp_path, fmt, True)
    for rank in range(2):
        a, b, c = first[rank], resumed[rank], fresh[rank]
        assert a.keys() == b.keys() == c.keys()
        diffs = [(torch.tensor(a[k]) - torch.tensor(b[k])).abs().max().item() for k in a]
        assert max(diffs) <= 1e-6, diffs
        # the control: without the saved moments the same steps end elsewhere
        control = [(torch.tensor(a[k]) - torch.tensor(c[k])).abs().max().item() for k in a]
        assert max(control) > 1e-3
