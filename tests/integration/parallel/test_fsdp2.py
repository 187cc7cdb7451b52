"""In-process restructure under FSDP2 (``fully_shard``): 2 real CPU ranks (gloo, FileStore).

perfora gathers the full state on every rank, grows an unsharded copy, broadcasts rank 0's
values and shards again with the user's arguments. Every test has a timeout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_ddp import WORLD, batch, make_model, run_ranks, train_epoch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

import perfora
from perfora.checkpoint.dcp import read_dcp
from perfora.checkpoint.format import load_checkpoint
from perfora.parallel import shard_fsdp2
from perfora.parallel.sharded_state import (
    full_state_dict,
    gather_optimizer_state,
    shard_optimizer_state,
)


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.detach().reshape(-1).float() for _, v in sorted(state.items())])


def full_rank_diff(model: torch.nn.Module) -> float:
    """Largest difference of any gathered full tensor between the ranks (0.0 in sync)."""
    flat = _flat(full_state_dict(model))
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


def _probe() -> torch.Tensor:
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(99))


def grow_under_fsdp2(rank: int, tmp: Path, settings: dict) -> dict:
    """Ranks start from different weights and grow with different seeds (seed = rank)."""
    reference = make_model(seed=100)  # rank 0's initial model
    mesh = init_device_mesh("cpu", (WORLD,))
    model = shard_fsdp2(make_model(seed=100 + rank), mesh=mesh, reshard_after_forward=False)
    start = full_state_dict(model)
    start_diff = max((start[k] - v).abs().max().item()
                     for k, v in reference.state_dict().items())
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=3,
                                   retain_all_dendrites=True, seed=rank, write_files=False,
                                   growth="dendrites", **settings)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    opt, _ = ctl.build_optimizer()
    out_change, all_dtensor, kwargs_kept, new_models = [], [], [], []
    for epoch in range(2):
        train_epoch(model, opt, rank, epoch)
        with torch.no_grad():
            before = model(_probe())
        decision = ctl.step(1.0, model=model)
        assert decision.restructured
        new_models.append(decision.model is not model)
        model, opt = decision.model, decision.optimizer
        all_dtensor.append(all(isinstance(p, DTensor) for p in model.parameters()))
        with torch.no_grad():
            after = model(_probe())
        out_change.append((after - before).abs().max().item())
        kwargs_kept.append(ctl.backend.kwargs.get("reshard_after_forward"))
    grown = _flat(full_state_dict(model))
    for epoch in range(2, 4):
        train_epoch(model, opt, rank, epoch)
    trained = _flat(full_state_dict(model))
    return {"start_diff": start_diff, "out_change": out_change, "all_dtensor": all_dtensor,
            "kwargs_kept": kwargs_kept, "new_models": new_models,
            "dendrites": ctl.num_dendrites, "rank_diff": full_rank_diff(model),
            "trained_change": (trained - grown).abs().max().item(),
            "fed": {p: layer.set_neurons()
                    for p, layer in sorted(perfora.dendritic_layers(model).items())}}


SELECTIVE = {"grow_fraction": 0.5, "dendrite_init": "error", "candidate_steps": 10}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("settings", [{}, SELECTIVE], ids=["full_sets", "selective_error"])
def test_fsdp2_restructure_reshards_and_ranks_stay_identical(tmp_path, settings):
    results = run_ranks(grow_under_fsdp2, tmp_path, settings)
    assert results[0]["fed"] == results[1]["fed"]
    if settings:
        assert [len(fed) for fed in results[0]["fed"]["0"]] == [4, 4]
    for r in results:
        assert r["start_diff"] == 0.0, "shard_fsdp2 must broadcast rank 0's initial values"
        assert r["dendrites"] == 2 and r["new_models"] == [True, True]
        assert r["all_dtensor"] == [True, True], "new dendrite parameters must be sharded"
        assert r["kwargs_kept"] == [False, False]
        assert max(r["out_change"]) < 1e-5, "growth must not change the outputs"
        assert r["rank_diff"] == 0.0
        assert r["trained_change"] > 0.0
    assert results[0]["out_change"] == pytest.approx(results[1]["out_change"])


def save_under_fsdp2(rank: int, tmp: Path) -> dict:
    """Grow at epoch 2, save right after it (on every rank), train 2 more epochs."""
    mesh = init_device_mesh("cpu", (WORLD,))
    model = shard_fsdp2(make_model(seed=5), mesh=mesh)
    ctl = perfora.GrowthController(model, switch_mode="fixed", fixed_switch_num=2,
                                   max_dendrites=3, retain_all_dendrites=True,
                                   run_dir=tmp / "run")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    for epoch in range(2):
        train_epoch(model, opt, rank, epoch)
        decision = ctl.step(0.5 + epoch, model=model)
    assert decision.restructured  # the optimizer is new: its moments start from zero
    model, opt = decision.model, decision.optimizer
    ctl.save(tmp / "after_restructure.safetensors")
    for epoch in range(2, 4):
        train_epoch(model, opt, rank, epoch)
    return {"state": _flat(full_state_dict(model)).tolist(), "dendrites": ctl.num_dendrites,
            "switch_epochs": ctl.state.switch_epochs}


def resume_under_fsdp2(rank: int, tmp: Path) -> dict:
    """A new process group: a fresh model with other weights, sharded, then load."""
    mesh = init_device_mesh("cpu", (WORLD,))
    model = shard_fsdp2(make_model(seed=77), mesh=mesh)
    ctl = perfora.GrowthController(model, switch_mode="fixed", fixed_switch_num=2,
                                   max_dendrites=3, retain_all_dendrites=True,
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    decision = ctl.load(tmp / "after_restructure.safetensors")
    model, opt = decision.model, decision.optimizer
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    for epoch in range(2, 4):
        train_epoch(model, opt, rank, epoch)
    return {"state": _flat(full_state_dict(model)).tolist(), "dendrites": ctl.num_dendrites,
            "switch_epochs": ctl.state.switch_epochs, "sharded": sharded}


@pytest.mark.timeout(200)
def test_fsdp2_checkpoint_after_restructure_resumes_in_new_process_group(tmp_path):
    first = run_ranks(save_under_fsdp2, tmp_path)
    assert (tmp_path / "after_restructure.safetensors").exists()
    assert (tmp_path / "run" / "switch_1.dcp").is_dir()  # 'auto': DCP folders under FSDP2
    resumed = run_ranks(resume_under_fsdp2, tmp_path)
    for a, b in zip(first, resumed):
        assert b["sharded"]
        assert a["dendrites"] == b["dendrites"] == 1
        assert a["switch_epochs"] == b["switch_epochs"]
        assert torch.allclose(torch.tensor(a["state"]), torch.tensor(b["state"]), atol=1e-6)
    assert resumed[0]["state"] == resumed[1]["state"]


def rewind_under_fsdp2(rank: int, tmp: Path) -> dict:
    """The dendrite set fails to beat the best score: the end rewinds to the best model."""
    mesh = init_device_mesh("cpu", (WORLD,))
    model = shard_fsdp2(make_model(seed=9), mesh=mesh)
    ctl = perfora.GrowthController(model, maximize=True, switch_mode="fixed",
                                   fixed_switch_num=1, max_dendrite_tries=1, max_dendrites=2,
                                   retain_all_dendrites=False, run_dir=tmp / "run",
                                   growth="dendrites")
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    opt, _ = ctl.build_optimizer()
    actions, best = [], torch.zeros(0)
    for epoch, score in enumerate([1.0, 0.5]):
        train_epoch(model, opt, rank, epoch)
        if epoch == 0:
            best = _flat(full_state_dict(model))
        decision = ctl.step(score, model=model)
        actions.append(decision.action)
        model, opt = decision.model, decision.optimizer
    restored = _flat(full_state_dict(model))
    return {"actions": actions, "dendrites": ctl.num_dendrites,
            "sharded": all(isinstance(p, DTensor) for p in model.parameters()),
            "diff": (restored - best).abs().max().item() if restored.shape == best.shape
            else None}


@pytest.mark.timeout(150)
def test_fsdp2_completion_rewinds_to_the_best_model(tmp_path):
    for r in run_ranks(rewind_under_fsdp2, tmp_path):
        assert r["actions"] == ["restructure", "complete"]
        assert r["dendrites"] == 0 and r["sharded"]
        assert r["diff"] == 0.0
    # the rewind re-sharded the model: the old optimizer's moments are not written
    meta, shapes, _ = read_dcp(tmp_path / "run" / "latest.dcp")
    assert meta["controller"]["completed"] and "optimizer" not in meta
    assert "optim" not in shapes and meta["structure"] == meta["best_structure"]


def make_odd_model(seed: int) -> nn.Module:
    """7 and 3 output rows: uneven FSDP2 shards on 2 ranks (4+3 and 2+1 rows)."""
    torch.manual_seed(seed)
    return perfora.perforate(nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 3)))


def _adam_controller(model: nn.Module, **files) -> perfora.GrowthController:
    """The controller both runs use: no plateau switch in this test, Adam registered; the
    run files are single .safetensors files (gathered), which this test reads."""
    ctl = perfora.GrowthController(model, switch_mode="fixed", fixed_switch_num=50,
                                   max_dendrites=3, retain_all_dendrites=True,
                                   checkpoint_format="file", **files)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    return ctl


def _local(value: torch.Tensor) -> list:
    return (value.to_local() if isinstance(value, DTensor) else value).tolist()


def local_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    """This rank's parameter shards and optimizer state shards, by name (nothing gathered)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {"params": {n: _local(p.detach()) for n, p in model.named_parameters()},
            "optim": {names[id(p)]: {k: _local(v) for k, v in sorted(opt.state[p].items())}
                      for group in opt.param_groups for p in group["params"]},
            "shards": {n: list(p.to_local().shape) for n, p in model.named_parameters()}}


