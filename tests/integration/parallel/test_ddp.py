"""In-process restructure under DistributedDataParallel: 2 real CPU ranks (gloo, FileStore).

Each test starts two processes; a worker writes its results as JSON, the parent compares the
ranks. Every test has a timeout (pytest-timeout and a join deadline), so a hang fails.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import perfora
from perfora.distributed import RankMismatchError
from perfora.parallel import wrap_ddp
from tests.support.ranks import run_in_folder

WORLD = 2
JOIN_S = 90


# ----------------------------------------------------------------------------- harness
def run_ranks(fn: Callable, tmp: Path, *args) -> list[dict]:
    """Run ``fn(rank, tmp, *args)`` on 2 gloo ranks; each rank's JSON-able result."""
    return run_in_folder(fn, tmp, WORLD, *args, join_s=JOIN_S)


# ----------------------------------------------------------------------------- workers
def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return perfora.perforate(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)))


def batch(rank: int, epoch: int, step: int, n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * epoch + 10 * step + rank)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, rank: int, epoch: int,
                steps: int = 3) -> None:
    model.train()
    for step in range(steps):
        x, y = batch(rank, epoch, step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def max_rank_diff(model: nn.Module) -> float:
    """Largest difference of any parameter between the ranks (0.0 when in sync)."""
    flat = torch.cat([p.detach().reshape(-1) for p in perfora.unwrap_model(model).parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


def counting_hook(state, bucket):  # no annotations: DDP checks them as real types
    """A user's DDP comm hook: counts its calls, then all-reduces as usual."""
    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def grow_and_train(rank: int, tmp: Path, rewrap: bool, use_helper: bool) -> dict:
    """Ranks start from different weights and grow different dendrites (seed = rank)."""
    model = make_model(seed=100 + rank)
    hook_state = {"calls": 0}
    ddp = (wrap_ddp(model, gradient_as_bucket_view=True, bucket_cap_mb=1,
                    comm_hook=counting_hook, comm_state=hook_state) if use_helper
           else DDP(model))
    # a different seed per rank: the new dendrites differ, only DDP's broadcast fixes that
    # negative control: the controller only sees the bare module, so it cannot re-wrap and
    # the user's first DDP stays in use
    watched = ddp if rewrap else model
    first = ddp
    ctl = perfora.GrowthController(watched, switch_mode="every_epoch", max_dendrites=3,
                                   retain_all_dendrites=True, seed=rank, growth="dendrites")
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    opt, _ = ctl.build_optimizer()
    diffs, kinds, wrappers = [], [], []
    for epoch in range(2):
        train_epoch(ddp, opt, rank, epoch)
        diffs.append(max_rank_diff(ddp))
        decision = ctl.step(1.0, model=watched)
        kinds.append(decision.action)
        if decision.restructured:
            wrappers.append(decision.model is not watched)
            watched, opt = decision.model, decision.optimizer
            ddp = watched if rewrap else ddp
    calls_before = hook_state["calls"]
    for epoch in range(2, 4):
        train_epoch(ddp, opt, rank, epoch)
    diffs.append(max_rank_diff(ddp))
    out = {"diffs": diffs, "actions": kinds, "new_wrappers": wrappers,
           "dendrites": ctl.num_dendrites, "is_ddp": isinstance(ddp, DDP)}
    if rewrap:  # reporting with a replaced wrapper is an error, not silent divergence
        try:
            ctl.step(1.0, model=first)
        except perfora.OrderError as exc:
            out["stale_error"] = str(exc)
    if use_helper:
        out["bucket_view"] = ddp.gradient_as_bucket_view
        out["bucket_bytes"] = ddp.bucket_bytes_cap
        out["hook_calls_on_last_wrapper"] = hook_state["calls"] - calls_before
    return out


def uneven_shards(rank: int, tmp: Path) -> dict:
    """Rank 0 validates on 30 samples, rank 1 on 10; decisions must still agree."""
    model = make_model(seed=3)
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, maximize=True, n_epochs_to_switch=2,
                                   max_dendrites=2, max_dendrite_tries=1)
    ctl.set_optimizer(torch.optim.SGD, lr=0.05)
    opt, _ = ctl.build_optimizer()
    n = 30 if rank == 0 else 10
    local_scores, agreed, actions = [], [], []
    for epoch in range(9):
        train_epoch(ddp, opt, rank, epoch, steps=1)
        # per-sample scores: rank 0's shard improves until epoch 4, rank 1's slowly worsens
        g = torch.Generator().manual_seed(77 * epoch + rank)
        base = 0.1 * min(epoch, 4) if rank == 0 else -0.001 * epoch
        per_sample = base + 0.001 * torch.rand(n, generator=g)
        local = per_sample.mean().item()
        local_scores.append(local)
        decision = ctl.step(local, model=ddp, weight=n)
        agreed.append(ctl.state.history[-1]["val_score"])
        actions.append(decision.action)
        if decision.restructured or decision.complete:
            ddp = decision.model
            opt = decision.optimizer or opt
        if decision.complete:
            break
    return {"local": local_scores, "agreed": agreed, "actions": actions,
            "switch_epochs": ctl.state.switch_epochs, "diff": max_rank_diff(ddp)}


def save_after_restructure(rank: int, tmp: Path) -> dict:
    """Grow at epoch 2, save after epoch 3, then train 2 more epochs uninterrupted."""
    model = make_model(seed=5)
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, switch_mode="fixed", fixed_switch_num=2,
                                   max_dendrites=3, retain_all_dendrites=True,
                                   run_dir=tmp / "run")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    for epoch in range(3):
        train_epoch(ddp, opt, rank, epoch)
        decision = ctl.step(0.5 + epoch, model=ddp)
        if decision.restructured:
            ddp, opt = decision.model, decision.optimizer
    if rank == 0:
        ctl.save(tmp / "after_restructure.safetensors")
    for epoch in range(3, 5):
        train_epoch(ddp, opt, rank, epoch)
    state = {k: v.tolist() for k, v in perfora.unwrap_model(ddp).state_dict().items()}
    return {"state": state, "dendrites": ctl.num_dendrites,
            "switch_epochs": ctl.state.switch_epochs}


def resume(rank: int, tmp: Path) -> dict:
    """A new process group: fresh model and DDP, load the checkpoint, train the same epochs."""
    model = make_model(seed=999)  # other weights: everything must come from the checkpoint
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, switch_mode="fixed", fixed_switch_num=2,
                                   max_dendrites=3, retain_all_dendrites=True)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    decision = ctl.load(tmp / "after_restructure.safetensors")
    fresh_wrapper = decision.model is not ddp and isinstance(decision.model, DDP)
    ddp, opt = decision.model, decision.optimizer
    for epoch in range(3, 5):
        train_epoch(ddp, opt, rank, epoch)
    state = {k: v.tolist() for k, v in perfora.unwrap_model(ddp).state_dict().items()}
    return {"state": state, "dendrites": ctl.num_dendrites, "fresh_wrapper": fresh_wrapper,
            "switch_epochs": ctl.state.switch_epochs, "diff": max_rank_diff(ddp)}


