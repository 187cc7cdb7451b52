"""Neuron growth under DistributedDataParallel, FSDP2 and FSDP1: 2 real CPU ranks (gloo), each
on its own data. The GradMax rows come from the error summed over both ranks, so the widened
models stay bit-identical; FSDP1 refuses GradMax (its flat shards hide the shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import perfora
from tests.support.ranks import run_in_folder

WORLD = 2


def _flat(model: nn.Module) -> torch.Tensor:
    """Every parameter, whole (an FSDP2 shard gathered: a collective), in one vector."""
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                      for p in perfora.unwrap_model(model).parameters()])


def _rank_diff(model: nn.Module) -> float:
    flat = _flat(model)
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    return max((g - gathered[0]).abs().max().item() for g in gathered)


def _rank_task(rank: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of this rank's own task: 6 inputs, 3 classes."""
    x = torch.randn(32, 6, generator=gen)
    return x, (x[:, 2 * rank] > 0).long() + (x[:, 1 + rank] > 1).long()


def _grow_on_rank_data(ddp: nn.Module, ctl: perfora.GrowthController, rank: int,
                       scores: tuple[float, ...], batch=_rank_task,
                       x_fixed: torch.Tensor | None = None
                       ) -> tuple[nn.Module, list, list, list]:
    """One epoch per score: 3 Adam steps on this rank's own task (``batch(rank, gen)``), then
    ``ctl.step(score)``. Returns the model, each step's reason, the largest difference
    between ranks' parameters and whether a fixed batch's output stayed bit-identical."""
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)
    if x_fixed is None:
        x_fixed = torch.randn(8, 6, generator=torch.Generator().manual_seed(9))
    reasons, diffs, exact = [], [], []
    for score in scores:
        ddp.train()
        for _ in range(3):
            x, y = batch(rank, gen)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        ddp.eval()
        with torch.no_grad():
            before = ddp(x_fixed)
        decision = ctl.step(score, model=ddp)
        ddp, opt = decision.model, decision.optimizer
        with torch.no_grad():
            exact.append(bool(torch.equal(ddp(x_fixed), before)))
        reasons.append(decision.reason)
        diffs.append(_rank_diff(ddp))
    return ddp, reasons, diffs, exact


def grow_neurons_on_rank_data(rank: int, tmp: Path, growth: str = "neurons") -> dict:
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)))
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, growth=growth, switch_mode="every_epoch",
                                   max_neuron_steps=2, write_files=False, candidate_steps=5,
                                   neuron_init="gradmax")
    # neurons: each model the best so far; auto: two dendrite sets, the 2nd fails
    scores = (0.5, 0.6, 0.55) if growth == "auto" else (0.5, 0.6, 0.7)
    ddp, reasons, diffs, exact = _grow_on_rank_data(ddp, ctl, rank, scores)
    return {"reasons": reasons, "diffs": diffs, "exact": exact,
            "dendrites": {p: layer.num_dendrites
                          for p, layer in perfora.dendritic_layers(ddp).items()},
            "width": perfora.unwrap_model(ddp)[0].num_neurons,
            "is_ddp": isinstance(ddp, DDP),
            "new_rows": perfora.unwrap_model(ddp)[0].source.weight[4:].tolist()}


@pytest.mark.timeout(150)
def test_neuron_growth_keeps_ranks_identical_with_rank_specific_data(tmp_path):
    r0, r1 = run_in_folder(grow_neurons_on_rank_data, tmp_path, WORLD, join_s=120)
    assert r0["reasons"] == r1["reasons"]
    assert "0: +4 gradmax" in r0["reasons"][0]
    assert r0["width"] == r1["width"] == 12  # 4 + 4 + 4, then completion keeps the best
    assert r0["new_rows"] == r1["new_rows"]
    assert set(r0["diffs"]) == set(r1["diffs"]) == {0.0}
    assert all(r0["exact"][:2]) and all(r1["exact"][:2])  # each widening kept the output
    assert r0["is_ddp"] and r1["is_ddp"]