def adam_uninterrupted(rank: int, tmp: Path) -> dict:
    """Train, grow, train (Adam moments build up), checkpoint mid-cycle, train 2 more epochs."""
    mesh = init_device_mesh("cpu", (WORLD,))
    model = shard_fsdp2(make_odd_model(seed=5), mesh=mesh)
    ctl = _adam_controller(model, run_dir=tmp / "run", checkpoint_time_budget=None)
    opt, _ = ctl.build_optimizer()
    train_epoch(model, opt, rank, 0)
    ctl.step(1.0, model=model)
    decision = ctl.add_dendrites()
    model, opt = decision.model, decision.optimizer
    train_epoch(model, opt, rank, 1)
    decision = ctl.step(0.9, model=model)  # writes run/latest (gathered on every rank)
    ctl.save(tmp / "mid.safetensors")
    at_save = local_state(model, opt)
    for epoch in (2, 3):
        train_epoch(model, opt, rank, epoch)
    return {"action": decision.action, "at_save": at_save, "end": local_state(model, opt)}


def adam_resumed(rank: int, tmp: Path) -> dict:
    """A new process group: resume with a fresh optimizer (control), then for real."""
    mesh = init_device_mesh("cpu", (WORLD,))

    def resume(path: Path) -> tuple[perfora.GrowthController, nn.Module, torch.optim.Optimizer]:
        ctl = _adam_controller(shard_fsdp2(make_odd_model(seed=77), mesh=mesh),
                               write_files=False)
        decision = ctl.load(path)
        return ctl, decision.model, decision.optimizer

    ctl, model, _ = resume(tmp / "mid.safetensors")
    opt, _ = ctl.build_optimizer()  # negative control: moments start from zero
    for epoch in (2, 3):
        train_epoch(model, opt, rank, epoch)
    fresh = local_state(model, opt)
    ctl, model, opt = resume(tmp / "run" / "latest.safetensors")
    loaded = local_state(model, opt)
    for epoch in (2, 3):
        train_epoch(model, opt, rank, epoch)
    return {"fresh": fresh, "loaded": loaded, "end": local_state(model, opt)}


