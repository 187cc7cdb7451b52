"""Run files get the permissions a plain ``open`` would give them, not the temp file's 0600:
a team reading a shared run folder must be able to open the checkpoints."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from perfora.checkpoint.files import atomic_write_bytes

pytestmark = pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX permissions only")


@pytest.fixture
def umask() -> Iterator[None]:
    """Restore the process umask a test sets."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_a_new_file_follows_the_umask(tmp_path: Path, umask: None, mask: int,
                                      expected: int) -> None:
    os.umask(mask)
    atomic_write_bytes(tmp_path / "metrics.csv", b"epoch\n")
    assert _mode(tmp_path / "metrics.csv") == expected


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path, umask: None) -> None:
    os.umask(0o022)
    target = tmp_path / "latest.safetensors"
    target.write_bytes(b"old")
    target.chmod(0o640)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and _mode(target) == 0o640


def test_a_controllers_checkpoint_and_metrics_are_readable_by_the_group(tmp_path: Path,
                                                                        umask: None) -> None:
    os.umask(0o022)
    torch.manual_seed(0)
    model = perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)))
    controller = perfora.GrowthController(model, run_dir=tmp_path, maximize=False)
    controller.set_optimizer(torch.optim.SGD, lr=0.1)
    controller.build_optimizer()
    controller.step(1.0)
    path = controller.save("latest")
    for written in (path, tmp_path / "metrics.csv"):
        assert _mode(written) == 0o644, written
