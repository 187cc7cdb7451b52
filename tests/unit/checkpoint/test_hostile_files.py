"""Hostile files: checkpoints checked before anything changes, run files that symlinks
cannot redirect, durable writes, stale temp files removed (issue 12, items 4 and 5)."""

from __future__ import annotations

import atexit
import copy
import dataclasses
import json
import math
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import perfora
from perfora import (
    CheckpointError,
    ControllerState,
    GrowthController,
    ShapeMismatchError,
    load_checkpoint,
)
from perfora.checkpoint import files as ckpt_module
from perfora.checkpoint import schema as checkpoint_schema
from perfora.checkpoint.files import append_text, remove_stale_temp_files
from perfora.growth import run_writer as run_writer_module
from perfora.nn.layers import DendriticLayer
from perfora.nn.perforation import layer_specs

X = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))


def mlp(out: int = 2, perforated: bool = True, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, out))
    return perfora.perforate(model) if perforated else model


def controller(model: nn.Module, run_dir: Path | None = None, **settings: Any
               ) -> GrowthController:
    ctl = GrowthController(model, run_dir=run_dir, maximize=False, **settings)
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)
    ctl.build_optimizer()
    return ctl


def train(ctl: GrowthController, scores: list[float]) -> None:
    for score in scores:
        opt = ctl.optimizer
        opt.zero_grad()
        ctl.model(X).pow(2).mean().backward()
        opt.step()
        ctl.step(score)


_GOOD: dict[str, bytes] = {}


def good_bytes() -> bytes:
    """A 4-3-2 MLP run with one dendrite set, Adam and StepLR state, a best snapshot."""
    if "run" not in _GOOD:
        ctl = controller(mlp())
        train(ctl, [1.0, 0.9])
        ctl.add_dendrites()
        train(ctl, [0.8, 0.85])
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "good.safetensors"
            ctl.save(path)
            _GOOD["run"] = path.read_bytes()
    return _GOOD["run"]


def split_file(data: bytes) -> tuple[dict, bytes]:
    size = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + size]), data[8 + size:]


def join_file(header: dict, body: bytes, raw: bytes | None = None) -> bytes:
    if raw is None:
        raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


def with_meta(data: bytes, mutate: Callable[[dict], Any]) -> bytes:
    """The file with its perfora metadata changed by ``mutate`` (in place)."""
    header, body = split_file(data)
    meta = json.loads(header["__metadata__"]["perfora"])
    mutate(meta)
    header["__metadata__"]["perfora"] = json.dumps(meta)
    return join_file(header, body)


