"""Checkpoints: exact resume, load_model on fresh models, shape errors, unsafe files, atomicity."""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

import perfora
from perfora import (
    CheckpointError,
    ConversionError,
    GrowthController,
    ShapeMismatchError,
    dendritic_layers,
    load_checkpoint,
    load_model,
    save_model,
)

IN, HIDDEN, OUT = 8, 16, 3
BATCH = 32


class MLP(nn.Module):
    def __init__(self, hidden: int = HIDDEN, inputs: int = IN) -> None:
        super().__init__()
        self.fc_in = nn.Linear(inputs, hidden)
        self.fc_out = nn.Linear(hidden, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc_out(torch.relu(self.fc_in(x)))


def build(hidden: int = HIDDEN, inputs: int = IN, seed: int = 0, perforated: bool = True):
    torch.manual_seed(seed)
    model = MLP(hidden, inputs)
    return perfora.perforate(model) if perforated else model


def make_data():
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(IN, OUT, generator=g)
    x = torch.randn(96, IN, generator=g)
    xv = torch.randn(64, IN, generator=g)
    return x, (x @ w).argmax(1), xv, (xv @ w).argmax(1)


DATA = make_data()


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, epoch: int) -> float:
    """One epoch in a fixed order that depends only on the epoch index; returns val loss."""
    x, y, xv, yv = DATA
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1000 + epoch))
    for start in range(0, len(x), BATCH):
        idx = perm[start:start + BATCH]
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    with torch.no_grad():
        return F.cross_entropy(model(xv), yv).item()


def make_controller(model: nn.Module, run_dir: Path, **settings) -> GrowthController:
    base = {"maximize": False, "switch_mode": "fixed", "fixed_switch_num": 3,
            "max_dendrites": 5, "growth": "dendrites"}
    base.update(settings)
    ctl = GrowthController(model, run_dir=run_dir, **base)
    ctl.set_optimizer(torch.optim.Adam, lr=0.02)
    ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)
    return ctl


def train_until(ctl: GrowthController, model: nn.Module, opt, until: int) -> None:
    while ctl.epoch < until and not ctl.completed:
        decision = ctl.step(train_epoch(model, opt, ctl.epoch))
        opt = decision.optimizer


def comparable_state(ctl: GrowthController) -> dict:
    """Controller state without wall-clock times (the only thing allowed to differ)."""
    state = json.loads(json.dumps(ctl.state.to_dict()))
    for row in state["history"]:
        row.pop("seconds", None)
    return state


def assert_tensors_equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        assert a[key].dtype == b[key].dtype, f"{what}: {key}"
        assert a[key].shape == b[key].shape, f"{what}: {key}"
        assert torch.equal(a[key], b[key]), f"{what}: {key} differs"


def assert_optimizers_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for idx in sa["state"]:
        assert_tensors_equal(sa["state"][idx], sb["state"][idx], f"optimizer state {idx}")


def assert_same_run(ctl_a: GrowthController, model_a, ctl_b: GrowthController, model_b):
    assert_tensors_equal(model_a.state_dict(), model_b.state_dict(), "model")
    assert ctl_b.epoch == ctl_a.epoch
    assert ctl_b.num_dendrites == ctl_a.num_dendrites
    assert ctl_b.best_score == ctl_a.best_score
    assert ctl_b.state.switch_epochs == ctl_a.state.switch_epochs
    assert ctl_b.completed == ctl_a.completed
    assert comparable_state(ctl_b) == comparable_state(ctl_a)
    assert (ctl_a.optimizer is None) == (ctl_b.optimizer is None)
    if ctl_a.optimizer is not None:
        assert_optimizers_equal(ctl_a.optimizer, ctl_b.optimizer)
        assert ctl_b.scheduler.state_dict() == ctl_a.scheduler.state_dict()