def _image_task(rank: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of this rank's own image task: 1x8x8 images, 2 classes."""
    x = torch.randn(16, 1, 8, 8, generator=gen)
    return x, (x[:, 0, rank, :].sum(1) > 0).long()


def grow_conv_neurons_on_rank_data(rank: int, tmp: Path) -> dict:
    """A small CNN under DDP, each rank on its own images: two GradMax neuron steps."""
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(3, 3, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 16, 2)))
    ddp = DDP(model)
    ctl = perfora.GrowthController(ddp, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, write_files=False, conv_gradmax=True)
    x_fixed = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(9))
    _, reasons, diffs, exact = _grow_on_rank_data(ddp, ctl, rank, (0.5, 0.6), _image_task,
                                                  x_fixed)
    return {"reasons": reasons, "diffs": diffs, "exact": exact}


@pytest.mark.timeout(150)
def test_conv_layers_grow_gradmax_neurons_alike_on_every_rank(tmp_path):
    r0, r1 = run_in_folder(grow_conv_neurons_on_rank_data, tmp_path, WORLD, join_s=120)
    assert r0["reasons"] == r1["reasons"]
    assert r0["reasons"][1] == "plateau: added neuron step 2 (0: +3 gradmax, 3: +3 gradmax)"
    assert set(r0["diffs"]) == set(r1["diffs"]) == {0.0}
    assert all(r0["exact"]) and all(r1["exact"])


def grow_normed_cnn_on_rank_data(rank: int, tmp: Path, kind: str) -> dict:
    """A CNN with a GroupNorm and an InstanceNorm between its widened pairs, under DDP or
    sharded by FSDP2, each rank on its own images: two neuron steps."""
    from torch.distributed.device_mesh import init_device_mesh

    from perfora.parallel import shard_fsdp2

    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.SiLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, padding=1), nn.InstanceNorm2d(4, affine=True), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 16, 2)))
    wrapped = DDP(model) if kind == "ddp" else shard_fsdp2(
        model, mesh=init_device_mesh("cpu", (WORLD,)))
    ctl = perfora.GrowthController(wrapped, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, write_files=False)
    x_fixed = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(9))
    wrapped, reasons, diffs, exact = _grow_on_rank_data(wrapped, ctl, rank, (0.5, 0.6),
                                                        _image_task, x_fixed)
    full = ctl.backend.full_state(wrapped)
    return {"reasons": reasons, "exact": exact, "diffs": diffs,
            "full": {k: v.tolist() for k, v in full.items()},
            "groups": perfora.unwrap_model(wrapped)[1].num_groups}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["ddp", "fsdp2"])
def test_a_cnn_grows_through_group_and_instance_norms_alike_on_every_rank(tmp_path, kind):
    r0, r1 = run_in_folder(grow_normed_cnn_on_rank_data, tmp_path, WORLD, kind, join_s=120)
    assert r0["reasons"] == r1["reasons"]
    assert r0["reasons"][1] == "plateau: added neuron step 2 (0: +4 random, 4: +4 random)"
    assert all(r0["exact"]) and all(r1["exact"])
    assert set(r0["diffs"]) == {0.0} and r0["full"] == r1["full"]
    assert len(r0["full"]["1.weight"]) == 12 and r0["groups"] == 6  # groups of 2 channels
    assert len(r0["full"]["5.weight"]) == 12


@pytest.mark.timeout(150)
def test_auto_growth_chooses_alike_on_every_rank(tmp_path):
    r0, r1 = run_in_folder(grow_neurons_on_rank_data, tmp_path, WORLD, "auto", join_s=120)
    assert r0["reasons"] == r1["reasons"]  # the same choice, from the averaged score
    assert r0["reasons"][:2] == ["plateau: added dendrite set 1",
                                 "plateau: added dendrite set 2"]
    assert r0["reasons"][2].startswith("dendrite set 2 did not beat the best score: undone; "
                                       "added neuron step 1 instead (0: +4 gradmax")
    assert r0["dendrites"] == r1["dendrites"] == {"0": 1, "2": 1}  # the failed set undone
    assert r0["width"] == r1["width"] == 8 and r0["new_rows"] == r1["new_rows"]
    assert set(r0["diffs"]) == set(r1["diffs"]) == {0.0}
    assert all(r0["exact"][:2]) and all(r1["exact"][:2])