def write(tmp_path: Path, data: bytes, name: str = "ckpt.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------ "untouched" snapshots

def snapshot(ctl: GrowthController | None, model: nn.Module) -> dict[str, Any]:
    """Everything a failed load must leave as it was, tensors cloned."""
    inner = perfora.unwrap_model(model)
    out: dict[str, Any] = {
        "modules": [(name, type(m).__name__) for name, m in inner.named_modules()],
        "params": [(name, id(p), p.requires_grad, p.detach().clone())
                   for name, p in inner.named_parameters()],
        "buffers": [(name, b.clone()) for name, b in inner.named_buffers()],
        "dendrites": {p: (layer.num_dendrites, layer.set_neurons(), layer.activation)
                      for p, layer in perfora.dendritic_layers(inner).items()},
    }
    if ctl is not None:
        opt = ctl.optimizer
        out.update({
            "model_object": id(ctl.model),
            "state": json.dumps(ctl.state.to_dict(), sort_keys=True),
            "rule": json.dumps(ctl.rule.state_dict(), sort_keys=True),
            "best": None if ctl.best_snapshot is None else copy.deepcopy(ctl.best_snapshot),
            "optimizer_object": id(opt),
            "groups": None if opt is None else [
                ([id(p) for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
                for g in opt.param_groups],
            "optimizer_state": None if opt is None else copy.deepcopy(opt.state_dict()),
            "scheduler": None if ctl.scheduler is None else ctl.scheduler.state_dict(),
        })
    return out


def assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} changed"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# ------------------------------------------------------------------ field checks

def load_error(tmp_path: Path, mutate: Callable[[dict], Any]) -> str:
    path = write(tmp_path, with_meta(good_bytes(), mutate))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    return str(info.value)


@pytest.mark.parametrize("bad", [-1, 10**9, 1.5, "2", None, True])
def test_dendrite_count_out_of_range_names_the_field(tmp_path: Path, bad: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # refused before anything is allocated: no layer is ever resized
    def no_resize(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a layer was resized before the file was checked")

    monkeypatch.setattr(DendriticLayer, "resize", no_resize)

    def mutate(meta: dict) -> None:
        meta["structure"]["0"]["num_dendrites"] = bad

    message = load_error(tmp_path, mutate)
    assert f"structure['0'].num_dendrites: expected an int in 0..4096, got {bad!r}" in message
    path = write(tmp_path, with_meta(good_bytes(), mutate), "again.safetensors")
    model = mlp()
    before = snapshot(None, model)
    with pytest.raises(CheckpointError):
        perfora.load_model(model, path)
    assert_same(before, snapshot(None, model))


def test_dendrite_count_must_agree_with_the_tensors(tmp_path: Path) -> None:
    def mutate(meta: dict) -> None:
        meta["structure"]["2"]["num_dendrites"] = 2

    message = load_error(tmp_path, mutate)
    assert "structure['2'].num_dendrites" in message
    assert "model/2.out_weight should have shape [2, 2]" in message
    assert "[1, 2]" in message


@pytest.mark.parametrize(("field", "bad", "expected"), [
    ("epoch", -1, "controller.epoch: expected an int in 0..1000000000000, got -1"),
    ("epoch", "3", "controller.epoch: expected an int in 0..1000000000000, got '3'"),
    ("epoch", 2.5, "controller.epoch: expected an int in 0..1000000000000, got 2.5"),
    ("history", {"a": 1}, "controller.history: expected a list, got an object with 1 key(s)"),
    ("switch_epochs", [1, -4], "controller.switch_epochs[1]: expected an int"),
    ("global_best", "inf", "controller.global_best: expected a number or null, got 'inf'"),
    ("completed", 1, "controller.completed: expected true or false, got 1"),
    ("arch", {"x": {}}, "controller.arch: expected dendrite counts as keys, got 'x'"),
])
def test_controller_fields_are_checked(tmp_path: Path, field: str, bad: Any,
                                       expected: str) -> None:
    def mutate(meta: dict) -> None:
        meta["controller"][field] = bad

    assert expected in load_error(tmp_path, mutate)


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(ControllerState)])
def test_every_saved_controller_field_is_checked(tmp_path: Path, field: str) -> None:
    def mutate(meta: dict) -> None:
        meta["controller"][field] = "x"

    assert f"controller.{field}: expected" in load_error(tmp_path, mutate)


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda m: m["controller"]["history"][0].pop("epoch"), "controller.history[0].epoch: missing"),
    (lambda m: m["controller"]["history"][1].update(val_score="high"),
     "controller.history[1]['val_score']: expected a number or null, got 'high'"),
    (lambda m: m["structure"]["0"].pop("num_neurons"), "structure['0'].num_neurons: missing"),
    (lambda m: m["structure"]["0"].update(activation="gelu"),
     "structure['0'].activation: expected one of ['relu', 'sigmoid', 'tanh'], got 'gelu'"),
    (lambda m: m["structure"].update({"0": [1, 2]}),
     "structure['0']: expected an object, got a list of 2"),
    (lambda m: m.update(controller=[]), "controller: expected an object, got a list of 0"),
    (lambda m: m.update(format_version="1"), "format_version: expected an int"),
    (lambda m: m["optimizer"]["param_groups"][0].update(params=[0, 0]),
     "optimizer.param_groups[0].params[1]: expected a parameter index listed once, got 0"),
    (lambda m: m["optimizer"]["state"].update({"99": {}}),
     "optimizer.state: expected keys that are parameter indices, got '99'"),
    (lambda m: m["rule"].update(phase=["neuron"]), "rule.phase: expected a string"),
    (lambda m: m.update(best_structure=None),
     "best_structure: missing, but the file holds best-model tensors"),
])
def test_malformed_state_names_the_field(tmp_path: Path, mutate: Callable, expected: str
                                         ) -> None:
    assert expected in load_error(tmp_path, mutate)