def resume_run(tmp_path: Path, total: int, stop: int, load_from: str | None, **settings):
    """Run A: `total` epochs uninterrupted. Run B: `stop` epochs, then a fresh model and
    controller load `load_from` (None: a checkpoint B saves itself at `stop`, as a
    preemption handler would) and continue to `total`. Returns A, B and the loaded epoch."""
    model_a = build()
    ctl_a = make_controller(model_a, tmp_path / "a", **settings)
    opt, _ = ctl_a.build_optimizer()
    train_until(ctl_a, model_a, opt, total)

    model_b = build()
    ctl_b = make_controller(model_b, tmp_path / "b", **settings)
    opt, _ = ctl_b.build_optimizer()
    train_until(ctl_b, model_b, opt, stop)
    if load_from is None:
        load_from = str(tmp_path / "b" / "interrupted.safetensors")
        ctl_b.save(load_from)
    del model_b, ctl_b, opt

    fresh = build()
    ctl_r = make_controller(fresh, tmp_path / "b", **settings)
    decision = ctl_r.load(load_from)
    assert decision.model is fresh
    assert decision.optimizer is ctl_r.optimizer is not None
    loaded_epoch = decision.epoch
    train_until(ctl_r, fresh, decision.optimizer, total)
    return ctl_a, model_a, ctl_r, fresh, loaded_epoch


def test_resume_right_after_restructure_matches_uninterrupted_run(tmp_path):
    ctl_a, model_a, ctl_b, model_b, loaded = resume_run(tmp_path, total=7, stop=3,
                                                        load_from="latest")
    # the interruption really was right after the first restructure
    assert loaded == 3
    assert 3 in ctl_a.state.switch_epochs
    assert ctl_a.state.switch_epochs[-1] > 3, "a restructure must also happen after resume"
    assert ctl_a.num_dendrites >= 1
    assert_same_run(ctl_a, model_a, ctl_b, model_b)


def test_resume_mid_cycle_matches_uninterrupted_run(tmp_path):
    ctl_a, model_a, ctl_b, model_b, loaded = resume_run(tmp_path, total=8, stop=5,
                                                        load_from=None)
    assert loaded == 5
    assert ctl_a.state.switch_epochs[:1] == [3]
    assert any(e > 5 for e in ctl_a.state.switch_epochs)
    assert_same_run(ctl_a, model_a, ctl_b, model_b)


def test_resume_from_switch_file_after_running_further(tmp_path):
    # the PerforatedAI recipe's restart workflow: the run went on to epoch 5, then restarts
    # from switch_1
    ctl_a, model_a, ctl_b, model_b, loaded = resume_run(
        tmp_path, total=7, stop=5, load_from=str(tmp_path / "b" / "switch_1.safetensors"))
    assert loaded == 3
    assert_same_run(ctl_a, model_a, ctl_b, model_b)
    with (tmp_path / "b" / "metrics.csv").open() as handle:
        epochs = [line.split(",")[0] for line in handle.read().splitlines()[1:]]
    assert epochs == [str(e) for e in range(1, 8)], "metrics.csv must not keep stale rows"


def test_resume_then_failed_dendrite_set_rewinds_to_restored_best(tmp_path):
    # With dendrites the relative threshold cannot be met, so every dendrite set fails:
    # at epoch 6 the controller rewinds to the best snapshot (taken before the interruption
    # at epoch 4) and retries; at epoch 9 it gives up and restores the best model.
    settings = {"improvement_threshold": (1e-4, 10.0), "max_dendrite_tries": 2,
                "retain_all_dendrites": False}
    ctl_a, model_a, ctl_b, model_b, loaded = resume_run(tmp_path, total=12, stop=4,
                                                        load_from="latest", **settings)
    assert 3 <= loaded <= 4  # after the first restructure, before the failed set's end
    assert ctl_a.state.switch_epochs == [3, 6]
    assert ctl_a.state.tries == 1
    assert ctl_a.completed and ctl_a.epoch == 9
    assert ctl_a.num_dendrites == 0
    best_epoch = ctl_a.state.best_epoch
    assert best_epoch is not None and best_epoch <= 3
    assert_same_run(ctl_a, model_a, ctl_b, model_b)
    # the final model is the best snapshot, which run B only had from the checkpoint
    snapshot = load_checkpoint(tmp_path / "b" / "latest.safetensors").tensors["best"]
    assert_tensors_equal(dict(model_b.state_dict()), snapshot, "best snapshot")


