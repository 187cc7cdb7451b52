"""Growth in a Lightning Fabric loop: set the grown model and its new optimizer up again.

Fabric wraps the model once (``fabric.setup``), for example in DistributedDataParallel, whose
gradient buckets cover the parameters that existed then. After a restructure the dendrites
are new parameters, so the model and the optimizer perfora rebuilt are set up again::

    model = perfora.perforate(build())
    ctl = perfora.GrowthController(model, ...)
    ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    fabric_model, optimizer = fabric.setup(model, ctl.build_optimizer()[0])
    ...
    decision = ctl.step(val_score)
    if decision.restructured:
        fabric_model, optimizer = setup_after_growth(fabric, decision)

The controller is given the perforated module itself (not Fabric's wrapper); every rank
calls ``step`` and the scores are averaged over ranks, so every rank grows the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import OrderError
from ..growth.state import Decision
from ..nn.layers import unwrap_model


def setup_after_growth(fabric: Any, decision: Decision) -> tuple[Any, torch.optim.Optimizer]:
    """``fabric.setup`` of the grown model and the optimizer perfora rebuilt for it."""
    if decision.optimizer is None:
        raise OrderError("the decision holds no optimizer: register one with "
                         "controller.set_optimizer(cls, **kwargs) so perfora can rebuild it "
                         "over the new dendrites")
    return fabric.setup(unwrap_model(decision.model), decision.optimizer)