def mismatch(rank: int, tmp: Path) -> dict:
    """Rank 1 grows a layer by hand; the next restructure must raise, not hang."""
    model = make_model(seed=0)
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, switch_mode="every_epoch", max_dendrites=3,
                                   retain_all_dendrites=True)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    if rank == 1:
        perfora.dendritic_layers(model)["2"].grow(torch.Generator().manual_seed(0))
    out: dict = {"error": None, "fsdp_error": None}
    try:
        ctl.step(1.0, model=ddp)
    except RankMismatchError as exc:
        out.update(error=str(exc), type=type(exc).__name__,
                   is_perfora_error=isinstance(exc, perfora.PerforaError))
    # until re-sharding exists, an FSDP2-sharded model is refused instead of letting new
    # dendrites go unsharded and unsynchronized
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sharded = make_model(seed=0)
    fully_shard(sharded, mesh=init_device_mesh("cpu", (WORLD,)))
    try:
        perfora.GrowthController(sharded)
    except perfora.ConversionError as exc:
        out["fsdp_error"] = str(exc)
    return out


def selective_growth_on_rank_data(rank: int, tmp: Path) -> dict:
    """Each rank sees its own data (labels from another feature per rank): the neurons and
    weights grown must still be the same everywhere, chosen from all-reduced statistics."""
    from perfora.growth.candidates import plan_growth

    model = make_model(seed=7)
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, switch_mode="every_epoch", max_dendrites=2,
                                   retain_all_dendrites=True, grow_fraction=0.5,
                                   dendrite_init="error", candidate_steps=20,
                                   growth="dendrites",
                                   dendrite_optimizer="restart")  # (data where the ranks'
    # own picks differ: the test is that the all-reduced statistics make them agree)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)
    local_choices = []
    for _ in range(2):
        ddp.train()
        for _ in range(4):
            x = torch.randn(32, 6, generator=gen)
            y = (x[:, 3 * rank] > 0).long() + (x[:, 1 + rank] > 1).long()
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        layers = perfora.dendritic_layers(ddp)
        local_choices.append({  # what this rank would pick from its own rows alone
            path: plan_growth(layer, *ctl._probe.samples(path), fraction=0.5, steps=20,
                              generator=torch.Generator().manual_seed(0),
                              all_ranks=False).neurons
            for path, layer in sorted(layers.items())})
        decision = ctl.step(1.0, model=ddp)
        ddp, opt = decision.model, decision.optimizer
    for epoch in range(2):
        train_epoch(ddp, opt, rank, epoch)
    return {"fed": {p: layer.set_neurons()
                    for p, layer in sorted(perfora.dendritic_layers(ddp).items())},
            "local": local_choices, "diff": max_rank_diff(ddp),
            "dendrites": ctl.num_dendrites}