def test_load_by_name_and_by_path_are_the_same(tmp_path):
    model = build()
    ctl = make_controller(model, tmp_path)
    opt, _ = ctl.build_optimizer()
    train_until(ctl, model, opt, 4)
    by_name, by_path = build(seed=5), build(seed=6)
    ctl_name = make_controller(by_name, tmp_path)
    ctl_name.load("latest")
    ctl_path = make_controller(by_path, tmp_path / "other")
    ctl_path.load(tmp_path / "latest.safetensors")
    assert ctl_name.epoch == ctl_path.epoch == 4
    assert_same_run(ctl_name, by_name, ctl_path, by_path)
    assert_same_run(ctl, model, ctl_path, by_path)


# ------------------------------------------------------------------ load_model


def grown_model(dendrites: int = 2, hidden: int = HIDDEN, seed: int = 0) -> nn.Module:
    """A perforated model with dendrites whose weights (v included) are all non-zero."""
    model = build(hidden=hidden, seed=seed)
    gen = torch.Generator().manual_seed(seed + 77)
    for layer in dendritic_layers(model).values():
        for _ in range(dendrites):
            layer.grow(gen)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def test_load_model_rebuilds_dendrites_on_unconverted_model(tmp_path):
    source = grown_model(dendrites=2)
    path = tmp_path / "model.safetensors"
    save_model(path, source)
    x = torch.randn(10, IN)

    fresh = build(seed=3, perforated=False)
    assert not dendritic_layers(fresh)
    returned = load_model(fresh, path)
    assert returned is fresh
    layers = dendritic_layers(fresh)
    assert set(layers) == {"fc_in", "fc_out"}
    assert all(layer.num_dendrites == 2 for layer in layers.values())
    assert_tensors_equal(dict(fresh.state_dict()), dict(source.state_dict()), "weights")
    with torch.no_grad():
        assert torch.equal(fresh(x), source(x))


def test_save_and_load_take_the_model_and_the_path_in_either_order(tmp_path):
    source = grown_model(dendrites=2)
    path = tmp_path / "model.safetensors"
    save_model(source, path)  # torch.save's order
    fresh = load_model(path, build(seed=3, perforated=False))
    assert_tensors_equal(dict(fresh.state_dict()), dict(source.state_dict()), "weights")
    perfora.save_dendrites(tmp_path / "d.safetensors", source)
    base = build(seed=3, perforated=False)
    perfora.load_dendrites(tmp_path / "d.safetensors", base)
    assert all(layer.num_dendrites == 2 for layer in dendritic_layers(base).values())
    with pytest.raises(TypeError, match="takes a model .* got PosixPath and str"):
        save_model(path, "model.safetensors")
    with pytest.raises(TypeError, match="got MLP and MLP"):
        load_model(source, source)


@pytest.mark.parametrize("dendrites_here", [0, 1, 3])
def test_load_model_into_converted_model_with_other_dendrite_count(tmp_path, dendrites_here):
    source = grown_model(dendrites=2)
    path = tmp_path / "model.safetensors"
    save_model(path, source)
    target = grown_model(dendrites=dendrites_here, seed=9)
    load_model(target, path)
    assert all(layer.num_dendrites == 2 for layer in dendritic_layers(target).values())
    x = torch.randn(10, IN)
    with torch.no_grad():
        assert torch.equal(target(x), source(x))
    # the loaded model still trains: every parameter gets a gradient
    target(x).sum().backward()
    assert all(p.grad is not None for p in target.parameters())


