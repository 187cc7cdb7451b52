"""``wrap_deepspeed``'s checks and refusals, without processes (and without DeepSpeed: the
engine here is a stand-in with DeepSpeed's class name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import perfora
from perfora.errors import ConfigError, OrderError, ParallelError
from perfora.parallel import backend_of
from perfora.parallel.deepspeed import DeepSpeedBackend, DeepSpeedSpec
from perfora.parallel.deepspeed_config import (
    check_config,
    check_model,
    check_model_parameters,
    check_optimizer,
    check_scheduler,
    load_config,
    recipe,
    zero_stage,
)

ZERO3 = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 3}}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return perfora.perforate(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)))


class DeepSpeedEngine(nn.Module):
    """A stand-in with DeepSpeed's class name: ``module`` and ``optimizer`` like the engine."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.optimizer = torch.optim.SGD(module.parameters(), lr=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


def _engine(config: dict) -> DeepSpeedEngine:
    """A stand-in engine marked as built by wrap_deepspeed with ``config``."""
    engine = DeepSpeedEngine(_model())
    spec = DeepSpeedSpec(config, torch.optim.SGD, engine=engine)
    object.__setattr__(engine, "_perfora_wrapper_spec", spec)
    return engine


def test_config_from_dict_or_json_file(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZERO3))
    assert load_config(path) == ZERO3 and load_config(str(path)) == ZERO3
    copy = load_config(ZERO3)
    assert copy == ZERO3 and copy["zero_optimization"] is not ZERO3["zero_optimization"]
    assert zero_stage(ZERO3) == 3 and zero_stage({}) == 0
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="dict or a JSON"):
        load_config(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("zero", "match"), [
    ({"stage": 3, "offload_param": {"device": "cpu"}}, "offload"),
    ({"stage": 3, "offload_optimizer": {"device": "nvme"}}, "offload"),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "offload"),
    ({"stage": 3, "zero_hpz_partition_size": 2}, "hpZ"),
    ({"stage": 3, "mics_shard_size": 2}, "MiCS"),
    ({"stage": 3, "zero_quantized_weights": True}, "quantized"),
    ({"stage": 3, "zero_quantized_gradients": True}, "quantized"),
    ({"stage": 4}, "stages 0-3"),
])
def test_config_refusals(zero: dict, match: str) -> None:
    with pytest.raises(ParallelError, match=match):
        check_config({"zero_optimization": zero})


def test_config_accepted() -> None:
    for stage in range(4):
        check_config({"zero_optimization": {"stage": stage, "offload_param": {"device": "none"},
                                            "zero_hpz_partition_size": 1}})
    check_config({})


