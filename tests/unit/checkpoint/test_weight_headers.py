"""Small files read with care (no symlink, no FIFO, capped by the bytes read), and the keys
and shapes of a framework's weight files read from their headers only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from perfora import CheckpointError
from perfora.checkpoint.dcp import DCP_FORMAT, META_FILE, read_dcp
from perfora.checkpoint.files import read_regular_file
from perfora.checkpoint.weight_files import folder_shapes, safetensors_shapes

STATE = {"a.weight": torch.zeros(3, 4), "b.bias": torch.ones(5)}
SHAPES = {"a.weight": (3, 4), "b.bias": (5,)}


def test_a_regular_file_is_read_whole_up_to_its_cap(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_bytes(b"x" * 10)
    assert read_regular_file(file, 10) == b"x" * 10
    with pytest.raises(CheckpointError, match="larger than the 9 bytes"):
        read_regular_file(file, 9)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["symlink_dev_zero", "dev_zero", "fifo", "folder"])
def test_endless_or_blocking_files_are_refused_at_once(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f"
    if kind == "symlink_dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "dev_zero":
        path = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)  # nobody writes to it: a blocking read would wait for ever
    else:
        path.mkdir()
    with pytest.raises(CheckpointError, match="regular file"):
        read_regular_file(path, 1 << 20)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", [META_FILE, ".metadata"])
def test_a_dcp_folder_with_a_symlink_to_dev_zero_is_refused(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "x.dcp"
    folder.mkdir()
    (folder / META_FILE).write_text(json.dumps({"format": DCP_FORMAT, "format_version": 1}))
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="regular file"):
        read_dcp(folder)


def test_safetensors_shapes_come_from_the_header(tmp_path: Path) -> None:
    save_file(STATE, tmp_path / "model.safetensors")
    assert safetensors_shapes(tmp_path / "model.safetensors") == SHAPES
    assert folder_shapes(tmp_path, "model.safetensors", "model.safetensors.index.json") \
        == SHAPES
    (tmp_path / "cut.safetensors").write_bytes(
        (tmp_path / "model.safetensors").read_bytes()[:40])
    with pytest.raises(CheckpointError, match="truncated"):
        safetensors_shapes(tmp_path / "cut.safetensors")


def test_sharded_and_pickled_weights(tmp_path: Path) -> None:
    save_file({"a.weight": STATE["a.weight"]}, tmp_path / "s1.safetensors")
    save_file({"b.bias": STATE["b.bias"]}, tmp_path / "s2.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors",
                                                "b.bias": "s2.safetensors"}}))
    assert folder_shapes(tmp_path, "model.safetensors", index.name) == SHAPES
    index.write_text(json.dumps({"weight_map": {"a.weight": "../s1.safetensors"}}))
    with pytest.raises(CheckpointError, match="outside its folder"):
        folder_shapes(tmp_path, "model.safetensors", index.name)
    torch.save(STATE, tmp_path / "pytorch_model.bin")
    assert folder_shapes(tmp_path, "pytorch_model.bin", "pytorch_model.bin.index.json") \
        == SHAPES
    assert folder_shapes(tmp_path / "none", "model.safetensors", "x.json") is None