def test_load_model_reads_controller_checkpoints(tmp_path):
    model = build()
    ctl = make_controller(model, tmp_path)
    opt, _ = ctl.build_optimizer()
    train_until(ctl, model, opt, 4)
    fresh = build(seed=11, perforated=False)
    load_model(fresh, tmp_path / "latest.safetensors")
    x = torch.randn(5, IN)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


# ------------------------------------------------------------------ shape errors

SHAPE_ERRORS = (ShapeMismatchError, ConversionError, CheckpointError)


def assert_names_mismatch(message: str, layer: str, ours: int, theirs: int) -> None:
    """The message names the layer/tensor and both sizes: neuron counts (16 vs 12) or the
    shapes of a tensor that scales with them (e.g. a 2-dendrite bank: 32 vs 24)."""
    assert layer in message, f"the message does not name {layer!r}: {message}"
    for k in (1, 2):
        if re.search(rf"\b{ours * k}\b", message) and re.search(rf"\b{theirs * k}\b", message):
            return
    raise AssertionError(f"the message does not give both sizes ({ours} vs {theirs}): "
                         f"{message}")


def test_load_model_into_narrower_unconverted_model_names_layer_and_shapes(tmp_path):
    path = tmp_path / "model.safetensors"
    save_model(path, grown_model(hidden=16))
    with pytest.raises(SHAPE_ERRORS) as info:
        load_model(build(hidden=12, perforated=False), path)
    assert_names_mismatch(str(info.value), "fc_", 16, 12)


def test_load_model_into_narrower_converted_model_names_layer_and_neurons(tmp_path):
    path = tmp_path / "model.safetensors"
    save_model(path, grown_model(hidden=16))
    with pytest.raises(SHAPE_ERRORS) as info:
        load_model(grown_model(hidden=12, dendrites=2), path)
    assert_names_mismatch(str(info.value), "fc_in", 16, 12)


def test_load_model_with_other_input_width_names_tensor_and_shapes(tmp_path):
    path = tmp_path / "model.safetensors"
    save_model(path, grown_model())
    with pytest.raises(SHAPE_ERRORS) as info:
        load_model(build(inputs=IN + 3, perforated=False), path)
    assert_names_mismatch(str(info.value), "fc_in", IN, IN + 3)


def test_controller_load_into_other_shape_raises_checkpoint_error(tmp_path):
    model = build()
    ctl = make_controller(model, tmp_path)
    opt, _ = ctl.build_optimizer()
    train_until(ctl, model, opt, 4)
    other = build(hidden=12)
    with pytest.raises(CheckpointError) as info:
        make_controller(other, tmp_path / "other").load(tmp_path / "latest.safetensors")
    assert_names_mismatch(str(info.value), "fc_in", 16, 12)


# ------------------------------------------------------------------ unsafe/corrupt files


def _controller_load(path):
    ctl = make_controller(build(), path.parent / "resume")
    return ctl.load(path)


LOADERS = {
    "load_checkpoint": load_checkpoint,
    "load_model": lambda path: load_model(build(perforated=False), path),
    "controller.load": _controller_load,
}