@pytest.mark.parametrize("depth", [80, 100_000])
def test_deeply_nested_json_is_a_checkpoint_error(tmp_path: Path, depth: int) -> None:
    def mutate(meta: dict) -> None:
        meta["note"] = "@"

    header, body = split_file(with_meta(good_bytes(), mutate))
    text = header["__metadata__"]["perfora"].replace('"@"', "[" * depth + "]" * depth)
    header["__metadata__"]["perfora"] = text
    path = write(tmp_path, join_file(header, body))
    with pytest.raises(CheckpointError, match="nested too deeply"):
        load_checkpoint(path)
    # the same in the safetensors header itself
    raw = json.dumps(split_file(good_bytes())[0]).encode()
    raw = raw[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    path = write(tmp_path, join_file({}, split_file(good_bytes())[1], raw))
    with pytest.raises(CheckpointError, match="nested too deeply|deep"):
        load_checkpoint(path)


def test_invalid_json_duplicate_keys_and_oversized_headers(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    header, body = split_file(good_bytes())
    header["__metadata__"]["perfora"] = "{not json"
    with pytest.raises(CheckpointError, match="perfora metadata is not valid JSON"):
        load_checkpoint(write(tmp_path, join_file(header, body)))
    raw = json.dumps(split_file(good_bytes())[0]).encode()
    dup = raw[:-1] + b', "__metadata__": {"perfora": "{}"}}'
    with pytest.raises(CheckpointError, match="duplicate key '__metadata__'"):
        load_checkpoint(write(tmp_path, join_file({}, body, dup)))
    monkeypatch.setattr(checkpoint_schema, "MAX_HEADER_BYTES", 1024)
    with pytest.raises(CheckpointError, match="more than the 1024"):
        load_checkpoint(write(tmp_path, good_bytes()))


@pytest.mark.parametrize(("field", "bad", "expected"), [
    ("dtype", "F33", ".dtype: expected one of"),
    ("shape", [10**9, 1000], "is 4000000000000 bytes but its data_offsets span 8"),
    ("shape", [-3, 2], ".shape[0]: expected an int in 0.."),
    ("data_offsets", [0, 2**40], ".data_offsets[1]: expected an int in 0.."),
    ("data_offsets", [8], ".data_offsets: expected [begin, end]"),
])
def test_tensor_entries_are_checked_against_the_file_size(tmp_path: Path, field: str, bad: Any,
                                                          expected: str) -> None:
    header, body = split_file(good_bytes())
    name = "model/2.out_weight"
    header[name][field] = bad
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(write(tmp_path, join_file(header, body)))
    assert f"tensor['{name}']" in str(info.value)
    assert expected in str(info.value)


def test_a_huge_file_is_refused_from_its_header_without_reading_it(tmp_path: Path) -> None:
    path = write(tmp_path, good_bytes())
    try:
        with open(path, "r+b") as handle:
            handle.truncate(6 * 2**30)  # sparse: 6 GB that the header does not account for
    except OSError:
        pytest.skip("no sparse files here")
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="truncated or padded"):
        load_checkpoint(path)
    assert time.perf_counter() - start < 5


def test_bool_tensors_hold_only_zero_and_one(tmp_path: Path) -> None:
    from perfora.checkpoint.format import Checkpoint, save_checkpoint

    path = tmp_path / "mask.safetensors"
    save_checkpoint(path, Checkpoint(tensors={"model": {"m": torch.tensor([True, False])}}))
    data = bytearray(path.read_bytes())
    assert data[-2:] == b"\x01\x00"
    data[-1] = 7
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="bool but holds bytes"):
        load_checkpoint(path)


