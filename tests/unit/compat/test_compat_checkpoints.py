"""The tracker's checkpoints follow ``checkpoint_time_budget`` like the native controller:
``latest.pt`` is not written every epoch, restructures always are, and a run resumed from
a checkpoint equals the uninterrupted one (metrics.csv included).
"""

from __future__ import annotations

import csv
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from torch import nn

from perfora.checkpoint.format import load_checkpoint
from perfora.compat import globals_perforatedai as GPA
from perfora.compat import utils_perforatedai as UPA


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings()
    yield
    GPA.reset()


def settings() -> None:
    """Defaults, a dendrite set every 4 epochs, at most 2."""
    GPA.reset()
    GPA.pc.set_testing_dendrite_capacity(False)
    GPA.pc.set_switch_mode(GPA.pc.DOING_FIXED_SWITCH)
    GPA.pc.set_fixed_switch_num(4)
    GPA.pc.set_max_dendrites(2)
    GPA.pc.set_retain_all_dendrites(True)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def perforated(save_name: str) -> nn.Module:
    model = UPA.perforate_model(build(), save_name=save_name, maximizing_score=True)
    GPA.pai_tracker.set_optimizer(torch.optim.SGD)
    return model


def one_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> float:
    """Train on a fixed batch order of this epoch; the score is the accuracy."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(48, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    order = torch.randperm(48, generator=torch.Generator().manual_seed(epoch))
    for idx in order.split(12):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def pai_loop(model: nn.Module, start: int, until: int) -> tuple[nn.Module, list[bool]]:
    """PerforatedAI's loop: extra and test scores, then add_validation_score, for epochs
    start+1..until; returns the model and which epochs restructured."""
    optimizer, _ = GPA.pai_tracker.setup_optimizer(model, {"lr": 0.1})
    changed = []
    for epoch in range(start + 1, until + 1):
        score = one_epoch(model, optimizer, epoch)
        GPA.pai_tracker.add_extra_score(score * 100, "train_acc")
        GPA.pai_tracker.add_test_score(score / 2, "test_acc")
        model, restructured, complete = GPA.pai_tracker.add_validation_score(score, model)
        changed.append(restructured)
        if restructured:
            optimizer, _ = GPA.pai_tracker.setup_optimizer(model, {"lr": 0.1})
        assert not complete
    return model, changed


def metrics(folder: Path) -> list[dict[str, str]]:
    with open(folder / "metrics.csv", newline="") as handle:
        return [{k: v for k, v in row.items() if k != "seconds"}
                for row in csv.DictReader(handle)]


def saved_epoch(path: Path) -> int:
    return load_checkpoint(path).meta["controller"]["epoch"]


def test_latest_follows_the_time_budget_but_restructures_always_write(tmp_path: Path) -> None:
    assert GPA.pc.to_config().checkpoint_time_budget == 0.05  # the native default
    model = UPA.perforate_model(build(), save_name="RUN", maximizing_score=True)
    latest = tmp_path / "RUN" / "latest.pt"
    written = []
    for epoch in range(1, 12):  # no training: epochs far shorter than a checkpoint write
        model, restructured, _ = GPA.pai_tracker.add_validation_score(0.5, model)
        if saved_epoch(latest) == epoch:
            written.append(epoch)
        if restructured:
            assert epoch in written  # a restructure writes latest.pt and switch_N.pt at once
            assert saved_epoch(tmp_path / "RUN" / f"switch_{epoch // 4}.pt") == epoch
    assert GPA.pai_tracker.controller.state.switch_epochs == [4, 8]
    plain = [e for e in written if e not in (4, 8)]
    assert len(plain) <= 4, written  # of 9 plain epochs; the first one always writes
    assert len(metrics(tmp_path / "RUN")) == 11  # metrics.csv still gets every epoch


def test_resumed_pai_loop_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    full, full_changed = pai_loop(perforated("FULL"), 0, 11)
    full_state = {k: v.clone() for k, v in full.state_dict().items()}

    settings()
    part, changed = pai_loop(perforated("PART"), 0, 6)
    UPA.save_system(part, "PART", "at6")
    pai_loop(part, 6, 8)  # lost: the run dies after epoch 8
    assert len(metrics(tmp_path / "PART")) == 8

    settings()
    model = perforated("PART")
    model = UPA.load_system(model, "PART", "at6", True)
    assert len(metrics(tmp_path / "PART")) == 6
    model, more = pai_loop(model, 6, 11)
    assert changed + more == full_changed and any(full_changed)
    for name, value in model.state_dict().items():
        assert torch.equal(value, full_state[name]), name
    assert metrics(tmp_path / "PART") == metrics(tmp_path / "FULL")


def test_a_new_run_in_a_save_name_holding_another_runs_pt_files_warns(tmp_path: Path) -> None:
    model = perforated("RUN")
    pai_loop(model, 0, 9)  # writes switch_1.pt, switch_2.pt, best_model.pt, latest.pt
    assert (tmp_path / "RUN" / "switch_2.pt").is_file()
    settings()
    again = perforated("RUN")
    with pytest.warns(UserWarning, match=r"already holds another run's files "
                                         r"\(best_model\.pt, latest\.pt, switch_1\.pt, "
                                         r"switch_2\.pt\).*the newest switch_N.*save_name.*"
                                         r"UPA\.load_system\(model, save_name, 'latest', "
                                         r"True\)") as record:
        pai_loop(again, 0, 1)
    assert not any("controller.load" in str(w.message) for w in record)  # a native name


def test_the_controllers_advice_comes_in_the_perforatedai_names() -> None:
    model = UPA.perforate_model(build(), save_name="RUN", maximizing_score=True)
    model(torch.randn(4, 4)).sum().backward()  # an epoch trained, with no optimizer set up
    with pytest.warns(UserWarning) as record:
        model, _, _ = GPA.pai_tracker.add_validation_score(0.5, model)
    text = " ".join(str(w.message) for w in record)
    assert "add_validation_score with no optimizer registered" in text
    assert "GPA.pai_tracker.setup_optimizer(model, {'lr': ...})" in text
    assert "controller.set_optimizer" not in text and record[0].filename == __file__

    settings()
    model = perforated("STALE")
    optimizer, _ = GPA.pai_tracker.setup_optimizer(model, {"lr": 0.1})
    for epoch in range(1, 6):  # keeps the first optimizer after the restructure at epoch 4
        with pytest.warns() if epoch == 5 else nullcontext() as caught:
            model, _, _ = GPA.pai_tracker.add_validation_score(
                one_epoch(model, optimizer, epoch), model)
    stale = " ".join(str(w.message) for w in caught)
    assert "call GPA.pai_tracker.setup_optimizer(model, optimArgs, schedArgs) again" in stale
    assert "decision." not in stale


def test_the_replaced_wrapper_error_reads_in_the_perforatedai_names() -> None:
    from perfora.compat.messages import in_compat_terms

    native = ("step() got a DistributedDataParallel wrapper (or DeepSpeed engine) that "
              "perfora replaced ... use decision.model and decision.optimizer")
    assert in_compat_terms(native) == (
        "add_validation_score got a DistributedDataParallel wrapper (or DeepSpeed engine) "
        "that perfora replaced ... use the model add_validation_score returned and call "
        "GPA.pai_tracker.setup_optimizer again")
