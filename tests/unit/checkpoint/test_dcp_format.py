"""checkpoint_format in one process: what a run writes, and DCP folders saved and loaded here.

(Distributed writes and resumes on other world sizes: tests/integration/parallel/test_dcp.py.)
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from perfora.checkpoint.dcp import META_FILE
from perfora.errors import CheckpointError, ConfigError
from perfora.growth.checkpointer import checkpointer_for, resolve_format
from perfora.growth.restart import newest_switch
from perfora.parallel import backend_of

SETTINGS = {"switch_mode": "fixed", "fixed_switch_num": 1, "max_dendrites": 3,
            "dendrite_init": "default", "checkpoint_time_budget": None}


def _model(seed: int = 0, hidden: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 3))


def _epoch(model: nn.Module, opt: torch.optim.Optimizer, epoch: int) -> None:
    g = torch.Generator().manual_seed(epoch)
    for _ in range(2):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _grown(run_dir: Path | None = None, **settings) -> perfora.GrowthController:
    """A run grown twice, then trained one more epoch (Adam has moments)."""
    ctl = perfora.GrowthController(perfora.perforate(_model()), run_dir=run_dir,
                                   **{**SETTINGS, **settings})
    ctl.set_optimizer(torch.optim.Adam, lr=0.01)
    ctl.build_optimizer()
    for epoch in range(2):
        _epoch(ctl.model, ctl.optimizer, epoch)
        ctl.step(0.5 + epoch)
    _epoch(ctl.model, ctl.optimizer, 2)
    return ctl


def test_the_setting_is_checked():
    assert perfora.PerforaConfig().checkpoint_format == "auto"
    with pytest.raises(ConfigError, match="checkpoint_format"):
        perfora.PerforaConfig(checkpoint_format="dcpp")


def test_one_process_writes_files_whatever_the_setting(tmp_path):
    backend = backend_of(perfora.perforate(_model()))
    for setting in ("auto", "file", "dcp"):
        assert resolve_format(setting, backend) == "file"
    assert checkpointer_for(tmp_path / "x.dcp", "file", backend).format == "dcp"
    assert checkpointer_for(tmp_path / "x.safetensors", "dcp", backend).format == "file"
    assert checkpointer_for(tmp_path / "x.dcp").format == "dcp"  # reading: the name says it
    with pytest.warns(UserWarning, match="checkpoint_format='dcp'") as caught:
        ctl = _grown(tmp_path / "run", checkpoint_format="dcp")
        ctl.step(0.1)
    assert len([w for w in caught if "checkpoint_format" in str(w.message)]) == 1  # once
    names = {p.name for p in (tmp_path / "run").iterdir()}
    assert {"latest.safetensors", "switch_2.safetensors"} <= names
    assert not [n for n in names if n.endswith(".dcp")]
    assert ctl.checkpoint_path("latest").suffix == ".safetensors"


def test_a_dcp_save_in_one_process_resumes_exactly(tmp_path):
    ctl = _grown()
    ctl.save(tmp_path / "mid.dcp")
    assert sorted(os.listdir(tmp_path / "mid.dcp")) == [".metadata", "__0_0.distcp", META_FILE]
    saved = {k: v.clone() for k, v in ctl.model.state_dict().items()}
    moments = {k: {n: t.clone() for n, t in e.items()}
               for k, e in ctl.optimizer.state_dict()["state"].items()}
    _epoch(ctl.model, ctl.optimizer, 3)
    # an unconverted model of other weights: perfora wraps and grows it, then loads
    resumed = perfora.resume(_model(seed=9), tmp_path / "mid.dcp", optimizer=torch.optim.Adam,
                             optimizer_args={"lr": 0.01})
    assert resumed.num_dendrites == 2 and resumed.epoch == 2
    assert resumed.state.switch_epochs == ctl.state.switch_epochs
    assert all(torch.equal(saved[k], v) for k, v in resumed.model.state_dict().items())
    loaded = resumed.optimizer.state_dict()["state"]
    assert all(torch.equal(moments[i][n], loaded[i][n]) for i in moments for n in moments[i])
    _epoch(resumed.model, resumed.optimizer, 3)
    assert all(torch.equal(ctl.model.state_dict()[k], v)
               for k, v in resumed.model.state_dict().items())


def test_names_find_the_newest_of_file_and_folder(tmp_path):
    run = tmp_path / "run"
    ctl = _grown(run)
    ctl.save(run / "switch_7.dcp")
    assert newest_switch(run) == 7
    ctl.save(run / "latest.dcp")  # newer than latest.safetensors
    other = perfora.GrowthController(perfora.perforate(_model(seed=4)), run_dir=run,
                                     write_files=False)
    assert other.find_checkpoint("latest") == run / "latest.dcp"
    assert other.load("latest").epoch == 2 and other.num_dendrites == 2
    os.utime(run / "latest.safetensors")  # now the file is the newer one
    assert other.find_checkpoint("latest") == run / "latest.safetensors"


def test_a_folder_that_does_not_fit_raises_before_the_model_changes(tmp_path):
    _grown().save(tmp_path / "mid.dcp")
    ctl = perfora.GrowthController(perfora.perforate(_model(hidden=5)), write_files=False)
    before = {k: v.clone() for k, v in ctl.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="5 neurons here but 8"):
        ctl.load(tmp_path / "mid.dcp")
    ctl.set_optimizer(torch.optim.SGD, lr=0.1)
    with pytest.raises(CheckpointError, match="Adam"):
        ctl.load(tmp_path / "mid.dcp")
    after = ctl.model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(v, after[k]) for k, v in before.items())
    with pytest.raises(CheckpointError, match="no DCP checkpoint"), warnings.catch_warnings():
        ctl.load(tmp_path / "missing.dcp")