def good_checkpoint_bytes(tmp_path: Path) -> bytes:
    model = build()
    ctl = make_controller(model, None)
    opt, _ = ctl.build_optimizer()
    train_until(ctl, model, opt, 4)
    path = tmp_path / "good.safetensors"
    ctl.save(path)
    return path.read_bytes()


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes_raise_checkpoint_error(tmp_path, loader, seed):
    gen = torch.Generator().manual_seed(seed)
    data = bytes(torch.randint(0, 256, (4096,), generator=gen, dtype=torch.uint8).tolist())
    if seed == 2:  # a plausible header length followed by garbage
        data = struct.pack("<Q", 100) + data
    path = tmp_path / "random.safetensors"
    path.write_bytes(data)
    with pytest.raises(CheckpointError):
        LOADERS[loader](path)


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("cut", ["half", "after_header", "header_only_part", "seven_bytes"])
def test_truncated_file_raises_checkpoint_error(tmp_path, loader, cut):
    data = good_checkpoint_bytes(tmp_path)
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    size = {"half": len(data) // 2, "after_header": header_end + 1,
            "header_only_part": header_end // 2, "seven_bytes": 7}[cut]
    assert size < len(data)
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[:size])
    with pytest.raises(CheckpointError):
        LOADERS[loader](path)


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_empty_file_raises_checkpoint_error(tmp_path, loader):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError):
        LOADERS[loader](path)


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_missing_file_raises_checkpoint_error(tmp_path, loader):
    with pytest.raises(CheckpointError):
        LOADERS[loader](tmp_path / "nothing_here.safetensors")


