"""What each parallel backend declares it can do: the controller reads these, never the kind."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import perfora
from perfora.parallel import (
    DataParallelBackend,
    DeepSpeedBackend,
    DeepSpeedSpec,
    FSDP1Backend,
    FSDP1Spec,
    FSDP2Backend,
    FSDP2Spec,
    NoWrapperBackend,
    ParallelBackend,
    backend_of,
)

CAPABILITIES = ("sharded", "replaces_wrappers", "owns_optimizer", "auto_dcp")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


def _capabilities(backend: ParallelBackend) -> dict[str, bool]:
    return {name: getattr(backend, name) for name in CAPABILITIES}


def test_replicated_backends_keep_the_defaults() -> None:
    bare, dp = backend_of(_model()), backend_of(nn.DataParallel(_model()))
    assert isinstance(bare, NoWrapperBackend) and isinstance(dp, DataParallelBackend)
    for backend in (bare, dp):
        assert _capabilities(backend) == dict.fromkeys(CAPABILITIES, False)
        assert backend.template is None and backend.engine_optimizer(_model()) is None


@pytest.mark.parametrize("spec_class, backend_class", [(FSDP1Spec, FSDP1Backend),
                                                      (FSDP2Spec, FSDP2Backend)])
def test_fsdp_backends_are_sharded_and_write_dcp_by_default(spec_class, backend_class) -> None:
    spec = spec_class({})
    backend = backend_class(spec)
    assert _capabilities(backend) == {"sharded": True, "replaces_wrappers": False,
                                      "owns_optimizer": False, "auto_dcp": True}
    assert backend.template is None
    spec.template = template = _model()
    assert backend.template is template  # the copy kept for re-sharding, read by loads


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_deepspeed_owns_the_optimizer_and_never_picks_dcp(stage: int) -> None:
    backend = DeepSpeedBackend(DeepSpeedSpec({"zero_optimization": {"stage": stage}}))
    assert _capabilities(backend) == {"sharded": stage == 3, "replaces_wrappers": True,
                                      "owns_optimizer": True, "auto_dcp": False}


def test_a_backend_must_implement_every_operation() -> None:
    class Partial(ParallelBackend):
        name = "partial"

        def full_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
            return {}

    with pytest.raises(TypeError, match="abstract"):
        Partial()  # type: ignore[abstract]
