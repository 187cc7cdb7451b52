"""perfora: grow PyTorch models during training by adding artificial dendrites.

Everything a user needs is importable from here; the parts behind it are built in floors
(docs/design.md). The framework adapters live in :mod:`perfora.integrations` (Lightning,
Hugging Face, Accelerate, Fabric; optional dependencies), the rank helpers in
:mod:`perfora.distributed`, and the PerforatedAI names in :mod:`perfora.compat`.
"""

from typing import TYPE_CHECKING, Any

from . import distributed
from ._version import __version__
from .checkpoint.adapter import load_dendrites, save_dendrites
from .checkpoint.model import load_model, save_model
from .config import PerforaConfig
from .distributed import RankMismatchError, set_epoch
from .errors import (
    CheckpointError,
    ConfigError,
    ConversionError,
    ExportError,
    OrderError,
    ParallelError,
    PerforaError,
    PerforationError,
    ScoreError,
    ShapeMismatchError,
)
from .growth import ControllerState, Decision, GrowthController
from .growth.candidates import GrowthPlan, plan_growth
from .growth.restart import mark_training_complete
from .growth.resume import resume
from .growth.saved_run import load_checkpoint
from .growth.scheduler_move import move_scheduler
from .growth.signal import ErrorSignalProbe
from .nn.consumers import LayerPlan, WideningPlan, plan_widening
from .nn.export import export
from .nn.layers import DendriticLayer, dendritic_layers, unwrap_model
from .nn.perforation import ConversionReport, describe, perforate
from .nn.widening import gradmax_init, widen
from .parallel import shard_fsdp2, wrap_ddp, wrap_deepspeed, wrap_fsdp1
from .rules import LearningRule, RuleStep, register_rule

if TYPE_CHECKING:  # pragma: no cover
    from .codemod import CodemodResult


def convert_source(source: str, mode: str = "native", **options: Any) -> "CodemodResult":
    """Edit a training script's text for perfora (native mode) or for the PerforatedAI recipe
    with perfora.compat (compat mode); see perfora.codemod (needs libcst).

    Returns a :class:`perfora.codemod.CodemodResult` (``output``, ``findings``, ``diff()``);
    imported lazily so that ``import perfora`` works without libcst.
    """
    from .codemod import convert_source as _convert

    return _convert(source, mode, **options)


__all__ = [
    "__version__",
    # wrap, describe, export
    "perforate", "describe", "ConversionReport", "DendriticLayer", "dendritic_layers",
    "unwrap_model", "export",
    # grow neurons (widen layers, function-preserving)
    "plan_widening", "widen", "gradmax_init", "WideningPlan", "LayerPlan",
    # grow
    "PerforaConfig", "GrowthController", "Decision", "ControllerState", "ErrorSignalProbe",
    "GrowthPlan", "plan_growth", "LearningRule", "RuleStep", "register_rule", "move_scheduler",
    # files
    "resume", "save_model", "load_model", "load_checkpoint", "save_dendrites",
    "load_dendrites", "mark_training_complete",
    # distributed
    "distributed", "RankMismatchError", "set_epoch", "wrap_ddp", "shard_fsdp2", "wrap_fsdp1",
    "wrap_deepspeed",
    # script conversion
    "convert_source",
    # errors
    "PerforaError", "ConfigError", "ScoreError", "OrderError", "ConversionError",
    "CheckpointError", "ShapeMismatchError", "PerforationError", "ParallelError",
    "ExportError",
]