def test_a_good_file_still_loads_exactly(tmp_path: Path) -> None:
    path = write(tmp_path, good_bytes())
    loaded = load_checkpoint(path)
    import safetensors.torch

    reference = safetensors.torch.load(good_bytes())
    flat = {f"{g}/{k}": v for g, group in loaded.tensors.items() for k, v in group.items()}
    assert flat.keys() == reference.keys()
    for key, value in reference.items():
        assert flat[key].dtype == value.dtype and torch.equal(flat[key], value), key


# ------------------------------------------------------------------ nothing changes on failure

def test_rejected_load_leaves_model_controller_and_optimizer_untouched(tmp_path: Path) -> None:
    """A 4-3-2 checkpoint with one dendrite set into a 4-3-5 model: refused, and before
    the fix the first layer had grown a dendrite, the second not, the optimizer lost state."""
    path = write(tmp_path, good_bytes())
    ctl = controller(mlp(out=5, seed=3))
    train(ctl, [2.0, 1.5])
    before = snapshot(ctl, ctl.model)
    with pytest.raises(CheckpointError) as info:
        ctl.load(path)
    assert "'2'" in str(info.value) and "5" in str(info.value)
    assert_same(before, snapshot(ctl, ctl.model))
    train(ctl, [1.2])  # and it still trains


def test_rejected_load_model_leaves_a_plain_model_unconverted(tmp_path: Path) -> None:
    path = write(tmp_path, good_bytes())
    for model in (mlp(out=5, perforated=False), mlp(out=5)):
        before = snapshot(None, model)
        with pytest.raises(ShapeMismatchError):
            perfora.load_model(model, path)
        assert_same(before, snapshot(None, model))


def test_rejected_resume_leaves_the_model_unconverted(tmp_path: Path) -> None:
    path = write(tmp_path, good_bytes())
    model = mlp(out=5, perforated=False)
    before = snapshot(None, model)
    with pytest.raises(CheckpointError):
        perfora.resume(model, path, optimizer=torch.optim.Adam, optimizer_args={"lr": 0.01},
                       run_dir=tmp_path / "run")
    assert_same(before, snapshot(None, model))
    assert not perfora.dendritic_layers(model)


def test_resume_refuses_a_bad_saved_config_naming_it(tmp_path: Path) -> None:
    def mutate(meta: dict) -> None:
        meta["config"]["max_dendrites"] = -3

    path = write(tmp_path, with_meta(good_bytes(), mutate))
    model = mlp(perforated=False)
    with pytest.raises(CheckpointError, match="config: .*max_dendrites"):
        perfora.resume(model, path)
    assert not perfora.dendritic_layers(model)


@pytest.mark.parametrize("case", ["optimizer_groups", "optimizer_lr", "scheduler_key",
                                  "best_structure", "rule_trend"])
def test_state_that_does_not_fit_is_refused_before_the_model_changes(tmp_path: Path,
                                                                     case: str) -> None:
    def mutate(meta: dict) -> None:
        if case == "optimizer_groups":
            meta["optimizer"]["param_groups"][0]["params"].append(99)
        elif case == "optimizer_lr":
            meta["optimizer"]["param_groups"][0]["lr"] = "fast"
        elif case == "scheduler_key":
            meta["scheduler"]["optimizer"] = 0
        elif case == "best_structure":
            meta["best_structure"]["0"]["num_neurons"] = 4
        else:
            meta["rule"]["trends"] = {"0": [0.5]}

    path = write(tmp_path, with_meta(good_bytes(), mutate))
    ctl = controller(mlp(seed=4))
    train(ctl, [3.0])
    before = snapshot(ctl, ctl.model)
    with pytest.raises(CheckpointError) as info:
        ctl.load(path)
    expected = {"optimizer_groups": "optimizer state does not fit",
                "optimizer_lr": "optimizer.param_groups[0].lr: expected a number",
                "scheduler_key": "scheduler: expected only the keys",
                "best_structure": "best_structure",
                "rule_trend": "rule.trends['0']: expected one value per neuron (3)"}[case]
    assert expected in str(info.value)
    assert_same(before, snapshot(ctl, ctl.model))