RANK_SCORES = ((0.1, 0.2, 0.5, 0.9), (0.5, 0.4, 0.9, 0.9))
"""Per rank and epoch; their means 0.3, 0.3, 0.7, 0.9. At the set after epoch 2 rank 0 alone
would carry on (0.2 is twice its first 0.1) and rank 1 restart; the agreed means restart.
At the set after epoch 4 both carry on."""


def auto_optimizer_on_rank_scores(rank: int, tmp: Path) -> dict:
    """dendrite_optimizer='auto' decides from the scores agreed over the ranks."""
    ddp = DDP(make_model(seed=3))
    ctl = perfora.GrowthController(ddp, growth="dendrites", switch_mode="fixed",
                                   fixed_switch_num=2, max_dendrites=2,
                                   dendrite_init="default", dendrite_optimizer="auto")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    steps = []
    for epoch, score in enumerate(RANK_SCORES[rank]):
        train_epoch(ddp, opt, rank, epoch)
        decision = ctl.step(score, model=ddp)
        ddp, opt = decision.model, decision.optimizer
        if decision.restructured:
            train_epoch(ddp, opt, rank, 10 + epoch)  # one epoch on the rebuilt optimizer
            steps.append(sorted({int(st["step"]) for st in opt.state.values()}))
    return {"steps": steps, "first": ctl.state.first_score, "diff": max_rank_diff(ddp),
            "dendrites": ctl.num_dendrites}


# ----------------------------------------------------------------------------- tests
@pytest.mark.timeout(150)
@pytest.mark.parametrize("use_helper", [False, True], ids=["user_ddp", "wrap_ddp"])
def test_restructure_rewraps_and_ranks_stay_identical(tmp_path, use_helper):
    results = run_ranks(grow_and_train, tmp_path, True, use_helper)
    for r in results:
        assert r["actions"][:2] == ["restructure", "restructure"]
        assert r["dendrites"] == 2
        assert r["new_wrappers"] == [True, True], "decision.model must be a new DDP wrapper"
        assert r["is_ddp"]
        # ranks started from different weights and drew different dendrites: DDP's
        # broadcast at every (re-)wrap makes them identical, and training keeps them so
        assert r["diffs"] == [0.0, 0.0, 0.0]
        assert "use decision.model" in r["stale_error"]
    if use_helper:  # the user's DDP arguments are kept on every new wrapper
        assert all(r["bucket_view"] is True for r in results)
        assert all(r["bucket_bytes"] == 2**20 for r in results)
        assert all(r["hook_calls_on_last_wrapper"] > 0 for r in results)


@pytest.mark.timeout(150)
def test_negative_control_stale_wrapper_diverges(tmp_path):
    results = run_ranks(grow_and_train, tmp_path, False, False)
    diffs = results[0]["diffs"]
    assert diffs[0] == 0.0  # before any growth the user's own DDP keeps the ranks in sync
    # without the new wrapper the new dendrites are never synchronized: the check fails
    assert diffs[-1] > 1e-4


@pytest.mark.timeout(150)
def test_uneven_validation_shards_restructure_in_the_same_epoch(tmp_path):
    r0, r1 = run_ranks(uneven_shards, tmp_path)
    assert r0["actions"] == r1["actions"]
    assert r0["switch_epochs"] == r1["switch_epochs"] and r0["switch_epochs"]
    # every rank saw the same score: the mean over all 40 samples (weights 30 and 10)
    for a0, a1, l0, l1 in zip(r0["agreed"], r1["agreed"], r0["local"], r1["local"]):
        assert a0 == a1
        assert a0 == pytest.approx((30 * l0 + 10 * l1) / 40, rel=1e-12)
    assert r0["diff"] == 0.0
    # and the check means something: from its own scores alone, rank 1 (flat) would have
    # restructured at another epoch than rank 0 (improving)
    local_switches = []
    for r in (r0, r1):
        ctl = perfora.GrowthController(make_model(3), maximize=True, n_epochs_to_switch=2,
                                       max_dendrites=2, max_dendrite_tries=1)
        for s in r["local"]:
            if ctl.step(s).complete:
                break
        local_switches.append(ctl.state.switch_epochs)
    assert local_switches[0] != local_switches[1]