def test_optimizer_must_be_a_recipe() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    with pytest.raises(ParallelError, match="instance.*growth replaces the model's parameters"):
        check_optimizer(torch.optim.SGD(params, lr=0.1), ZERO3)
    with pytest.raises(ParallelError, match="needs an optimizer"):
        check_optimizer(None, ZERO3)
    with pytest.raises(ParallelError, match="not both"):
        check_optimizer(torch.optim.SGD, {**ZERO3, "optimizer": {"type": "SGD"}})
    with pytest.raises(ParallelError, match="class or a callable"):
        check_optimizer("sgd", ZERO3)
    check_optimizer(torch.optim.SGD, ZERO3)
    check_optimizer(None, {**ZERO3, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    opt = torch.optim.SGD(params, lr=0.1)
    with pytest.raises(ParallelError, match="scheduler instance"):
        check_scheduler(torch.optim.lr_scheduler.StepLR(opt, step_size=1))
    check_scheduler(torch.optim.lr_scheduler.StepLR)
    with pytest.raises(ParallelError, match="callable module -> parameters"):
        check_model_parameters(params)
    check_model_parameters(lambda m: m.parameters())


def test_recipe_binds_arguments() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    built = recipe(torch.optim.SGD, {"lr": 0.5})(params)  # type: ignore[misc]
    assert isinstance(built, torch.optim.SGD) and built.param_groups[0]["lr"] == 0.5
    assert recipe(torch.optim.SGD, None) is torch.optim.SGD and recipe(None, {"lr": 1}) is None


def test_wrap_refuses_before_importing_deepspeed() -> None:
    model = _model()
    with pytest.raises(ParallelError, match="instance"):
        perfora.wrap_deepspeed(model, ZERO3, optimizer=torch.optim.SGD(model.parameters(), lr=1))
    with pytest.raises(ParallelError, match="offload"):
        perfora.wrap_deepspeed(model, {"zero_optimization": {"stage": 3, "offload_param":
                                                             {"device": "cpu"}}},
                               optimizer=torch.optim.SGD)
    with pytest.raises(ParallelError, match="perforate"):
        perfora.wrap_deepspeed(nn.Linear(2, 2), ZERO3, optimizer=torch.optim.SGD)
    with pytest.raises(ParallelError, match="twice"):
        perfora.wrap_deepspeed(model, ZERO3, optimizer=torch.optim.SGD, config_params={})


def test_zero_init_models_and_engines_are_refused() -> None:
    model = _model()
    next(model.parameters()).ds_id = 0  # what deepspeed.zero.Init leaves on a parameter
    with pytest.raises(ParallelError, match=r"zero\.Init"):
        check_model(model)
    with pytest.raises(ParallelError, match=r"zero\.Init"):
        perfora.GrowthController(model, write_files=False)
    with pytest.raises(ParallelError, match="engine"):
        check_model(DeepSpeedEngine(_model()))


def test_engine_from_raw_initialize_is_refused() -> None:
    engine = DeepSpeedEngine(_model())
    with pytest.raises(ParallelError, match="wrap_deepspeed"):
        backend_of(engine)
    with pytest.raises(ParallelError, match="wrap_deepspeed"):
        perfora.GrowthController(engine)


def test_controller_takes_the_engines_optimizer() -> None:
    engine = _engine({"zero_optimization": {"stage": 2}})
    ctl = perfora.GrowthController(engine, write_files=False)
    assert isinstance(ctl.backend, DeepSpeedBackend) and not ctl.backend.sharded
    assert ctl.optimizer is engine.optimizer
    assert ctl.build_optimizer() == (engine.optimizer, None)
    with pytest.raises(OrderError, match="wrap_deepspeed"):
        ctl.set_optimizer(torch.optim.Adam, lr=1e-3)
    with pytest.raises(OrderError, match="wrap_deepspeed"):
        ctl.set_scheduler(torch.optim.lr_scheduler.StepLR, step_size=1)
    assert perfora.unwrap_model(engine) is engine.module


def test_dcp_and_rules_refused_under_zero3() -> None:
    with pytest.raises(ParallelError, match="dcp"):
        perfora.GrowthController(_engine(ZERO3), checkpoint_format="dcp", write_files=False)
    with pytest.raises(ParallelError, match="dcp"):
        perfora.GrowthController(_engine({}), checkpoint_format="dcp", write_files=False)
    with pytest.raises(ParallelError, match="rule='gd'"):
        perfora.GrowthController(_engine(ZERO3), rule="correlation", write_files=False)
    ctl = perfora.GrowthController(_engine(ZERO3), write_files=False)
    assert ctl.backend.sharded


def test_lightning_zero3_points_to_wrap_deepspeed() -> None:
    pytest.importorskip("deepspeed")
    strategies = pytest.importorskip("lightning.pytorch.strategies")
    from perfora.errors import PerforaError
    from perfora.integrations.lightning import DendriteGrowth

    with pytest.raises(PerforaError, match="wrap_deepspeed"):
        DendriteGrowth()._check_strategy(strategies.DeepSpeedStrategy(stage=3))
    DendriteGrowth()._check_strategy(strategies.DeepSpeedStrategy(stage=2))