def test_load_state_and_match_structure_check_first(tmp_path: Path) -> None:
    ctl = controller(mlp(seed=5))
    train(ctl, [1.0])
    saved = {**ctl.state_dict(), "best_structure": None}
    before = snapshot(ctl, ctl.model)
    bad = copy.deepcopy(saved)
    bad["controller"]["epoch"] = -2
    with pytest.raises(CheckpointError, match="controller.epoch: expected an int"):
        ctl.load_state(bad)
    bad = copy.deepcopy(saved)
    bad["rule"] = {"phase": 3}
    with pytest.raises(CheckpointError, match="rule.phase"):
        ctl.load_state(bad)
    specs = layer_specs(ctl.model)
    specs["2"]["num_dendrites"] = -1
    with pytest.raises(CheckpointError, match=r"structure\['2'\].num_dendrites"):
        ctl.match_structure(specs)
    specs = layer_specs(ctl.model)
    specs["2"]["num_neurons"] = 7
    with pytest.raises(CheckpointError, match="7"):
        ctl.match_structure(specs)
    assert_same(before, snapshot(ctl, ctl.model))


# ------------------------------------------------------------------ fuzzing

HOSTILE = st.one_of(
    st.sampled_from([-1, 0, 1, 10**9, 2**64, -(2**63), 1e308, -0.5, float("nan"),
                     float("inf"), "", "x", "neuron", None, True, False, [], {}, [1, 2, 3],
                     [[0, 1]], {"a": 1}, [None]]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=6),
)