@pytest.mark.timeout(200)
def test_checkpoint_after_restructure_resumes_in_new_process_group(tmp_path):
    first = run_ranks(save_after_restructure, tmp_path / "a")
    (tmp_path / "a" / "after_restructure.safetensors").rename(
        tmp_path / "after_restructure.safetensors")
    resumed = run_ranks(resume, tmp_path)
    assert first[0]["switch_epochs"] == [2] and first[0]["dendrites"] == 1
    assert (tmp_path / "a" / "run" / "switch_1.safetensors").is_file()  # rank 0 wrote it
    for r in range(WORLD):
        assert resumed[r]["fresh_wrapper"]
        assert resumed[r]["dendrites"] == 1
        assert resumed[r]["switch_epochs"] == [2]
        assert resumed[r]["state"] == first[r]["state"], "resumed run differs from the " \
            "uninterrupted one"
    assert resumed[0]["diff"] == 0.0


@pytest.mark.timeout(150)
def test_structure_mismatch_raises_on_every_rank_without_hanging(tmp_path):
    """Also: a model sharded without perfora is refused with a clear error."""
    results = run_ranks(mismatch, tmp_path)
    for r in results:
        assert r["type"] == "RankMismatchError" and r["is_perfora_error"]
        assert "layer '2' has 1 dendrite(s) on rank 0 and 2 on rank 1" in r["error"]
        assert "same epoch" in r["error"]
        assert "FSDP" in r["fsdp_error"] and "shard_fsdp2" in r["fsdp_error"]


def correlation_phases(rank: int, tmp: Path) -> dict:
    """The correlation rule's phase switches also get a new wrapper; ranks stay identical."""
    model = make_model(seed=100 + rank)
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, rule="correlation", switch_mode="fixed",
                                   fixed_switch_num=1, correlation_patience=1,
                                   max_dendrites=2, retain_all_dendrites=True)
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    opt, _ = ctl.build_optimizer()
    actions, phases, new_wrapper, diffs = [], [], [], []
    for epoch in range(6):
        train_epoch(ddp, opt, rank, epoch)
        diffs.append(max_rank_diff(ddp))
        decision = ctl.step(1.0 + epoch, model=ddp)
        actions.append(decision.action)
        phases.append(decision.phase)
        if decision.restructured:
            new_wrapper.append(decision.model is not ddp and isinstance(decision.model, DDP))
            ddp, opt = decision.model, decision.optimizer
        if decision.complete:
            break
    train_epoch(ddp, opt, rank, 9)
    diffs.append(max_rank_diff(ddp))
    return {"actions": actions, "phases": phases, "new_wrapper": new_wrapper, "diffs": diffs}


@pytest.mark.timeout(150)
def test_correlation_phase_changes_rewrap_and_ranks_stay_identical(tmp_path):
    r0, r1 = run_ranks(correlation_phases, tmp_path)
    assert r0["actions"] == r1["actions"] and r0["phases"] == r1["phases"]
    assert "phase_change" in r0["actions"] and "restructure" in r0["actions"]
    assert "dendrite" in r0["phases"]
    assert all(r0["new_wrapper"]) and all(r1["new_wrapper"])
    assert set(r0["diffs"]) == {0.0}


@pytest.mark.timeout(150)
def test_selective_error_growth_agrees_across_ranks_with_different_data(tmp_path):
    r0, r1 = run_ranks(selective_growth_on_rank_data, tmp_path)
    assert r0["dendrites"] == r1["dendrites"] == 2
    assert r0["fed"] == r1["fed"]
    assert [len(fed) for fed in r0["fed"]["0"]] == [4, 4]  # half of 8 neurons per set
    assert [len(fed) for fed in r0["fed"]["2"]] == [2, 2]  # half of 3, rounded up
    assert r0["local"] != r1["local"], "the ranks' own data should point at other neurons"
    assert r0["diff"] == 0.0 and r1["diff"] == 0.0


@pytest.mark.timeout(150)
def test_auto_dendrite_optimizer_decides_alike_on_every_rank(tmp_path):
    r0, r1 = run_ranks(auto_optimizer_on_rank_scores, tmp_path)
    assert r0["dendrites"] == r1["dendrites"] == 2
    assert r0["first"] == r1["first"] == pytest.approx(0.3)
    # after the first set a fresh optimizer on both (3 steps for every parameter, old and
    # new; rank 0 carrying on alone would hold 9 for the old ones); after the second the
    # old parameters' moments go on (12 steps since the restart), the new dendrites' start
    assert r0["steps"] == r1["steps"] == [[3], [3, 12]]
    assert r0["diff"] == r1["diff"] == 0.0