class Untraceable(nn.Module):
    """fc1 -> tanh -> fc2 behind a branch on a tensor's value: torch.fx cannot follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        return self.fc2(h * 2 if h.sum() > 1e9 else h)


def grow_named_pairs_on_rank_data(rank: int, tmp: Path) -> dict:
    torch.manual_seed(0)
    ddp = DDP(perfora.perforate(Untraceable()))
    ctl = perfora.GrowthController(ddp, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=2, write_files=False,
                                   neuron_pairs={"fc1": ["fc2"]})
    ddp, reasons, diffs, exact = _grow_on_rank_data(ddp, ctl, rank, (0.5, 0.6))
    return {"reasons": reasons, "diffs": diffs, "exact": exact,
            "width": perfora.unwrap_model(ddp).fc1.num_neurons}


@pytest.mark.timeout(150)
def test_named_readers_grow_an_untraceable_model_alike_on_every_rank(tmp_path):
    r0, r1 = run_in_folder(grow_named_pairs_on_rank_data, tmp_path, WORLD, join_s=120)
    assert r0["reasons"] == r1["reasons"]
    assert r0["reasons"][0] == "plateau: added neuron step 1 (fc1: +4 gradmax)"
    assert r0["width"] == r1["width"] == 12
    assert set(r0["diffs"]) == set(r1["diffs"]) == {0.0}
    assert r0["exact"] == r1["exact"] == [True, True]


def grow_neurons_sharded(rank: int, tmp: Path, kind: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from perfora.parallel import shard_fsdp2, wrap_fsdp1

    torch.manual_seed(0)
    base = perfora.perforate(nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3)))
    fsdp2 = kind.startswith("fsdp2")
    model = shard_fsdp2(base, mesh=init_device_mesh("cpu", (WORLD,))) if fsdp2 \
        else wrap_fsdp1(base, device_id=torch.device("cpu"))
    auto = kind.endswith("auto")
    ctl = perfora.GrowthController(model, growth="auto" if auto else "neurons",
                                   switch_mode="every_epoch", max_neuron_steps=2,
                                   write_files=False, candidate_steps=5,
                                   neuron_init="gradmax")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)
    x_fixed = torch.randn(8, 6, generator=torch.Generator().manual_seed(9))
    reasons, exact, sharded, shapes = [], [], [], []
    for epoch in range(3):
        model.train()
        for _ in range(3):
            x = torch.randn(32, 6, generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 2 * rank] > 0).long()).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            before = model(x_fixed)
        # neurons: the first model stays the best; auto: two sets, the second one fails
        decision = ctl.step([0.5, 0.6, 0.55][epoch] if auto else [0.5, 0.4, 0.3][epoch])
        model, opt = decision.model, decision.optimizer
        # each step follows a rewind (auto: the undo; neurons: the retry from the best model)
        # that re-shards; the widened layers' moments must still reach the new optimizer
        if epoch == (2 if auto else 1) and fsdp2:
            carried = [bool(opt.state.get(p)) for name, p in
                       perfora.unwrap_model(model).named_parameters() if ".base." in name]
        elif epoch == (2 if auto else 1):  # FSDP1: a rank's slices may miss a parameter
            from perfora.checkpoint.optimizer_state import join_optimizer_state

            tensors, meta = ctl.backend.optimizer_state(opt, model)  # whole, by name
            state = join_optimizer_state(tensors, meta)["state"]
            carried = [bool(state.get(i)) and bool(state[i]["exp_avg"].abs().sum() > 0)
                       for i, name in enumerate(meta["param_names"]) if ".base." in name]
        with torch.no_grad():
            exact.append(bool(torch.equal(model(x_fixed), before)))
        reasons.append(decision.reason)
        sharded.append(any(type(p).__name__ == "DTensor" for p in model.parameters())
                       or type(model).__name__ == "FullyShardedDataParallel")
        shapes.append(list(ctl.backend.full_state(model)["0.base.weight"].shape))
    full = {k: v.tolist() for k, v in ctl.backend.full_state(model).items()}
    dendrites = ctl.num_dendrites
    return {"reasons": reasons, "exact": exact, "sharded": sharded, "shapes": shapes,
            "full": full, "dendrites": dendrites, "carried": carried}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["fsdp2", "fsdp1", "fsdp1-auto", "fsdp2-auto"])
def test_a_sharded_model_widens_reshards_and_rewinds_narrower(tmp_path, kind):
    r0, r1 = run_in_folder(grow_neurons_sharded, tmp_path, WORLD, kind, join_s=120)
    assert r0["reasons"] == r1["reasons"] and r0["full"] == r1["full"]
    assert r0["carried"] and all(r0["carried"]) and all(r1["carried"])
    assert all(r0["exact"][:2]) and all(r0["sharded"])  # exact, and sharded again
    if kind.endswith("auto"):  # a failed dendrite set undone, neurons grown in its place
        init = "gradmax"
        assert r0["reasons"][:2] == ["plateau: added dendrite set 1",
                                     "plateau: added dendrite set 2"]
        assert r0["reasons"][2] == ("dendrite set 2 did not beat the best score: undone; "
                                    f"added neuron step 1 instead (0: +4 {init})")
        assert r0["shapes"] == [[4, 6], [4, 6], [8, 6]]
        assert r0["dendrites"] == 1
        return
    init = "gradmax"  # the recorded error, reduced over ranks, under FSDP1's flat slices too
    assert r0["reasons"][:2] == [f"plateau: added neuron step 1 (0: +4 {init})",
                                 f"plateau: added neuron step 2 (0: +4 {init})"]
    assert r0["reasons"] == r1["reasons"]
    assert r0["shapes"] == [[8, 6], [12, 6], [4, 6]]  # then the rewind to the first model
    assert all(r0["exact"][:2]) and all(r0["sharded"])  # exact, and sharded again
    assert r0["full"] == r1["full"]


def widen_fsdp2_pair_by_pair(rank: int, tmp: Path) -> dict:
    """Two widenable pairs with a BatchNorm between, sharded per layer; the whole model must
    never be gathered (the spec's unshard is made to fail), and Adam's moments carry on."""
    from torch.distributed.device_mesh import init_device_mesh

    from perfora.errors import ParallelError
    from perfora.parallel import shard_fsdp2

    torch.manual_seed(0)
    base = perfora.perforate(nn.Sequential(
        nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 4), nn.Tanh(),
        nn.Linear(4, 3)))
    model = shard_fsdp2(base, mesh=init_device_mesh("cpu", (WORLD,)))
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, write_files=False,
                                   neuron_init="gradmax")

    def no_whole_model(_model: nn.Module) -> nn.Module:
        raise ParallelError("a neuron step gathered the whole model")

    ctl.backend.spec.unshard = no_whole_model
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)
    x_fixed = torch.randn(8, 6, generator=torch.Generator().manual_seed(9))
    for _ in range(3):
        x = torch.randn(32, 6, generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), (x[:, 2 * rank] > 0).long()).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        before = model(x_fixed)
    stats_before = ctl.backend.full_state(model)["1.running_mean"].clone()

    def moments(names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        params = dict(model.named_parameters())
        return {n: opt.state[params[n]]["exp_avg"].full_tensor() for n in names}

    moments_before = moments(("0.base.weight", "3.base.weight"))
    decision = ctl.step(0.5)
    model, opt = decision.model, decision.optimizer
    after = moments(("0.base.weight", "3.base.weight"))
    carried = (torch.equal(after["0.base.weight"][:5], moments_before["0.base.weight"])
               and not after["0.base.weight"][5:].any()
               and torch.equal(after["3.base.weight"][:4, :5], moments_before["3.base.weight"])
               and not after["3.base.weight"][4:].any() and not after["3.base.weight"][:, 5:].any())
    with torch.no_grad():
        exact = bool(torch.equal(model(x_fixed), before))
    full = {k: v.clone() for k, v in ctl.backend.full_state(model).items()}
    shapes = {k: list(full[k].shape) for k in ("0.base.weight", "1.weight", "3.base.weight",
                                                "5.base.weight")}
    model.train()  # the widened model trains: the new neurons' zero outgoing weights move
    new_columns = full["3.base.weight"][:, 5:].clone()
    x = torch.randn(32, 6, generator=gen)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), (x[:, 2 * rank] > 0).long()).backward()
    opt.step()
    moved = not torch.equal(ctl.backend.full_state(model)["3.base.weight"][:, 5:], new_columns)
    return {"reason": decision.reason, "exact": exact, "shapes": shapes, "moved": moved,
            "carried": carried,
            "stats_kept": bool(torch.equal(full["1.running_mean"][:5], stats_before)),
            "new_stats": full["1.running_mean"][5:].tolist(),
            "sharded": all(type(p).__name__ == "DTensor" for p in model.parameters()),
            "params": {k: v.tolist() for k, v in full.items() if "running" not in k}}


@pytest.mark.timeout(150)
def test_fsdp2_widens_one_layer_pair_at_a_time_exactly(tmp_path):
    r0, r1 = run_in_folder(widen_fsdp2_pair_by_pair, tmp_path, WORLD, join_s=120)
    assert r0["reason"] == r1["reason"] == ("plateau: added neuron step 1 "
                                            "(0: +5 gradmax, 3: +4 gradmax)")
    assert r0["exact"] and r1["exact"] and r0["sharded"] and r1["sharded"]
    assert r0["shapes"] == {"0.base.weight": [10, 6], "1.weight": [10],
                            "3.base.weight": [8, 10], "5.base.weight": [3, 8]}
    for r in (r0, r1):  # BatchNorm: each rank's own statistics, new channels neutral
        assert r["stats_kept"] and r["new_stats"] == [0.0] * 5
    assert r0["carried"] and r1["carried"]  # Adam's moments in the old slices, zeros after
    assert r0["moved"] and r0["params"] == r1["params"]


def widen_fsdp1_with_adam(rank: int, tmp: Path, own: bool) -> dict:
    """A neuron step under FSDP1: Adam's moments (flat slices per rank) are gathered whole,
    grown, and cut to the widened model's slices; in the optimizer perfora rebuilds, or
    (``own``) in the one the user builds and registers."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from perfora.parallel import wrap_fsdp1

    torch.manual_seed(0)
    base = perfora.perforate(nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4),
                                           nn.Tanh(), nn.Linear(4, 3)))
    model = wrap_fsdp1(base, device_id=torch.device("cpu"))
    ctl = perfora.GrowthController(model, growth="neurons", switch_mode="every_epoch",
                                   max_neuron_steps=1, write_files=False)
    if own:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        ctl.set_optimizer_instance(opt)
    else:
        ctl.set_optimizer(torch.optim.Adam, lr=0.01)
        opt, _ = ctl.build_optimizer()
    gen = torch.Generator().manual_seed(rank)

    def train() -> None:
        for _ in range(3):
            x = torch.randn(32, 6, generator=gen)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), (x[:, 2 * rank] > 0).long()).backward()
            opt.step()

    def moments() -> dict[str, dict[str, torch.Tensor]]:
        full = get_optimizer_state_dict(model, opt, options=StateDictOptions(
            full_state_dict=True))
        return {name: {k: torch.as_tensor(v).clone() for k, v in entry.items()}
                for name, entry in full["state"].items()}

    train()
    before = moments()
    decision = ctl.step(0.5)
    model, opt = decision.model, decision.optimizer
    if own:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        ctl.set_optimizer_instance(opt)  # takes the kept moments (on every rank)
    after = moments()
    w0, w2 = "0.base.weight", "2.base.weight"
    carried = {
        "shapes": [list(after[w0]["exp_avg"].shape), list(after[w2]["exp_avg"].shape)],
        "old_slices": all(torch.equal(after[n][k][tuple(slice(0, s) for s in before[n][k].shape)],
                                      before[n][k])
                          for n in (w0, w2) for k in ("exp_avg", "exp_avg_sq")),
        "new_zero": not after[w0]["exp_avg"][5:].any() and not after[w2]["exp_avg"][4:].any()
        and not after[w2]["exp_avg"][:, 5:].any(),
        "steps": [float(after[w0]["step"]), float(before[w0]["step"])]}
    train()  # and the widened model trains on with them
    full = {k: v.tolist() for k, v in ctl.backend.full_state(model).items()}
    return {"reason": decision.reason, "carried": carried, "full": full}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("own", [False, True], ids=["perfora_builds", "user_builds"])
def test_fsdp1_neuron_step_carries_adam_moments_into_the_widened_slices(tmp_path, own):
    r0, r1 = run_in_folder(widen_fsdp1_with_adam, tmp_path, WORLD, own, join_s=120)
    assert r0["reason"].startswith("plateau: added neuron step 1")
    for r in (r0, r1):
        carried = r["carried"]
        assert carried["shapes"] == [[10, 6], [8, 10]]  # widened: +5 rows, +4 rows, +5 cols
        assert carried["old_slices"] and carried["new_zero"]
        assert carried["steps"][0] == carried["steps"][1] == 3.0  # the step count goes on
    assert r0["full"] == r1["full"]  # ranks identical after training on
