"""Recognizing FSDP wrappers without importing FSDP in processes that never loaded it."""

from __future__ import annotations

import sys

import pytest
import torch.distributed.fsdp
from torch import nn

from perfora.parallel.sharded_state import fsdp_classes, is_fsdp1, is_fsdp2


class FakeFSDPModule(nn.Module):
    """Stands for FSDP2's class, to show the check uses the loaded module's classes."""


def test_nothing_is_fsdp_and_nothing_is_imported_when_fsdp_was_never_loaded(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch.distributed.fsdp")
    model = nn.Sequential(nn.Linear(2, 2))
    assert fsdp_classes() == ()
    assert not is_fsdp2(model) and not is_fsdp1(model)
    assert "torch.distributed.fsdp" not in sys.modules  # the checks did not import it


def test_the_loaded_classes_are_the_ones_checked(monkeypatch):
    assert fsdp_classes() == (torch.distributed.fsdp.FSDPModule,
                              torch.distributed.fsdp.FullyShardedDataParallel)
    monkeypatch.setattr(torch.distributed.fsdp, "FSDPModule", FakeFSDPModule)
    assert is_fsdp2(nn.Sequential(FakeFSDPModule()))
    assert not is_fsdp2(nn.Sequential(nn.Linear(2, 2)))


@pytest.mark.parametrize("name", ["FSDPModule", "FullyShardedDataParallel"])
def test_a_torch_without_one_of_the_classes_checks_the_other(monkeypatch, name):
    monkeypatch.delattr(torch.distributed.fsdp, name)
    assert len(fsdp_classes()) == 1