def _nodes(value: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value inside ``value``."""
    out, stack = [], [value]
    while stack:
        node = stack.pop()
        keys = list(node) if isinstance(node, dict) else range(len(node))
        for key in keys:
            out.append((node, key))
            if isinstance(node[key], dict | list):
                stack.append(node[key])
    return out


def _mutate_tree(tree: dict, data: st.DataObject, skip: tuple[str, ...] = ()) -> None:
    top = data.draw(st.sampled_from(sorted(k for k in tree if k not in skip)))
    nodes = [(tree, top)] + (_nodes(tree[top]) if isinstance(tree[top], dict | list) else [])
    parent, key = data.draw(st.sampled_from(nodes))
    action = data.draw(st.sampled_from(["replace", "replace", "delete", "insert", "nest"]))
    if action == "delete":
        del parent[key]
    elif action == "insert" and isinstance(parent, dict):
        parent[data.draw(st.text(max_size=8))] = data.draw(HOSTILE)
    elif action == "nest":
        value: Any = parent[key]
        for _ in range(data.draw(st.integers(1, 200))):
            value = [value]
        parent[key] = value
    else:
        parent[key] = data.draw(HOSTILE)


def hostile_file(data: st.DataObject) -> bytes:
    """A real checkpoint with its JSON state, its tensor header or its bytes damaged."""
    good = good_bytes()
    kind = data.draw(st.sampled_from(["meta", "meta", "meta", "tensors", "truncate", "flip"]))
    if kind == "meta":
        return with_meta(good, lambda meta: _mutate_tree(meta, data))
    if kind == "tensors":
        header, body = split_file(good)
        _mutate_tree(header, data, skip=("__metadata__",))
        return join_file(header, body)
    if kind == "truncate":
        return good[:data.draw(st.integers(0, len(good) - 1))]
    flipped = bytearray(good)
    size = struct.unpack("<Q", good[:8])[0]
    end = data.draw(st.sampled_from([8 + size, len(good)]))  # the header, or anywhere
    for _ in range(data.draw(st.integers(1, 6))):
        flipped[data.draw(st.integers(0, end - 1))] ^= data.draw(st.integers(1, 255))
    return bytes(flipped)


FUZZ_DIR = Path(tempfile.mkdtemp(prefix="perfora-fuzz-"))
atexit.register(shutil.rmtree, FUZZ_DIR, ignore_errors=True)


def fuzz_one(data: st.DataObject) -> str:
    """Load a damaged file with a drawn loader; checks, and returns 'rejected' or 'loaded'."""
    path = FUZZ_DIR / "fuzz.safetensors"
    path.write_bytes(hostile_file(data))
    loader = data.draw(st.sampled_from(["controller", "controller", "load_model", "resume"]))
    if loader == "controller":
        ctl: GrowthController | None = controller(mlp(seed=7))
        model = ctl.model
    else:
        ctl, model = None, mlp(seed=7, perforated=loader == "load_model")
    before = snapshot(ctl, model)
    try:
        if loader == "controller":
            ctl.load(path)
        elif loader == "load_model":
            perfora.load_model(model, path)
        else:
            ctl = perfora.resume(model, path, optimizer=torch.optim.Adam,
                                 optimizer_args={"lr": 0.01},
                                 scheduler=torch.optim.lr_scheduler.StepLR,
                                 scheduler_args={"step_size": 2, "gamma": 0.5},
                                 run_dir=FUZZ_DIR / "run")
    except CheckpointError:  # ShapeMismatchError is one too; anything else fails the test
        assert_same(before, snapshot(ctl if loader == "controller" else None, model))
        return "rejected"
    # the damage was harmless (e.g. another score): the run goes on, and saves and loads
    model(X).pow(2).mean().backward()
    if ctl is not None:
        if ctl.optimizer is not None:
            ctl.optimizer.step()
        if not ctl.completed:
            ctl.step(0.5)
        ctl.save(FUZZ_DIR / "again.safetensors")
        controller(mlp(seed=8)).load(FUZZ_DIR / "again.safetensors")
    return "loaded"


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_checkpoints_raise_checkpoint_errors_and_change_nothing(data: st.DataObject
                                                                       ) -> None:
    fuzz_one(data)


# ------------------------------------------------------------------ run files

def run_folder(tmp_path: Path) -> tuple[GrowthController, Path]:
    folder = tmp_path / "run"
    ctl = controller(mlp(), run_dir=folder, checkpoint_time_budget=None)
    train(ctl, [1.0, 0.9])
    return ctl, folder


def test_a_symlink_planted_at_metrics_csv_does_not_redirect_appends(tmp_path: Path) -> None:
    ctl, folder = run_folder(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    (folder / "metrics.csv").unlink()
    (folder / "metrics.csv").symlink_to(outside)
    train(ctl, [0.8, 0.7])
    assert outside.read_text() == "precious\n"
    metrics = folder / "metrics.csv"
    assert not metrics.is_symlink() and metrics.is_file()
    rows = metrics.read_text().splitlines()
    assert len(rows) == 1 + 4 and rows[0].startswith("epoch,")


@pytest.mark.parametrize("name", ["run.json", "best_arch_scores.csv", "history.png",
                                  "latest.safetensors", "best.safetensors"])
def test_symlinks_planted_at_other_run_files_are_replaced_not_followed(tmp_path: Path,
                                                                       name: str) -> None:
    ctl, folder = run_folder(tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    target = folder / name
    if target.exists():
        target.unlink()
    target.symlink_to(outside)
    if name == "run.json":
        controller(mlp(), run_dir=folder)  # a new controller writes run.json
    else:
        train(ctl, [0.5])
        ctl.add_dendrites()  # a restructure: every file is written
        train(ctl, [0.4])
        ctl.finish()
    assert outside.read_bytes() == b"precious"
    assert not target.is_symlink() and target.is_file()


def test_append_text_refuses_symlinks_and_fifos(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("a\n")
    link = tmp_path / "link.txt"
    link.symlink_to(outside)
    assert append_text(link, "b\n") is False
    assert append_text(tmp_path / "missing.txt", "b\n") is False
    assert append_text(outside, "b\n") is True
    assert outside.read_text() == "a\nb\n"
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        assert append_text(fifo, "c\n") is False  # and it did not block


def test_checkpoints_are_fsynced_before_the_rename_and_the_folder_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        kind = "folder" if _is_dir_fd(fd) else "file"
        events.append(("fsync", kind))
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setenv("PERFORA_FSYNC", "1")
    ctl = controller(mlp())
    ctl.save(tmp_path / "c.safetensors")
    assert events == [("fsync", "file"), ("replace", "c.safetensors"), ("fsync", "folder")]
    events.clear()
    monkeypatch.setenv("PERFORA_FSYNC", "0")
    ctl.save(tmp_path / "c.safetensors")
    assert events == [("replace", "c.safetensors")]


def _is_dir_fd(fd: int) -> bool:
    import stat

    return stat.S_ISDIR(os.fstat(fd).st_mode)


def test_stale_temp_files_are_removed_when_a_controller_opens_the_folder(tmp_path: Path
                                                                         ) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"precious")
    stale = [".latest.safetensors.k2j4h1x9.tmp", ".metrics.csv.abc_1234.tmp",
             ".switch_3.safetensors.zz99zz99.tmp"]
    for name in stale:
        (folder / name).write_bytes(b"half a write")
    kept = [".notes.txt.abcd1234.tmp",  # not a file perfora writes
            "latest.safetensors.abcd1234.tmp",  # not perfora's pattern
            ".latest.safetensors.tmp", ".run.json.ABCDEFGH.tmp"]
    for name in kept:
        (folder / name).write_bytes(b"user file")
    (folder / ".run.json.abcdefgh.tmp").symlink_to(outside)  # a link: left alone
    (folder / ".best.safetensors.abcdefgh.tmp").mkdir()  # a folder: left alone
    kept += [".run.json.abcdefgh.tmp", ".best.safetensors.abcdefgh.tmp"]

    controller(mlp(), run_dir=folder, write_files=False)  # a rank that does not write
    assert all((folder / name).exists() for name in stale)
    ctl = controller(mlp(), run_dir=folder)
    assert sorted(ctl._writer.report.removed_temp_files) == sorted(stale)
    left = {p.name for p in folder.iterdir()}
    assert not left & set(stale)
    assert set(kept) <= left
    assert outside.read_bytes() == b"precious"
    assert remove_stale_temp_files(folder) == []


def test_only_rank_zero_removes_stale_temp_files(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".latest.safetensors.k2j4h1x9.tmp").write_bytes(b"half")
    monkeypatch.setattr(run_writer_module, "is_rank_zero", lambda: False)
    ctl = controller(mlp(), run_dir=folder)
    assert ctl._writer.report is None
    assert (folder / ".latest.safetensors.k2j4h1x9.tmp").exists()
    monkeypatch.setattr(run_writer_module, "is_rank_zero", lambda: True)
    controller(mlp(), run_dir=folder)
    assert not (folder / ".latest.safetensors.k2j4h1x9.tmp").exists()


def test_temp_pattern_matches_what_atomic_writes_create(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    seen: list[str] = []
    real = os.replace

    def replace(src: Any, dst: Any) -> None:
        seen.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    for name in ("latest.safetensors", "metrics.csv", "run.json", "history.png"):
        ckpt_module.atomic_write_bytes(tmp_path / name, b"x")
    assert len(seen) == 4
    for temp in seen:
        match = ckpt_module.TEMP_PATTERN.match(temp)
        assert match is not None and ckpt_module._is_run_file_name(match["name"]), temp