def _max_diff(a: dict, b: dict) -> float:
    """Largest difference between two {name: nested list} maps with the same names."""
    assert a.keys() == b.keys()
    return max((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max().item() if
               torch.tensor(a[k]).numel() else 0.0 for k in a)


def _optim_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    assert all(a[n].keys() == b[n].keys() == {"step", "exp_avg", "exp_avg_sq"} for n in a)
    return max(_max_diff(a[n], b[n]) for n in a)


@pytest.mark.timeout(120)
def test_fsdp2_adam_state_survives_resume_in_new_process_group(tmp_path):
    first = run_ranks(adam_uninterrupted, tmp_path)
    latest = load_checkpoint(tmp_path / "run" / "latest.safetensors")
    saved = load_checkpoint(tmp_path / "mid.safetensors")
    names = saved.meta["optimizer"]["param_names"]
    assert latest.meta["optimizer"]["param_names"] == names
    assert latest.tensors["optimizer"].keys() == saved.tensors["optimizer"].keys()
    for key, value in saved.tensors["optimizer"].items():
        assert torch.equal(latest.tensors["optimizer"][key], value), key
    full = saved.tensors["optimizer"][f"{names.index('0.base.weight')}.exp_avg"]
    assert full.shape == (7, 6) and full.abs().sum() > 0  # full, trained, not a shard
    resumed = run_ranks(adam_resumed, tmp_path)
    for rank, (a, b) in enumerate(zip(first, resumed)):
        assert a["action"] == "continue"
        assert a["at_save"]["shards"]["0.base.weight"] == [4 - rank, 6]
        assert a["at_save"]["shards"]["2.out_weight"] == [1 - rank, 3]  # rank 1: empty
        assert b["loaded"]["shards"] == a["at_save"]["shards"]
        assert _max_diff(a["at_save"]["params"], b["loaded"]["params"]) == 0.0
        assert _optim_diff(a["at_save"]["optim"], b["loaded"]["optim"]) == 0.0
        assert _max_diff(a["end"]["params"], b["end"]["params"]) <= 1e-6
        assert _optim_diff(a["end"]["optim"], b["end"]["optim"]) <= 1e-6
        # the control: without the saved moments the same steps end elsewhere
        assert _max_diff(a["end"]["params"], b["fresh"]["params"]) > 1e-3


@pytest.mark.timeout(30)
def test_optimizer_state_is_matched_by_parameter_name_not_position():
    model = make_odd_model(seed=3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(2):
        train_epoch(model, opt, 0, epoch)
    saved, names = gather_optimizer_state(opt, model)  # no DTensor: nothing to gather
    reordered = torch.optim.Adam(list(model.parameters())[::-1], lr=0.01)
    reordered.load_state_dict(shard_optimizer_state(saved, names, reordered, model))
    for p in model.parameters():
        for key, value in opt.state[p].items():
            assert torch.equal(reordered.state[p][key], value), key
    subset = torch.optim.Adam(list(model.parameters())[1:], lr=0.01)
    with pytest.raises(ValueError, match="other parameters"):
        shard_optimizer_state(saved, names, subset, model)


def _sharded_directly(rank: int, tmp: Path) -> dict:
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    model = fully_shard(make_model(seed=1), mesh=mesh)
    try:
        perfora.GrowthController(model, write_files=False)
    except perfora.ConversionError as exc:
        return {"error": str(exc)}
    return {"error": None}


@pytest.mark.timeout(150)
def test_fsdp2_sharded_without_perfora_is_refused_with_the_fix(tmp_path):
    for r in run_ranks(_sharded_directly, tmp_path):
        assert r["error"] is not None and "shard_fsdp2" in r["error"]


def _compat_sharded_after_perforate(rank: int, tmp: Path) -> dict:
    """The PerforatedAI recipe's order: perforate_model, then fully_shard, then the tracker."""
    from torch.distributed.fsdp import fully_shard

    from perfora.compat import globals_perforatedai as GPA
    from perfora.compat import utils_perforatedai as UPA

    GPA.reset()
    GPA.pc.set_testing_dendrite_capacity(False)
    torch.manual_seed(1)
    model = UPA.perforate_model(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)),
                                save_name=str(tmp / "run"))
    fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
    GPA.pai_tracker.set_optimizer(torch.optim.Adam)
    errors = {}
    for call, go in [("setup_optimizer",
                      lambda: GPA.pai_tracker.setup_optimizer(model, {"lr": 1e-3})),
                     ("add_validation_score",
                      lambda: GPA.pai_tracker.add_validation_score(0.5, model))]:
        try:
            go()
        except perfora.ParallelError as exc:
            errors[call] = str(exc)
    return errors


