"""The correlation rule under DistributedDataParallel: 2 real CPU ranks (gloo, FileStore).

Each rank trains on its own data; the correlation statistics are summed over ranks, so both
ranks see the same scores and end the dendrite phase at the same epoch, and DDP keeps the
candidates identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_ddp import batch, make_model, max_rank_diff, run_ranks
from torch import nn

import perfora
from perfora.parallel import wrap_ddp


def _correlation_worker(rank: int, tmp: Path) -> dict:
    model = make_model(0)
    ddp = wrap_ddp(model)
    ctl = perfora.GrowthController(ddp, rule="correlation", switch_mode="fixed",
                                   fixed_switch_num=2, max_dendrites=2, retain_all_dendrites=True,
                                   correlation_patience=2, correlation_max_epochs_ratio=3.0,
                                   write_files=False)
    ctl.set_optimizer(torch.optim.Adam, lr=0.02)
    opt, _ = ctl.build_optimizer()
    events, corr = [], []
    for epoch in range(14):
        ddp.train()
        for step in range(3):
            x, y = batch(rank, epoch, step)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        decision = ctl.step(1.0 / (epoch + 1) + 0.01 * rank, model=ddp)
        events.append([decision.action, decision.phase])
        corr.append(ctl.state.history[-1].get("rule/corr"))
        if decision.restructured:
            ddp, opt = decision.model, decision.optimizer
        if decision.complete:
            break
    return {"events": events, "corr": corr, "diff": max_rank_diff(ddp),
            "state": {k: v.tolist() for k, v in perfora.unwrap_model(ddp).state_dict().items()}}


@pytest.mark.timeout(180)
def test_rule_decisions_and_parameters_are_identical_across_ranks(tmp_path):
    r0, r1 = run_ranks(_correlation_worker, tmp_path)
    assert r0["events"] == r1["events"]
    phases = [phase for _, phase in r0["events"]]
    assert "dendrite" in phases and any(a == "phase_change" for a, _ in r0["events"])
    scored = [c for c in r0["corr"] if c is not None]
    assert scored and r0["corr"] == r1["corr"], "scores come from statistics summed over ranks"
    assert r0["diff"] == 0.0
    assert r0["state"] == r1["state"]
