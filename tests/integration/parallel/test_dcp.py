"""DCP checkpoints (``checkpoint_format``): saved on 2 gloo ranks, resumed on 1, 2 and 3.

One 2-rank job trains DDP and FSDP2 runs through a growth step, saves a mid-cycle DCP
checkpoint, runs on uninterrupted, then resumes the checkpoint onto fresh models in the same
group; one 3-rank job resumes it again; the test process itself resumes it without a
process group. Every rank trains on the same batches, so the continuation on any world size
is the uninterrupted run's (bit-identical on the same world size, to rounding elsewhere).
The runs are shared by the module's tests (one module-scoped fixture), to keep it fast.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

import perfora
from perfora.checkpoint.dcp import META_FILE, old_path
from perfora.errors import CheckpointError
from perfora.growth.restart import newest_switch
from perfora.nn.perforation import layer_specs
from perfora.parallel.sharded_state import gather_optimizer_state
from tests.support.ranks import run_world

pytestmark = pytest.mark.xdist_group("dcp")

KINDS = ("ddp", "fsdp2", "fsdp1")
SCORES = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
SAVE_AT = 3  # epochs reported before the mid-cycle save (growth at epochs 2, 4, 6)
SETTINGS = {"switch_mode": "fixed", "fixed_switch_num": 2, "max_dendrites": 3,
            "retain_all_dendrites": True, "dendrite_init": "default",
            "checkpoint_time_budget": None, "checkpoint_format": "dcp",
            # Adam's moments go on through each set, so a save right after one holds no state
            # for the new dendrites yet (the load leaves them without, as saved)
            "dendrite_optimizer": "carry"}


def make_model(seed: int) -> nn.Module:
    """7 and 3 output rows: uneven shards on 2 and 3 ranks."""
    torch.manual_seed(seed)
    return perfora.perforate(nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 3)))


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, epoch: int) -> None:
    """Three steps on batches every rank shares (the world size changes no gradient)."""
    model.train()
    for step in range(3):
        g = torch.Generator().manual_seed(100 * epoch + step)
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def wrap(model: nn.Module, kind: str, world: int) -> nn.Module:
    """The model as the run trains it: DDP, FSDP2 or FSDP1 over every rank, or bare (one
    process)."""
    if world == 1:
        return model
    if kind == "ddp":
        return perfora.parallel.wrap_ddp(model)
    if kind == "fsdp1":
        return perfora.parallel.wrap_fsdp1(model, device_id=torch.device("cpu"))
    from torch.distributed.device_mesh import init_device_mesh

    return perfora.parallel.shard_fsdp2(model, mesh=init_device_mesh("cpu", (world,)))


def snapshot(ctl: perfora.GrowthController) -> dict:
    """World-size-free view of a run: full tensors by name, structure, controller state."""
    model, opt = ctl.model, ctl.optimizer
    inner = perfora.unwrap_model(model)
    optim = {}
    if opt is not None and opt.state and ctl.backend.name == "fsdp1":  # flat shards
        full = get_optimizer_state_dict(model, opt, options=StateDictOptions(
            full_state_dict=True))
        # (a parameter not yet stepped reads as step 0 and zero moments there: left out, as
        # the other backends hold no state for it)
        optim = {name: {k: torch.as_tensor(v).tolist() for k, v in sorted(entry.items())}
                 for name, entry in full["state"].items()
                 if any(torch.as_tensor(v).any() for v in entry.values())}
    elif opt is not None and opt.state:
        sd, names = gather_optimizer_state(opt, inner)
        optim = {names[i]: {k: v.tolist() for k, v in entry.items()}
                 for i, entry in sd["state"].items()}
    full = ctl.backend.full_state(model)
    return {"params": {k: v.tolist() for k, v in sorted(full.items())},
            "optim": optim, "structure": perfora.nn.perforation.layer_specs(inner),
            "epoch": ctl.epoch, "dendrites": ctl.num_dendrites,
            "switch_epochs": ctl.state.switch_epochs, "best": ctl.best_score,
            "best_structure": None if ctl.best_snapshot is None else ctl.best_snapshot[0]}


def carry_on(ctl: perfora.GrowthController, epochs: range) -> tuple[list, dict]:
    """Train and report ``epochs``; the decisions and the end state."""
    decisions = []
    for epoch in epochs:
        train_epoch(ctl.model, ctl.optimizer, epoch)
        d = ctl.step(SCORES[epoch], model=ctl.model)
        decisions.append([d.action, d.num_dendrites, d.epoch])
    return decisions, snapshot(ctl)


def resume(path: Path, kind: str, world: int, run_dir: Path) -> perfora.GrowthController:
    """A fresh model (other weights), wrapped, then the run resumed from ``path``."""
    return perfora.resume(wrap(make_model(seed=77), kind, world), path,
                          optimizer=torch.optim.Adam, optimizer_args={"lr": 0.01},
                          run_dir=run_dir)


def uninterrupted(rank: int, world: int, tmp: str) -> dict:
    """Per kind: grow, save mid-cycle, go on; then resume the save in this same group."""
    out = {}
    for kind in KINDS:
        run = Path(tmp, kind)
        ctl = perfora.GrowthController(wrap(make_model(seed=5), kind, world), run_dir=run,
                                       **SETTINGS)
        ctl.set_optimizer(torch.optim.Adam, lr=0.01)
        ctl.build_optimizer()
        early, _ = carry_on(ctl, range(SAVE_AT))
        ctl.save(run / "mid.dcp")  # every rank writes its shards
        at_save = snapshot(ctl)
        later, end = carry_on(ctl, range(SAVE_AT, len(SCORES)))
        resumed = resume(run / "mid.dcp", kind, world, Path(tmp, f"{kind}_resumed_{world}"))
        loaded = snapshot(resumed)
        again, resumed_end = carry_on(resumed, range(SAVE_AT, len(SCORES)))
        out[kind] = {"early": early, "at_save": at_save, "later": later, "end": end,
                     "loaded": loaded, "again": again, "resumed_end": resumed_end,
                     "backend": resumed.backend.name}
    return out


def resumed_only(rank: int, world: int, tmp: str) -> dict:
    """Per kind: resume the 2-rank save on this world size and go on."""
    out = {}
    for kind in KINDS:
        ctl = resume(Path(tmp, kind, "mid.dcp"), kind, world,
                     Path(tmp, f"{kind}_resumed_{world}"))
        loaded = snapshot(ctl)
        again, end = carry_on(ctl, range(SAVE_AT, len(SCORES)))
        out[kind] = {"loaded": loaded, "again": again, "resumed_end": end,
                     "backend": ctl.backend.name}
    return out


def max_diff(a: dict, b: dict) -> float:
    """Largest difference between two {name: nested list} maps with the same names."""
    assert a.keys() == b.keys()
    return max(((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max().item()
                if torch.tensor(a[k]).numel() else 0.0) for k in a)


def optim_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(max_diff(a[n], b[n]) for n in a)


@pytest.fixture(scope="session")  # kept for the whole run: another module may run in between
def runs(tmp_path_factory) -> dict:
    """The shared runs: 2 ranks (uninterrupted + resumed), 3 ranks, and one process."""
    tmp = tmp_path_factory.mktemp("dcp")
    data = tmp / "data"
    data.mkdir()
    two = run_world(uninterrupted, tmp / "job2", 2, str(data))
    three = run_world(resumed_only, tmp / "job3", 3, str(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        one = resumed_only(0, 1, str(data))
    return {"data": data, "two": two, "three": three, "one": one,
            "one_warnings": [str(w.message) for w in caught]}


@pytest.mark.timeout(120)
def test_distributed_run_writes_dcp_folders_not_files(runs):
    for kind in KINDS:
        run = runs["data"] / kind
        for r in runs["two"]:
            assert [a for a, _, _ in r[kind]["early"]] == ["continue", "restructure",
                                                            "continue"]
            assert [a for a, _, _ in r[kind]["later"]] == ["restructure", "continue",
                                                            "restructure"]
        names = sorted(p.name for p in run.iterdir())
        assert not [n for n in names if n.endswith(".safetensors")], names
        assert {"latest.dcp", "best.dcp", "switch_1.dcp", "switch_2.dcp", "mid.dcp"} <= set(names)
        assert not [n for n in names if n.startswith(".")], names  # no temp folder left
        assert newest_switch(run) == 3  # growth at epochs 2, 4 and 6
        files = sorted(p.name for p in (run / "mid.dcp").iterdir())
        assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", META_FILE]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_resume_on_1_2_and_3_ranks_is_exact_at_load_and_continues(runs, kind):
    saved = runs["two"][0][kind]
    assert saved["at_save"]["dendrites"] == 1 and saved["at_save"]["optim"]
    for world, results in ((1, [runs["one"]]), (2, runs["two"]), (3, runs["three"])):
        for r in results:
            got = r[kind]
            assert got["backend"] == ("none" if world == 1 else kind)
            loaded = got["loaded"]
            for key in ("structure", "epoch", "dendrites", "switch_epochs", "best",
                        "best_structure"):
                assert loaded[key] == saved["at_save"][key], (world, key)
            # bit-identical at load: parameters and Adam moments
            assert max_diff(loaded["params"], saved["at_save"]["params"]) == 0.0, world
            assert optim_diff(loaded["optim"], saved["at_save"]["optim"]) == 0.0, world
            assert got["again"] == saved["later"], world  # the same decisions
            end, want = got["resumed_end"], saved["end"]
            assert end["structure"] == want["structure"]
            tol = 0.0 if world in (1, 2) else 1e-5  # (g+g)/2 == g; (g+g+g)/3 rounds
            assert max_diff(end["params"], want["params"]) <= tol, world
            # the last epoch grew a set: Adam's moments carried on for the old parameters
            assert want["optim"] and optim_diff(end["optim"], want["optim"]) <= tol, world


@pytest.mark.timeout(60)
def test_one_process_resume_falls_back_to_files_and_says_so(runs):
    assert any("checkpoint_format='dcp'" in w for w in runs["one_warnings"])
    for kind in KINDS:
        names = {p.name for p in (runs["data"] / f"{kind}_resumed_1").iterdir()}
        assert {"latest.safetensors", "switch_2.safetensors"} <= names, names
        assert not [n for n in names if n.endswith(".dcp")], names


def _copy(runs: dict, tmp: Path, kind: str = "fsdp2") -> Path:
    folder = tmp / "broken.dcp"
    shutil.copytree(runs["data"] / kind / "mid.dcp", folder)
    return folder


def _fresh() -> perfora.GrowthController:
    ctl = perfora.GrowthController(make_model(seed=3), write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    return ctl


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["no_meta", "no_metadata", "no_shard", "truncated_shard",
                                    "garbled_metadata", "pickle_payload", "other_shard",
                                    "meta_dev_zero", "metadata_dev_zero", "meta_fifo",
                                    "metadata_fifo"])
def test_a_corrupt_or_partial_folder_raises_checkpoint_error_naming_it(runs, tmp_path, damage):
    folder = _copy(runs, tmp_path)
    if damage == "no_meta":
        (folder / META_FILE).unlink()
    elif damage == "no_metadata":
        (folder / ".metadata").unlink()
    elif damage == "no_shard":
        (folder / "__1_0.distcp").unlink()
    elif damage == "truncated_shard":
        shard = folder / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "garbled_metadata":
        (folder / ".metadata").write_bytes(b"\x80\x04not a pickle")
    elif damage == "other_shard":  # the shard of another checkpoint (another structure)
        shutil.copy(runs["data"] / "fsdp2" / "switch_1.dcp" / "__0_0.distcp",
                    folder / "__0_0.distcp")
    elif damage.endswith("_dev_zero"):  # endless: read without a cap it exhausts memory
        name = META_FILE if damage.startswith("meta_") else ".metadata"
        (folder / name).unlink()
        (folder / name).symlink_to("/dev/zero")
    elif damage.endswith("_fifo"):  # nobody writes: a blocking read hangs for ever
        name = META_FILE if damage.startswith("meta_") else ".metadata"
        (folder / name).unlink()
        os.mkfifo(folder / name)
    else:  # a .metadata that would run code when unpickled with pickle.load
        import pickle

        class Evil:
            def __reduce__(self):
                return (Path(tmp_path / "pwned").touch, ())

        (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    ctl = _fresh()
    before = {k: v.clone() for k, v in ctl.model.state_dict().items()}
    specs, state = layer_specs(ctl.model), ctl.state_dict()
    with pytest.raises(CheckpointError, match="broken.dcp"):
        ctl.load(folder)
    with pytest.raises(CheckpointError, match="broken.dcp"):
        perfora.resume(make_model(seed=3), folder)
    assert not (tmp_path / "pwned").exists()
    after = ctl.model.state_dict()  # checked before anything changes
    assert before.keys() == after.keys()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    assert layer_specs(ctl.model) == specs and ctl.state_dict() == state


@pytest.mark.timeout(60)
def test_names_find_dcp_folders_and_a_write_cut_between_renames(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["data"] / "ddp", run)
    ctl = perfora.GrowthController(make_model(seed=3), run_dir=run, write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    decision = ctl.load("latest")
    assert decision.epoch == len(SCORES) and ctl.num_dendrites == 3
    # killed after the old folder was moved aside, before the new one took its name
    (run / "mid.dcp").rename(old_path(run / "mid.dcp"))
    assert ctl.load("mid").epoch == SAVE_AT
