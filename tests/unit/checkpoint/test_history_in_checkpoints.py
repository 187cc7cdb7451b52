"""A checkpoint keeps only what a resume needs: its JSON does not grow with the epochs, the
full history lives in metrics.csv and is read back from there on resume.

Real models, real files; a resumed run must equal the uninterrupted one, metrics.csv
included (except the wall-clock ``seconds`` column).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import torch
from torch import nn

import perfora
from perfora.checkpoint.format import Checkpoint, load_checkpoint, save_checkpoint

CONFIG = {"maximize": False, "switch_mode": "fixed", "fixed_switch_num": 4,
          "max_dendrites": 2, "retain_all_dendrites": True}


def _build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _epoch(model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> float:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 6, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(100 + epoch))
    for idx in order.split(16):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    with torch.no_grad():
        return nn.functional.cross_entropy(model(x), y).item()


def _start(run_dir: Path, **settings) -> perfora.GrowthController:
    ctl = perfora.GrowthController(perfora.perforate(_build()), run_dir=run_dir,
                                   **{**CONFIG, **settings})
    ctl.set_optimizer(torch.optim.Adam, lr=1e-2)
    ctl.build_optimizer()
    return ctl


def _train(ctl: perfora.GrowthController, until: int, extra: bool = False) -> list[str]:
    events = []
    while ctl.epoch < until and not ctl.completed:
        score = _epoch(ctl.model, ctl.optimizer, ctl.epoch)
        decision = ctl.step(score, extra={"half": score / 2} if extra else None)
        events.append(decision.action)
    return events


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    """metrics.csv without the wall-clock column (header order kept in each row)."""
    with open(run_dir / "metrics.csv", newline="") as handle:
        return [{k: v for k, v in row.items() if k != "seconds"}
                for row in csv.DictReader(handle)]


def _meta_size(path: Path) -> int:
    return len(json.dumps(load_checkpoint(path).meta))


def _no_seconds(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_checkpoint_json_does_not_grow_with_the_epochs(tmp_path: Path) -> None:
    ctl = _start(tmp_path / "run", fixed_switch_num=1000)
    _train(ctl, 5)
    ctl.save(tmp_path / "at5.safetensors")
    _train(ctl, 60)
    ctl.save(tmp_path / "at60.safetensors")
    early = _meta_size(tmp_path / "at5.safetensors")
    late = _meta_size(tmp_path / "at60.safetensors")
    # the same structure and state, only the numbers in it differ (a full history would add
    # ~55 rows of ~250 characters)
    assert abs(late - early) < 300, (early, late)
    assert len(load_checkpoint(tmp_path / "at60.safetensors").meta["controller"]["history"]) == 1
    assert len(_metrics(tmp_path / "run")) == 60


def test_resumed_run_equals_uninterrupted_including_metrics_csv(tmp_path: Path) -> None:
    full = _start(tmp_path / "full")
    full_events = _train(full, 14, extra=True)

    part = _start(tmp_path / "part")
    events = _train(part, 7, extra=True)
    part.save(tmp_path / "part" / "at7.safetensors")
    _train(part, 10, extra=True)  # these epochs are lost: the run "dies" after epoch 10
    assert len(_metrics(tmp_path / "part")) == 10

    resumed = perfora.resume(_build(), tmp_path / "part" / "at7.safetensors",
                             optimizer=torch.optim.Adam, optimizer_args={"lr": 1e-2})
    assert len(_metrics(tmp_path / "part")) == 7  # cut back to the checkpoint's epoch
    events += _train(resumed, 14, extra=True)

    assert events == full_events and "restructure" in events
    assert resumed.state.switch_epochs == full.state.switch_epochs
    for (name, a), (_, b) in zip(full.model.state_dict().items(),
                                 resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert _metrics(tmp_path / "part") == _metrics(tmp_path / "full")
    assert _no_seconds(resumed.state.history) == _no_seconds(full.state.history)


def test_checkpoint_of_an_older_version_with_the_full_history_still_loads(tmp_path: Path
                                                                          ) -> None:
    ctl = _start(tmp_path / "run")
    _train(ctl, 6)
    ctl.save(tmp_path / "new.safetensors")
    ckpt = load_checkpoint(tmp_path / "new.safetensors")
    assert len(ckpt.meta["controller"]["history"]) == 1
    meta = json.loads(json.dumps(ckpt.meta))
    meta["controller"]["history"] = json.loads(json.dumps(ctl.state.history))  # every row
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    save_checkpoint(old_dir / "latest.safetensors", Checkpoint(tensors=ckpt.tensors, meta=meta))

    # no metrics.csv next to it: the history comes from the file itself
    resumed = perfora.resume(_build(), old_dir / "latest.safetensors",
                             optimizer=torch.optim.Adam, optimizer_args={"lr": 1e-2})
    assert resumed.epoch == 6 and len(resumed.state.history) == 6
    assert _metrics(old_dir) == _metrics(tmp_path / "run")
    _train(resumed, 8)
    assert [int(r["epoch"]) for r in _metrics(old_dir)] == list(range(1, 9))


def test_metrics_csv_of_another_run_is_not_taken_as_the_history(tmp_path: Path) -> None:
    ctl = _start(tmp_path / "run")
    _train(ctl, 6)
    ctl.save(tmp_path / "run" / "at6.safetensors")
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "run", other)
    rows = _metrics(other)
    with open(other / "metrics.csv", "w", newline="") as handle:  # another run's scores
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**r, "val_score": "0.5"} for r in rows)
    resumed = perfora.resume(_build(), other / "at6.safetensors",
                             optimizer=torch.optim.Adam, optimizer_args={"lr": 1e-2})
    assert [r["epoch"] for r in resumed.state.history] == [6]
    assert [r["epoch"] for r in _metrics(other)] == ["6"]