class MarkerOnUnpickle:
    """Unpickling this object creates the file at ``marker`` (as a malicious pickle would)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_marker_object_does_create_its_file_when_unpickled(tmp_path):
    # guard for the test below: the trap really fires when something unpickles it
    marker = tmp_path / "fired"
    handle = pickle.loads(pickle.dumps(MarkerOnUnpickle(marker)))
    handle.close()
    assert marker.exists()


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("zip_format", [True, False])
def test_torch_save_file_is_refused_without_unpickling(tmp_path, loader, zip_format):
    marker = tmp_path / "unpickled"
    path = tmp_path / "model.pt"
    payload = {"model": build().state_dict(), "trap": MarkerOnUnpickle(marker)}
    torch.save(payload, path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(CheckpointError) as info:
        LOADERS[loader](path)
    assert not marker.exists(), "perfora unpickled a torch.save file"
    assert "pickle" in str(info.value).lower()


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_plain_safetensors_without_perfora_metadata_is_refused(tmp_path, loader, metadata):
    path = tmp_path / "plain.safetensors"
    safetensors.torch.save_file(dict(build().state_dict()), path, metadata=metadata)
    with pytest.raises(CheckpointError):
        LOADERS[loader](path)


def test_controller_load_of_weights_only_file_raises_checkpoint_error(tmp_path):
    path = tmp_path / "weights.safetensors"
    save_model(path, grown_model())
    with pytest.raises(CheckpointError):
        make_controller(build(), tmp_path / "run").load(path)


# ------------------------------------------------------------------ atomic writes


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()
                  if p.name.startswith(".") or "tmp" in p.name.lower())


def test_run_folder_has_no_temp_files_after_a_run(tmp_path):
    model = build()
    ctl = make_controller(model, tmp_path, max_dendrites=1)
    opt, _ = ctl.build_optimizer()
    train_until(ctl, model, opt, 20)
    assert ctl.completed
    assert leftovers(tmp_path) == []


def test_failed_rename_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    model = build()
    ctl = make_controller(model, None)
    opt, _ = ctl.build_optimizer()
    train_until(ctl, model, opt, 2)
    path = tmp_path / "ckpt.safetensors"
    ctl.save(path)
    before = path.read_bytes()
    train_until(ctl, model, ctl.optimizer, 4)

    real_replace = os.replace
    calls = []

    def failing_replace(src, dst, *args, **kwargs):
        calls.append(dst)
        if len(calls) == 1:
            raise OSError(28, "No space left on device (injected)")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        ctl.save(path)
    assert calls, "the write did not go through os.replace (not atomic?)"
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []
    assert load_checkpoint(path).meta["controller"]["epoch"] == 2
    ctl.save(path)  # the next write succeeds
    assert load_checkpoint(path).meta["controller"]["epoch"] == 4


def test_unserializable_metadata_leaves_previous_file_intact(tmp_path):
    path = tmp_path / "model.safetensors"
    save_model(path, grown_model())
    before = path.read_bytes()
    with pytest.raises(CheckpointError):
        save_model(path, grown_model(seed=4), note=object())
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_checkpoint_whose_header_length_starts_with_0x80_is_not_taken_for_a_pickle(
        tmp_path: Path) -> None:
    """A safetensors header length whose low byte is 0x80 (1 file in 256) must load."""
    from perfora.checkpoint.format import Checkpoint, load_checkpoint, save_checkpoint

    path = tmp_path / "c.safetensors"
    for pad in range(600):
        save_checkpoint(path, Checkpoint(tensors={"model": {"w": torch.zeros(2)}},
                                         meta={"pad": "x" * pad}))
        if path.read_bytes()[0] == 0x80:
            break
    else:
        raise AssertionError("no padding gave a header length starting with 0x80")
    loaded = load_checkpoint(path)
    assert torch.equal(loaded.tensors["model"]["w"], torch.zeros(2))


def test_a_completed_run_that_rewound_to_no_dendrites_saves_a_loadable_checkpoint(tmp_path):
    # every set is discarded (the scores keep falling), so completion rewinds to 0 dendrites
    # and the optimizer still holds the discarded parameters: it must not be saved as theirs
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    ctl = perfora.GrowthController(model, switch_mode="every_epoch", max_dendrites=3,
                                   retain_all_dendrites=False, run_dir=tmp_path / "a",
                                   growth="dendrites")
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    opt, _ = ctl.build_optimizer()
    for score in [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]:
        opt.zero_grad()
        model(torch.randn(8, 3)).sum().backward()
        opt.step()
        decision = ctl.step(score)
        opt = decision.optimizer or opt
        if decision.complete:
            break
    assert decision.complete and ctl.num_dendrites == 0
    ctl.save(tmp_path / "done.safetensors")
    fresh = perfora.perforate(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    again = perfora.GrowthController(fresh, run_dir=tmp_path / "b")
    again.set_optimizer(torch.optim.Adam, lr=0.01)
    again.build_optimizer()
    again.load(tmp_path / "done.safetensors")
    assert again.completed and again.num_dendrites == 0
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name


def test_optimizer_state_saved_by_name_loads_onto_each_parameter() -> None:
    """A state saved by parameter name (as FSDP1 and DeepSpeed save it), in another order
    than this optimizer's, lands on the parameter of each name, not on the same index."""
    from perfora.parallel import backend_of

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    names = [n for n, _ in model.named_parameters()]
    order = list(reversed(names))  # the saving side numbered them the other way round
    params = dict(model.named_parameters())
    saved = {"state": {i: {k: v.clone() for k, v in optimizer.state[params[n]].items()}
                       for i, n in enumerate(order)},
             "param_groups": [{**{k: v for k, v in optimizer.param_groups[0].items()
                                  if k != "params"}, "lr": 0.005,
                               "params": list(range(len(order)))}]}
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    backend_of(model).load_optimizer_state(fresh, model, saved, {"param_names": order})
    for name, p in params.items():
        assert torch.equal(fresh.state[p]["exp_avg"], optimizer.state[p]["exp_avg"]), name
    assert fresh.param_groups[0]["lr"] == 0.005
    with pytest.raises(ValueError, match="names no parameter"):
        backend_of(model).load_optimizer_state(fresh, model, saved,
                                               {"param_names": ["other"] * len(order)})


def test_a_scheduler_state_json_cannot_hold_is_left_out_with_a_warning() -> None:
    from perfora.checkpoint.optimizer_state import scheduler_state_or_none

    assert scheduler_state_or_none({"last_epoch": 3, "base_lrs": [0.1]}) == {
        "last_epoch": 3, "base_lrs": [0.1]}
    assert scheduler_state_or_none(None) is None
    with pytest.warns(UserWarning, match="restarts from its initial state"):
        assert scheduler_state_or_none({"fn": object()}) is None