@pytest.mark.timeout(150)
def test_compat_recipe_refuses_a_model_sharded_after_perforate_model(tmp_path):
    # each rank refuses at the same call: no rank is left waiting in a collective
    for r in run_ranks(_compat_sharded_after_perforate, tmp_path):
        assert set(r) == {"setup_optimizer", "add_validation_score"}
        assert all("do not re-shard FSDP2 models" in e for e in r.values())


_ = batch  # the shared batches come through train_epoch


def _sharded_twice(rank: int, tmp: Path) -> dict:
    """shard_fsdp2 and wrap_fsdp1 called again, as Lightning's configure_model is at every
    stage: the same arguments give the model back, others (or a model perfora did not shard)
    raise ParallelError."""
    from torch.distributed.fsdp import fully_shard

    from perfora.parallel import wrap_fsdp1

    cpu = torch.device("cpu")
    model = shard_fsdp2(make_model(seed=3), mesh=init_device_mesh("cpu", (WORLD,)))
    wrapped = wrap_fsdp1(make_model(seed=5), device_id=cpu)
    out = {"same": shard_fsdp2(model, mesh=init_device_mesh("cpu", (WORLD,))) is model,
           "same_fsdp1": wrap_fsdp1(wrapped, device_id=cpu) is wrapped}
    for name, call in (("other_args", lambda: shard_fsdp2(model, reshard_after_forward=False)),
                       ("not_ours", lambda: shard_fsdp2(fully_shard(make_model(seed=4)))),
                       ("other_fsdp1", lambda: wrap_fsdp1(wrapped, device_id=cpu,
                                                          forward_prefetch=True))):
        try:
            call()
            out[name] = None
        except perfora.ParallelError as exc:
            out[name] = str(exc)
    return out


@pytest.mark.timeout(150)
def test_the_sharding_helpers_return_a_model_they_sharded_the_same_way_and_refuse_others(
        tmp_path):
    for r in run_ranks(_sharded_twice, tmp_path):
        assert r["same"] and r["same_fsdp1"]
        assert "other arguments (mesh, reshard_after_forward)" in r["other_args"]
        assert "already sharded with fully_shard" in r["not_ours"]
        assert "wrap_fsdp1 got a model it already sharded with other arguments " \
               "(forward_prefetch)" in r["other_fsdp1"]
